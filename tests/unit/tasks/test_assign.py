"""Prompt assignment: deterministic, and every input changes the batch."""

from __future__ import annotations

import hashlib

import pytest

from krill.rl.assign import DOMAIN, AssignmentError, assign_prompts

SEED = bytes(range(32))
WORKER = "0x" + "ab" * 20


def test_deterministic_and_in_range():
    a = assign_prompts(SEED, WORKER, 3, 7, 64)
    assert a == assign_prompts(SEED.hex(), WORKER.upper().replace("0X", "0x"), 3, 7, 64)
    assert len(a) == 64 and len(set(a)) == 64
    assert all(0 <= i < 2**63 for i in a)


def test_matches_documented_formula():
    prefix = DOMAIN + SEED + bytes.fromhex("ab" * 20) + (3).to_bytes(8, "big") + (7).to_bytes(8, "big")
    want = int.from_bytes(hashlib.sha256(prefix + (0).to_bytes(4, "big")).digest()[:8], "big") >> 1
    assert assign_prompts(SEED, WORKER, 3, 7, 1) == [want]


def test_prefix_stable_across_counts():
    assert assign_prompts(SEED, WORKER, 3, 7, 10) == assign_prompts(SEED, WORKER, 3, 7, 20)[:10]


@pytest.mark.parametrize("change", ["seed", "worker", "version", "nonce"])
def test_every_input_matters(change):
    args = {"run_seed": SEED, "worker": WORKER, "version": 3, "nonce": 7}
    other = dict(args)
    other[{"seed": "run_seed"}.get(change, change)] = {
        "seed": bytes(32), "worker": "0x" + "ac" * 20, "version": 4, "nonce": 8}[change]
    a, b = assign_prompts(count=32, **args), assign_prompts(count=32, **other)
    assert not set(a) & set(b)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"run_seed": b"short"}, "run_seed"),
    ({"run_seed": "zz" * 32}, "run_seed"),
    ({"worker": "0x1234"}, "worker"),
    ({"version": -1}, "version"),
    ({"nonce": 2**64}, "nonce"),
    ({"count": 0}, "count"),
    ({"version": True}, "version"),
])
def test_rejects_malformed_inputs(kwargs, field):
    args = {"run_seed": SEED, "worker": WORKER, "version": 0, "nonce": 0, "count": 4, **kwargs}
    with pytest.raises(AssignmentError, match=field):
        assign_prompts(**args)
