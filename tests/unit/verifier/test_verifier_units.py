"""Verifier building blocks without a chain: persisted state, selection arithmetic, evidence encoding."""

from __future__ import annotations

import hashlib
import sqlite3
import threading

import numpy as np
import pytest

from krill.errors import ConfigError
from krill.payload.canonical import parse_canonical
from krill.protocol.evidence import (
    MAX_DETAIL,
    Evidence,
    check_record,
    figure,
    load_evidence,
    publish_evidence,
)
from krill.store.cid import digest_to_cid
from krill.store.local import LocalStore
from krill.verifier.select import can_still_attest, gradient_shard, last_block, unavailable_after
from krill.verifier.state import ATTESTED, MISSED, PENDING, SKIPPED, Job, VerifierState

CONTRACT = "0x" + "ab" * 20
RUN = bytes(range(32))
ME = "0x" + "cd" * 20


def _job(i: int) -> Job:
    return Job(i, "0x" + f"{i:02x}" * 20, 0, i, hashlib.sha256(bytes([i])).digest(), 100 + i)


def test_state_survives_reopening_and_finishes_each_commit_once(tmp_path):
    path = tmp_path / "v.sqlite"
    state = VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME)
    assert state.cursor() is None
    assert state.add_jobs([_job(1), _job(2), _job(3)], next_block=110) == 3
    assert state.add_jobs([_job(2)], next_block=111) == 0  # a re-read event adds nothing
    assert state.finish(1, ATTESTED, ok=False, reason="rewards", evidence_cid="bafy", tx_hash="0x01")
    assert not state.finish(1, ATTESTED, ok=True)  # final decisions never change
    assert state.finish(2, SKIPPED, reason="not selected")
    state.close()
    again = VerifierState(path, contract=CONTRACT.upper().replace("0X", "0x"), run_id=RUN, verifier=ME)
    assert again.cursor() == 111
    assert [j.commit_id for j in again.pending()] == [3]
    assert again.pending()[0] == _job(3)
    d = again.decision(1)
    assert (d.status, d.ok, d.reason, d.evidence_cid) == (ATTESTED, False, "rewards", "bafy")
    counts = again.counts()
    assert counts[ATTESTED] == 1 and counts["failed"] == 1 and counts[SKIPPED] == 1 and counts[PENDING] == 1
    assert counts[MISSED] == 0
    again.close()


def test_state_refuses_a_file_of_another_run_or_verifier(tmp_path):
    path = tmp_path / "v.sqlite"
    VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME).close()
    with pytest.raises(ConfigError, match="run_id"):
        VerifierState(path, contract=CONTRACT, run_id=b"\x01" * 32, verifier=ME)
    with pytest.raises(ConfigError, match="verifier"):
        VerifierState(path, contract=CONTRACT, run_id=RUN, verifier="0x" + "ee" * 20)



def test_a_new_state_file_another_connection_holds_opens_once_it_is_released(tmp_path):
    """Two verifier processes (or a verifier and its status) opening a new state file at once: while one holds the
    file's lock, switching it to WAL, the other's switch failed at once with 'database is locked' (SQLite asks no
    busy handler there; one round in about a hundred of eight openers). It now waits as any statement does."""
    path = tmp_path / "v.sqlite"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # the other opener's lock on the still rollback-journal file
    release = threading.Timer(0.3, other.execute, ("COMMIT",))
    release.start()
    try:
        state = VerifierState(path, contract=CONTRACT, run_id=RUN, verifier=ME)
    finally:
        release.join()
        other.close()
    assert state.cursor() is None and state.add_jobs([_job(1)], next_block=101) == 1
    assert state._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    state.close()

def test_windows_leave_room_for_the_attestation_and_declare_unavailable_late():
    assert last_block(100, 40) == 140
    assert can_still_attest(139, 100, 40) and not can_still_attest(140, 100, 40)
    assert unavailable_after(100, 40) == 130
    assert unavailable_after(100, 4) == 102  # margin of at least two blocks
    assert unavailable_after(100, 1) == 101


