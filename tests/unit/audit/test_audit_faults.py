"""Faulty public data fails named checks of the version that holds it; it never stops the audit.

A tiny one-shard model in a local store and the fake chain of `audit_fakes.py`; the records are a
dishonest coordinator's, written by hand (no contribution needs to validate for these faults).
"""

from __future__ import annotations

import hashlib
import json

import pytest
from audit_fakes import World
from audit_fakes import entry as _entry
from click.testing import CliRunner

from krill.audit import audit_versions
from krill.errors import ChainUnavailableError
from krill.protocol.record import RejectedEntry, ShardOutcome

WORKER = "0x" + "01" * 20


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

    from types import SimpleNamespace

    config = SimpleNamespace(chain=SimpleNamespace(deploy_block=0))  # the command reads the deployment block
    monkeypatch.setattr(audit_cmd, "open_public_run", lambda stack, **_: (config, world.chain, world.store, world.spec))

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


def test_a_trust_no_count_of_the_workers_verdicts_gives_fails_the_weight_check(tmp_path):
    """Trust was checked only against [0, 1] and the floor: a coordinator could claim 1.0 for its sybil and
    hold an honest worker at the floor, skewing fold and rewards. It must now be (1 + p) / (1 + 3 + p + f)
    for some p, f no larger than the verdicts on the worker's commits before the version's publication."""
    world = World(tmp_path)
    chain, worker = world.chain, "0x" + "01" * 20
    earlier = chain.commit(worker, 0, 0, b"\3" * 32, block=50)
    for verifier in ("0x" + "e1" * 20, "0x" + "e2" * 20):
        chain.attest(earlier, True, verifier)  # two passing verdicts before version 1 (block 101)
    reachable = [repr(1 / 4), repr(2 / 5), repr(3 / 6)]  # p = 0, 1, 2 passes of the 2
    world.publish(1, accepted=[_entry(1, trust=t, weight=t) for t in reachable[:1]] +
                  [_entry(2, trust=reachable[1], weight=reachable[1]), _entry(3, trust=reachable[2], weight=reachable[2])])
    report = audit_versions(world.source(), [1])[0]
    assert not any(c.name.endswith("weight") for c in report.failures), _failed(report)
    world.publish(2, accepted=[_entry(4, trust="1.0", weight="1.0"), _entry(5, trust=repr(4 / 7), weight=repr(4 / 7))])
    failed = _failed(audit_versions(world.source(), [2])[0])
    assert "trust 1.0 is not (prior 1 + p)" in failed["commit 4 weight"]  # a sybil's claim
    assert "for any p <= 2 passing and f <= 0 failing" in failed["commit 5 weight"]  # 3 passes: one too many


def test_a_verifier_staked_before_the_run_that_tops_up_during_it_still_counts(tmp_path):
    """The contract emits `Staked` for every top-up and re-stake, and the run's scan starts at its creation
    block: a verifier staked before the run whose first `Staked` there is a top-up after a commit had its
    verdict on that commit uncounted, though its key was on-chain all along and the coordinator (its index
    kept since the deployment) counts it; the honest trust of one pass failed as unreachable."""
    world = World(tmp_path)
    chain, verifier = world.chain, "0x" + "e3" * 20
    commit = chain.commit(WORKER, 0, 0, b"\x05" * 32, block=50)
    key = chain.selected_key(commit)
    chain.stake(verifier, key, block=0)  # before the run (created in block 1)
    chain.attest(commit, True, verifier)  # selected, keyed before the commit: it counts
    chain.stake(verifier, key, block=80)  # a top-up during the run
    late = "0x" + "e4" * 20  # first staked during the run, after the commit: still not counted
    chain.stake(late, key, block=81)
    chain.attest(commit, True, late)
    world.publish(1, accepted=[_entry(2, trust=repr(2 / 5), weight=repr(2 / 5)),
                               _entry(3, trust=repr(3 / 6), weight=repr(3 / 6))])
    failed = _failed(audit_versions(world.source(), [1])[0])
    assert "commit 2 weight" not in failed, failed
    assert "for any p <= 1 passing and f <= 0 failing" in failed["commit 3 weight"], failed


def test_only_verdicts_the_coordinator_counts_bound_a_claimed_trust(tmp_path):
    """Anyone staked may attest, so the coordinator counts a verdict towards trust only when the commit's draw
    selected its verifier and the verifier's key was on-chain by the commit's block (`coordinator/standing.py`).
    The audit bounded a claimed trust by every verdict: a coordinator's sybil worker, passed by its own
    unselected or late-keyed verifiers, could be weighed towards 1 and the audit passed it."""
    import itertools

    from krill.protocol.selection import drawn

    world = World(tmp_path)
    chain, worker = world.chain, "0x" + "01" * 20
    ppm = world.spec.chain.check_probability_ppm
    unselected, late, counted = (chain.commit(worker, 0, n, bytes([n + 1]) * 32, block=50 + n) for n in range(3))
    key = next(k for i in itertools.count() if not drawn(chain.commits[unselected].randomness, unselected,
                                                         k := hashlib.sha256(b"sybil %d" % i).digest(), ppm))
    chain.stake("0x" + "e1" * 20, key, block=5)
    chain.attest(unselected, True, "0x" + "e1" * 20)  # staked before the run, but the draw did not select it
    chain.stake("0x" + "e2" * 20, chain.selected_key(late), block=chain.commits[late].commit_block + 1)
    chain.attest(late, True, "0x" + "e2" * 20)  # selected, but its key came after the commit: it could grind one
    chain.attest(counted, True, "0x" + "e3" * 20)  # selected, keyed before the run: counts
    claims = {4: repr(2 / 5), 5: repr(3 / 6), 6: repr(4 / 7)}  # one, two and three passes
    world.publish(1, accepted=[_entry(c, trust=t, weight=t) for c, t in claims.items()])
    failed = _failed(audit_versions(world.source(), [1])[0])
    assert "commit 4 weight" not in failed, failed
    for c in (5, 6):
        assert "for any p <= 1 passing and f <= 0 failing" in failed[f"commit {c} weight"], failed
