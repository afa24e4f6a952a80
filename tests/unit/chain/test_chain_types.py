"""Typed contract values: conversion from web3 results and input checks that name the field."""

from __future__ import annotations

import dataclasses

import pytest

from krill.chain.artifacts import load_artifact
from krill.chain.errors import ChainInputError
from krill.chain.events import EVENT_CLASSES, ChainEvent, field_name
from krill.chain.types import RunInfo, RunParams, from_abi, to_bytes32, to_uint

PARAMS = RunParams("0x" + "ab" * 20, 2, 2, 5_000, 2_000, 500_000, 10, 10**21)


def test_to_bytes32_accepts_bytes_and_hex_and_names_the_field():
    assert to_bytes32(b"\x01" * 32, "x") == b"\x01" * 32
    assert to_bytes32("0x" + "02" * 32, "x") == b"\x02" * 32
    with pytest.raises(ChainInputError, match="header_digest"):
        to_bytes32(b"\x01" * 31, "header_digest")
    with pytest.raises(ChainInputError, match="run_id: not hex"):
        to_bytes32("0xzz", "run_id")


def test_to_uint_checks_range():
    assert to_uint(5, "n", 8) == 5
    for bad in (-1, 256, True, 1.0):
        with pytest.raises(ChainInputError, match="n:"):
            to_uint(bad, "n", 8)


def test_run_params_to_abi_checks_each_field():
    assert PARAMS.to_abi()[3] == 5_000
    with pytest.raises(ChainInputError, match="slash_fraction_bps"):
        dataclasses.replace(PARAMS, slash_fraction_bps=70_000).to_abi()


def test_from_abi_converts_nested_structs_from_tuples_and_mappings():
    raw = (True, PARAMS.to_abi(), 3, 7, 9)
    assert from_abi(RunInfo, raw) == RunInfo(True, PARAMS, 3, 7, 9)
    named = {"exists": True, "params": dict(zip(("coordinator", "maxStaleness", "attestationQuorum",
                                                "slashFractionBps", "verifierBountyBps", "checkProbabilityPpm",
                                                "challengeWindowBlocks", "rewardPerVersion"), PARAMS.to_abi(),
                                               strict=True)),
             "latestVersion": 3, "rewardPool": 7, "createdBlock": 9}
    assert from_abi(RunInfo, named) == RunInfo(True, PARAMS, 3, 7, 9)


@pytest.mark.parametrize("entry", [e for n in ("KrillProtocol", "KrillToken") for e in load_artifact(n).events()],
                         ids=lambda e: e["name"])
def test_every_abi_event_has_a_dataclass_with_its_fields(entry):
    cls = EVENT_CLASSES[entry["name"]]
    base = {f.name for f in dataclasses.fields(ChainEvent)}
    fields = [f.name for f in dataclasses.fields(cls) if f.name not in base]
    assert fields == [field_name(i["name"]) for i in entry["inputs"]]
