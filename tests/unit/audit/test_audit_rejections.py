"""Judging a record's rejections: a made-up reason code, and a hostile header's cost to the audit.

The one-shard run of `audit_fakes.py` with records written by hand. These tests read only the
`entries` row (and what the audit fetched to fill it).
"""

from __future__ import annotations

import hashlib

import pytest
from audit_fakes import CHAIN_ID, CONTRACT, World

from krill.audit import audit_versions
from krill.audit.entries import REASON_CODES
from krill.db.models import RejectionCode
from krill.payload.header import SignedHeader
from krill.protocol.record import RejectedEntry

A = "0x" + "0a" * 20


def _entries(world, version=1):
    (report,) = audit_versions(world.source(), [version])
    return next(c for c in report.checks if c.name == "entries")


def test_the_audit_knows_every_reason_code_a_coordinator_gives():
    assert REASON_CODES == {code.value for code in RejectionCode}


@pytest.mark.parametrize(("code", "stands"), [("not_welcome", False), ("unavailable", True)])
def test_a_rejection_under_a_code_the_protocol_does_not_define_fails_the_entries_check(tmp_path, code, stands):
    """The record's pattern admits any code: a made-up one cut an honest commit out of the fold and the
    reward, and the audit, which judged only the codes it knew, passed it."""
    world = World(tmp_path)
    cid = world.chain.commit(A, 0, 0, b"\xcd" * 32)
    world.publish(1, rejected=[RejectedEntry(commit_id=cid, worker=A, reason_code=code, reason="says the coordinator")])
    row = _entries(world)
    assert row.ok == stands, row.detail
    if not stands:
        assert f"commit {cid} is rejected as {code}, which is not a reason the protocol defines" in row.detail


def test_a_header_naming_junk_files_is_judged_from_the_header_alone(tmp_path):
    """An unsigned header naming 100 files, each the same 64 KiB blob: the coordinator rejects it after
    reading the header (names and sizes are checked before any file is fetched); the audit fetched
    every file it named first (with 256 names of a 1 GiB blob, 256 GiB) before judging the rejection."""
    world = World(tmp_path)
    blob = b"\0" * (64 << 10)
    ref = {"cid": world.store.add(blob, pin=True), "sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
    header = SignedHeader.model_validate(dict(
        run_id=world.spec.run_id.hex(), chain_id=CHAIN_ID, contract=CONTRACT, worker=A, ed25519_key="11" * 32,
        model_version=0, behaviour_version=0, manifest_cid=world.cids[0], task="arithmetic", prompt_seed=0, nonce=0,
        sampling=dict(temperature_milli=1000, max_new_tokens=8, seed=0),
        files={f"junk{i}": ref for i in range(100)}, signature="00" * 64))
    world.store.put_block(header.encode(), pin=True)
    cid = world.chain.commit(A, 0, 0, header.digest)
    world.publish(1, rejected=[RejectedEntry(commit_id=cid, worker=A, reason_code="malformed_payload", reason="junk")])
    fetched, get = [], world.store.get

    def counting_get(c, max_bytes=None, sha256=None):
        data = get(c, max_bytes=max_bytes, sha256=sha256)
        fetched.append(len(data))
        return data

    world.store.get = counting_get
    row = _entries(world)
    assert row.ok, row.detail  # the rejection stands
    assert sum(fetched) < 20 * len(blob), f"the audit fetched {sum(fetched)} bytes"


@pytest.mark.parametrize("code", ["malformed_payload", "wrong_rewards"])
def test_a_rejection_whose_payload_cannot_be_read_is_named_as_not_judged(tmp_path, code):
    """Before: the row passed without a word ("0 distinct accepted; 1 rejected (...)"), as if the audit had
    judged the rejection, when it could read nothing to judge it by (a partial store: a held repo's blocks, a
    node that lacks the rejected worker's content). It still passes (nothing shows the rejection false), naming
    the commit and why."""
    world = World(tmp_path)
    cid = world.chain.commit(A, 0, 0, b"\xcd" * 32)  # a header nobody stored
    world.publish(1, rejected=[RejectedEntry(commit_id=cid, worker=A, reason_code=code, reason="says the coordinator")])
    row = _entries(world)
    assert row.ok, row.detail
    assert f"1 rejection(s) not judged, payload not readable: commit {cid} ({code}): not available: " in row.detail


def test_a_rejected_header_over_its_cap_is_judged_not_named_unread(tmp_path):
    """A header one byte over the run's cap: the coordinator rejects it as malformed (ObjectTooLargeError in
    `coordinator/ingest.py`) and the audit, reading the same, finds the rejection stands. The row called it
    "not judged, payload not readable", a store fault, as if the audit could not read it."""
    world = World(tmp_path)
    blob = b"h" * (world.spec.limits.max_header_bytes + 1)
    world.store.put_block(blob, pin=True)
    cid = world.chain.commit(A, 0, 0, hashlib.sha256(blob).digest())
    world.publish(1, rejected=[RejectedEntry(commit_id=cid, worker=A, reason_code="malformed_payload", reason="big")])
    row = _entries(world)
    assert row.ok, row.detail
    assert "not judged" not in row.detail, row.detail
