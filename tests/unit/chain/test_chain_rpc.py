"""Retries on transient RPC faults, and what an unreachable node looks like to callers."""

from __future__ import annotations

import time

import pytest
import requests

from krill.chain.anvil import free_port
from krill.chain.client import KrillChain
from krill.chain.rpc import RetryPolicy, connect_http, dev_account, with_retries
from krill.errors import ChainUnavailableError

FAST = RetryPolicy(attempts=3, initial_delay_s=0.01, max_delay_s=0.02)


def test_transient_faults_are_retried_then_succeed():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise requests.ConnectionError("connection refused")
        return "ok"

    assert with_retries(flaky, "eth_blockNumber", FAST) == "ok"
    assert len(calls) == 3


def test_exhausted_retries_raise_chain_unavailable():
    calls = []

    def down():
        calls.append(1)
        raise requests.Timeout("timed out")

    with pytest.raises(ChainUnavailableError, match="eth_call: the chain RPC at http://x did not answer after 3"):
        with_retries(down, "eth_call", FAST, "http://x")
    assert len(calls) == 3


def test_answers_are_not_retried():
    calls = []

    def wrong():
        calls.append(1)
        raise ValueError("execution reverted")

    with pytest.raises(ValueError):
        with_retries(wrong, "eth_call", FAST)
    assert len(calls) == 1


def test_http_5xx_is_transient_but_4xx_is_not():
    def http_error(status):
        response = requests.Response()
        response.status_code = status
        return requests.HTTPError(response=response)

    for status, expected in ((503, 3), (429, 3), (400, 1)):
        calls = []

        def fail(status=status, calls=calls):
            calls.append(1)
            raise http_error(status)

        with pytest.raises((ChainUnavailableError, requests.HTTPError)):
            with_retries(fail, "x", FAST)
        assert len(calls) == expected, status


def test_unreachable_node_raises_chain_unavailable_quickly():
    url = f"http://127.0.0.1:{free_port()}"
    chain = KrillChain(connect_http(url, timeout_s=1), "0x" + "00" * 20, dev_account(0), retry=FAST)
    started = time.monotonic()
    with pytest.raises(ChainUnavailableError, match=url):
        chain.block_number()
    with pytest.raises(ChainUnavailableError):
        chain.commit_count()
    assert time.monotonic() - started < 10