def test_gradient_shard_is_deterministic_spread_and_among_the_carried_shards():
    key = b"\x05" * 32
    draws = [gradient_shard(hashlib.sha256(bytes([i])).digest(), i, key, [0, 1, 2, 3]) for i in range(200)]
    assert draws == [gradient_shard(hashlib.sha256(bytes([i])).digest(), i, key, [3, 2, 1, 0]) for i in range(200)]
    assert set(draws) == {0, 1, 2, 3}
    assert all(gradient_shard(b"\x01" * 32, 7, key, [5, 9]) in (5, 9) for _ in range(3))
    assert gradient_shard(b"\x01" * 32, 7, key, []) is None
    other = [gradient_shard(hashlib.sha256(bytes([i])).digest(), i, b"\x06" * 32, [0, 1, 2, 3]) for i in range(200)]
    assert other != draws  # another verifier tends to draw other shards


def test_figures_are_canonical_and_details_capped():
    assert figure(np.float32(0.5)) == "0.5" and figure(0.1) == "0.1" and figure(np.int64(3)) == 3
    assert figure(float("nan")) == "nan" and figure(True) is True and figure(None) is None
    assert figure(1 << 70) == str(1 << 70)
    record = check_record("gradient", False, "x" * 5000, {"cosine": np.float64(0.25), "shard": 1}, 0.0123)
    assert len(record.detail) == MAX_DETAIL and record.ms == 12
    assert record.figures == {"cosine": "0.25", "shard": 1}


def _evidence(**over) -> Evidence:
    fields = dict(chain_id=31337, contract=CONTRACT, run_id=RUN.hex(), commit_id=4, header_digest="11" * 32,
                  header_cid=digest_to_cid(b"\x11" * 32), worker="0x" + "01" * 20, model_version=2,
                  behaviour_version=1, nonce=9, verifier=ME, verifier_key="22" * 32, randomness="33" * 32,
                  gradient_shard=1, ok=False, reason="gradient", failed_field=None,
                  checks=[check_record("signature", True, "ok", {}, 0.001),
                          check_record("gradient", False, "cosine 0.1", {"cosine": 0.1}, 0.5)],
                  engine="hf-torch", krill_version="0.1.0")
    fields.update(over)
    return Evidence(**fields)


def test_evidence_round_trips_through_the_store_with_its_attested_digest(tmp_path):
    store = LocalStore(tmp_path / "store")
    evidence = _evidence()
    data = evidence.encode()
    assert parse_canonical(data, 1 << 20) is not None  # canonical JSON: no floats anywhere
    cid, digest = publish_evidence(store, evidence)
    assert digest == hashlib.sha256(data).digest() and cid == digest_to_cid(digest)
    assert load_evidence(store, cid) == evidence
    with pytest.raises(ValueError):
        _evidence(reason="made-up")
    with pytest.raises(ValueError):
        _evidence(worker="0xABC")


class _Version:
    """What `Policies.model` reads of a version: its manifest's architecture and parameters, its tensors."""

    def __init__(self, version: int, model):
        from types import SimpleNamespace

        import torch

        self.version = version
        parameters = [SimpleNamespace(name=n, shape=list(t.shape)) for n, t in model.state_dict().items()]
        self.manifest = SimpleNamespace(architecture=model.config.to_dict(),
                                        shards=[SimpleNamespace(parameters=parameters)])
        torch.manual_seed(version)
        self._tensors = {n: torch.randn_like(t) for n, t in model.state_dict().items()}

    def all_tensors(self):
        return self._tensors


def test_policies_reload_the_least_recently_used_model_instead_of_building_one():
    import torch

    from krill.model.build import build_tiny_model
    from krill.verifier.replay import Policies

    model, _ = build_tiny_model(seed=0)
    versions = {v: _Version(v, model) for v in range(4)}
    policies = Policies(chain=None, store=None, spec=None, max_models=2)
    policies.state = versions.__getitem__
    first, second = policies.model(0), policies.model(1)
    assert first is not second and policies.loads == 2
    assert policies.model(0) is first and policies.loads == 2  # cached: version 0 is now the newest
    third = policies.model(2)  # version 1 is the least recently used: its model takes version 2's weights
    assert third is second and policies.loads == 3 and policies.load_seconds > 0
    for name, tensor in third.state_dict().items():
        assert torch.equal(tensor, versions[2].all_tensors()[name]), name
    assert policies.model(0) is first
    assert not third.training
