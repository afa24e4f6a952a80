"""Faulty public data fails named checks of the version that holds it; it never stops the audit.

A tiny one-shard model in a local store and the fake chain of `audit_fakes.py`; the records are a
dishonest coordinator's, written by hand (no contribution needs to validate for these faults).
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from audit_fakes import FakeChain
from click.testing import CliRunner

from krill.audit import AuditSource, audit_versions
from krill.errors import ChainUnavailableError
from krill.model.manifest import Manifest, ParameterEntry, ShardEntry
from krill.model.publish import bundle_files
from krill.model.shards import shard_to_bytes
from krill.payload.limits import PayloadLimits
from krill.protocol.record import (
    AcceptedEntry,
    AggregationRecord,
    RejectedEntry,
    ShardOutcome,
    publish_record,
)
from krill.protocol.spec import RunSpec
from krill.store.cid import digest_to_cid
from krill.store.local import LocalStore

WORKER = "0x" + "01" * 20


class World:
    """Version 0 of a one-shard run, and `publish` for records written by hand."""

    def __init__(self, root):
        self.store = LocalStore(root)
        data = shard_to_bytes({"w": torch.arange(64, dtype=torch.float32).reshape(8, 8) / 10})
        self.shard = ShardEntry(index=0, cid=self.store.add(data, pin=True), sha256=hashlib.sha256(data).hexdigest(),
                                size=len(data), parameters=[ParameterEntry(name="w", shape=[8, 8], dtype="F32")])
        self.tokenizer = self.store.add(bundle_files({}), pin=True)
        m0, c0, d0 = self.manifest(0, None)
        self.spec = RunSpec(name="t", base_manifest_cid=c0, num_shards=1, limits=PayloadLimits(vocab_size=100))
        self.chain = FakeChain(self.spec.run_id)
        self.chain.publish(0, d0, b"\0" * 32)
        self.cids, self.records = {0: c0}, {}

    def manifest(self, version, parent):
        m = Manifest(version=version, parent=parent, architecture={}, tokenizer=self.tokenizer, shards=[self.shard])
        return m, self.store.add(m.canonical_bytes(), pin=True), hashlib.sha256(m.canonical_bytes()).digest()

    def publish(self, version, outcome=None, accepted=(), rejected=()):
        _, cid, digest = self.manifest(version, self.cids[version - 1])
        parent = self.records.get(version - 1)
        record = AggregationRecord(
            version=version, run_id=self.spec.run_id.hex(), rule=self.spec.rule.model_dump(mode="json"),
            parent_manifest_cid=self.cids[version - 1], manifest_cid=cid,
            parent_record_cid=None if parent is None else digest_to_cid(parent.digest),
            accepted=list(accepted), rejected=list(rejected), masks_cid=self.store.add(b"x", pin=True),
            masks_sha256="00" * 32, closed_by="count",
            shards=[outcome or ShardOutcome(shard=0, submissions=0, optimizer_state_cid=None)])
        publish_record(self.store, record)
        self.chain.publish(version, digest, record.digest)
        self.cids[version], self.records[version] = cid, record
        return record

    def source(self):
        return AuditSource(self.chain, self.store, self.spec)


def _entry(commit_id=1, trust="0.5", weight="0.5"):
    return AcceptedEntry(commit_id=commit_id, worker=WORKER, header_digest="cd" * 32, model_version=0,
                         behaviour_version=0, staleness=0, trust=trust, weight=weight, shards=[0], mean_reward="0.0",
                         tokens=1)


def _failed(report):
    return {c.name: c.detail for c in report.failures}


def test_an_optimizer_state_that_is_not_safetensors_fails_a_check_and_spares_the_other_versions(tmp_path):
    world = World(tmp_path)
    garbage = b"not a safetensors file" * 10  # its sha256 is what the record names
    world.publish(1, ShardOutcome(shard=0, submissions=1, optimizer_state_cid=world.store.add(garbage, pin=True),
                                  optimizer_state_sha256=hashlib.sha256(garbage).hexdigest()))
    world.publish(2)
    reports = audit_versions(world.source(), [1, 2])
    assert [r.version for r in reports] == [1, 2]
    assert set(_failed(reports[0])) == {"shard 0 optimizer", "masks"}  # its own clean mismatch is kept
    failed = _failed(reports[1])
    assert set(failed) == {"masks"} and "not a valid safetensors file" in failed["masks"], failed


def test_ids_the_chain_cannot_hold_fail_their_checks(tmp_path):
    world = World(tmp_path)
    world.chain.commit(WORKER, 0, 0, b"\1" * 32)
    world.publish(1, accepted=[_entry(commit_id=2**256)],
                  rejected=[RejectedEntry(commit_id=2**256 + 1, worker=WORKER, reason_code="stale", reason="old")])
    (report,) = audit_versions(world.source(), [1])
    failed = _failed(report)
    name = f"commit {2**256}"
    assert "cannot be read on-chain: ChainInputError" in failed[f"{name} on-chain"]
    assert "ChainInputError" in failed[f"{name} nonce"] and "ChainInputError" in failed[f"{name} payload"]
    assert f"rejected commit {2**256 + 1} cannot be read on-chain" in failed["entries"]
    assert failed["recompute"] == "not attempted: an input above failed"
    assert "internal" not in failed


def test_a_trust_that_is_not_a_number_gives_strict_json(tmp_path, monkeypatch):
    from krill.commands import audit_cmd

    world = World(tmp_path)
    world.publish(1, accepted=[_entry(trust="abc", weight="nan")])
    (report,) = audit_versions(world.source(), [1])
    assert "trust 'abc' is not a number in [0, 1]" in _failed(report)["commit 1 weight"]
    data = report.to_dict()
    assert data["contributions"][0]["trust"] is None and data["contributions"][0]["weight"] is None
    json.dumps(data, allow_nan=False)

    monkeypatch.setattr(audit_cmd, "open_public_run", lambda stack: (None, world.chain, world.store, world.spec))

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    for args in (["--version", "1", "--json"], ["--all", "--json"]):
        result = CliRunner().invoke(audit_cmd.audit, args)
        assert result.exit_code == 1, result.output
        parsed = json.loads(result.output, parse_constant=refuse)
        one = parsed if "version" in parsed else parsed["versions"][0]
        assert one["contributions"][0]["trust"] is None and one["ok"] is False


def test_an_error_of_the_audit_itself_is_a_named_check_and_spares_the_other_versions(tmp_path, monkeypatch):
    from krill.audit import recompute

    world = World(tmp_path)
    world.publish(1)
    world.publish(2)
    checked = recompute._check_entry_sets

    def broken(source, record, report):
        if record.version == 1:
            raise RuntimeError("boom")
        checked(source, record, report)

    monkeypatch.setattr(recompute, "_check_entry_sets", broken)
    first, second = audit_versions(world.source(), [1, 2])
    assert [c.name for c in first.checks] == ["published", "record", "parent", "internal"]  # what it had is kept
    internal = first.checks[-1]
    assert not internal.ok and "RuntimeError: boom" in internal.detail and "test_audit_faults.py" in internal.detail
    assert "internal" not in {c.name for c in second.checks} and "entries" in {c.name for c in second.checks}


def test_a_chain_outage_is_not_a_finding_and_propagates(tmp_path):
    world = World(tmp_path)
    world.publish(1)

    def down(run_id, version):
        raise ChainUnavailableError("chain at http://127.0.0.1:1 is unreachable")

    world.chain.version_of = down
    with pytest.raises(ChainUnavailableError):
        audit_versions(world.source(), [1])
