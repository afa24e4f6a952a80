"""The coordinator's pure rules: reward split, closing, weighing, rejection codes, spec building."""

from __future__ import annotations

import pytest

from krill.coordinator.close import closing_reason
from krill.coordinator.ingest import rejection_code
from krill.coordinator.trust import Standing, trust_of, weigh
from krill.db.models import RejectionCode
from krill.payload import errors as pe
from krill.payload.limits import PayloadLimits
from krill.protocol.rewards import reward_split
from krill.protocol.spec import RewardSpec, RunSpec, VersionSpec
from krill.rl.staleness import StalenessConfig


def _spec(**kw) -> RunSpec:
    return RunSpec(name="unit", base_manifest_cid="bafkreifjjcie6lypi6ny7amxnfftagclbuxndqonfipmb64f2km2devei4",
                   limits=PayloadLimits(vocab_size=16), **kw)


def _entry(worker: str, weight: float) -> dict:
    return {"worker": worker, "weight": repr(weight)}


def test_reward_split_is_exact_pro_rata_and_deterministic():
    a, b, c = "0x" + "a" * 40, "0x" + "b" * 40, "0x" + "c" * 40
    split = reward_split(10, [_entry(a, 0.25), _entry(b, 0.25), _entry(c, 0.25)])
    assert sum(n for _, n in split) == 10
    assert split == [(a, 4), (b, 3), (c, 3)]  # the leftover unit goes to the lower address on a tie
    # Two contributions of one worker add up; order of entries does not matter.
    one = reward_split(10**19, [_entry(a, 0.5), _entry(b, 0.25), _entry(a, 0.25)])
    two = reward_split(10**19, [_entry(a, 0.25), _entry(a, 0.5), _entry(b, 0.25)])
    assert one == two == [(a, 75 * 10**17), (b, 25 * 10**17)]
    assert reward_split(0, [_entry(a, 1.0)]) == [] and reward_split(5, []) == []


def test_reward_split_keeps_the_64_heaviest_workers():
    entries = [_entry("0x" + f"{i:040x}", 1.0 + i) for i in range(70)]
    split = reward_split(10**18, entries)
    assert len(split) == 64 and sum(n for _, n in split) == 10**18
    assert "0x" + f"{5:040x}" not in {a for a, _ in split} and "0x" + f"{6:040x}" in {a for a, _ in split}


def _settled_by_the_coordinator(spec, version: int, accepted: list[dict], pool: int = 10**21):
    """What `settle_version` credits for `version` of `spec`'s run with the journal row's `accepted`."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from krill.coordinator.settle import settle_version

    @contextmanager
    def session():
        yield SimpleNamespace(get=lambda _model, _key: SimpleNamespace(accepted=accepted, note=None))

    sent = []

    def settle(_run, _version, accounts, amounts):
        sent.append(list(zip(accounts, amounts, strict=True)))

    chain = SimpleNamespace(version_of=lambda _run, _v: SimpleNamespace(settled=False),
                            run_of=lambda _run: SimpleNamespace(reward_pool=pool), settle=settle)
    ctx = SimpleNamespace(db=SimpleNamespace(session=session, write=session), chain=chain, spec=spec,
                          run_id=spec.run_id, run_hex=spec.run_id.hex())
    split, note = settle_version(ctx, version)
    assert note is None and sent == [split]
    from krill.coordinator.adopt import _settle  # a coordinator that lost its journal settles from the record

    _settle(ctx, version, accepted)
    assert sent == [split, split]
    return dict(split)


def test_a_new_runs_settlement_orders_tied_accounts_afresh_so_ground_low_addresses_do_not_take_every_slot():
    """Newcomers all start at the trust prior, so their weights tie exactly. Under address ties (specs
    published before the option) 64 accounts ground to low addresses took all 64 paid slots of every
    version from 8 honest newcomers; a new run orders ties by a hash of the run id, the version and the
    address, so the paid accounts change from version to version and the honest ones are paid."""
    honest = [_entry("0x" + f"f{i:039x}", 0.25) for i in range(8)]
    sybils = [_entry("0x" + f"{i + 1:040x}", 0.25) for i in range(64)]
    total = 10**19
    old = _spec(reward=RewardSpec(ties="address"))
    assert old.reward.ties == "address"
    paid = _settled_by_the_coordinator(old, 1, honest + sybils, pool=total)
    assert len(paid) == 64 and not {e["worker"] for e in honest} & set(paid)  # the old rule, kept for its runs
    new = _spec()
    assert new.reward.ties == "hashed"
    paid_sets = []
    for version in range(1, 9):
        paid = _settled_by_the_coordinator(new, version, honest + sybils, pool=total)
        assert len(paid) == 64 and sum(paid.values()) == total
        honest_paid = {e["worker"] for e in honest} & set(paid)
        assert honest_paid, version
        paid_sets.append(frozenset(paid))
    assert len(set(paid_sets)) > 1
    sybil_share = sum(n for v in range(1, 9) for a, n in _settled_by_the_coordinator(new, v, honest + sybils).items()
                      if a.startswith("0x0")) / (8 * total)
    assert sybil_share < 0.95  # 64 of 72 tied accounts: 8/9 in expectation, not all of it


def test_a_new_runs_remainder_units_do_not_always_go_to_the_lower_address():
    a, b, c = "0x" + "a" * 40, "0x" + "b" * 40, "0x" + "c" * 40
    entries = [_entry(a, 0.25), _entry(b, 0.25), _entry(c, 0.25)]
    spec = _spec()
    winners = set()
    for version in range(1, 13):
        split = _settled_by_the_coordinator(spec, version, entries, pool=10)
        assert sorted(split.values()) == [3, 3, 4]
        winners |= {w for w, n in split.items() if n == 4}
    assert winners != {a}
    # the same split anyone recomputes from the spec, and hashed ties need the run id and version
    from krill.protocol.rewards import version_split

    assert version_split(spec, 3, 10, entries) == sorted(_settled_by_the_coordinator(spec, 3, entries, 10).items())
    with pytest.raises(ValueError, match="run id"):
        reward_split(10, entries, ties="hashed")


def test_closing_by_count_or_deadline_with_minimum():
    spec = _spec(version=VersionSpec(contributions=4, deadline_s=30, min_contributions=2))
    assert closing_reason(spec, 4, 1.0) == "count"
    assert closing_reason(spec, 3, 10.0) is None
    assert closing_reason(spec, 2, 31.0) == "deadline"
    assert closing_reason(spec, 1, 1000.0) is None
    assert closing_reason(spec, 3, None) is None


def test_weigh_trust_times_staleness_and_rejections():
    spec = _spec(staleness=StalenessConfig(kind="inverse", max_staleness=2))
    fresh = weigh(spec, Standing(0, 0, False), version=3, model_version=2)
    assert (fresh.staleness, fresh.weight, fresh.code) == (0, 0.25, None)
    older = weigh(spec, Standing(3, 0, False), version=3, model_version=0)
    assert older.staleness == 2 and older.weight == pytest.approx(trust_of(spec, Standing(3, 0, False)) / 3)
    assert weigh(spec, Standing(0, 0, False), 4, 0).code == RejectionCode.STALE
    assert weigh(spec, Standing(9, 0, True), 3, 2).code == RejectionCode.JAILED
    assert weigh(spec, Standing(0, 60, False), 3, 2).code == RejectionCode.BELOW_TRUST_FLOOR


def test_payload_errors_map_to_rejection_codes():
    assert rejection_code(pe.SignatureError("Ed25519 signature does not verify", field="header.signature")) \
        == RejectionCode.BAD_SIGNATURE
    assert rejection_code(pe.SignatureError("header names a different Ed25519 key than the one registered",
                                            field="header.ed25519_key")) == RejectionCode.UNKNOWN_KEY
    assert rejection_code(pe.DigestMismatchError("x", field="rollouts.safetensors.sha256")) == RejectionCode.DIGEST_MISMATCH
    assert rejection_code(pe.ShapeError("x", field="grad-0")) == RejectionCode.MALFORMED_PAYLOAD
    assert rejection_code(pe.ContextMismatchError("x", field="header.run_id")) == RejectionCode.MALFORMED_PAYLOAD


def test_build_spec_couples_the_staleness_bounds_and_sizes_the_caps(tmp_path):
    from krill.coordinator.create_run import build_spec
    from krill.errors import ConfigError
    from krill.model.build import TinyModelSpec, build_tiny_model
    from krill.model.publish import publish_model_dir
    from krill.store.local import LocalStore

    build_tiny_model(seed=1, spec=TinyModelSpec(hidden=16, layers=2, heads=2, intermediate=32), directory=tmp_path / "m")
    manifest, cid = publish_model_dir(LocalStore(tmp_path / "s"), tmp_path / "m", num_shards=2)
    spec = build_spec("unit", manifest, cid, 2, {"chain": {"max_staleness": 3},
                                                 "rollout": {"prompts_per_contribution": 2, "group_size": 4}})
    assert spec.staleness.max_staleness == spec.chain.max_staleness == 3
    assert spec.limits.vocab_size == manifest.architecture["vocab_size"]
    assert (spec.limits.max_sequences, spec.limits.max_groups) == (8, 2)
    wider = build_spec("unit", manifest, cid, 2, {"limits": {"max_sequences": 40, "max_groups": 5}})
    assert (wider.limits.max_sequences, wider.limits.max_groups) == (40, 5)  # caps above the 4 x 8 shape
    with pytest.raises(ConfigError, match=r"limits.max_sequences 5 is under rollout.prompts_per_contribution x "
                                          r"rollout.group_size = 32.*every honest contribution would be refused"):
        build_spec("unit", manifest, cid, 2, {"limits": {"max_sequences": 5}})
    with pytest.raises(ConfigError, match="differ"):
        build_spec("unit", manifest, cid, 2, {"chain": {"max_staleness": 1}, "staleness": {"max_staleness": 2}})
    with pytest.raises(ConfigError, match="run spec"):
        build_spec("unit", manifest, cid, 2, {"version": {"contributions": 0}})


def test_the_run_context_keeps_only_the_versions_a_contribution_can_still_be_computed_at():
    """Published versions (`adopt`) and loaded ones share one bound: a long run's coordinator holds
    max_staleness + 3 version states, not every version it published (13 MB each in the demo)."""
    from types import SimpleNamespace

    from krill.coordinator.context import RunContext
    from krill.protocol.spec import ChainSpec

    spec = _spec(chain=ChainSpec(max_staleness=2))
    ctx = RunContext(chain=None, store=None, db=None, spec=spec, chain_id=31337)
    for version in range(1, 41):
        ctx.adopt(SimpleNamespace(version=version))
    assert ctx.cached_versions() == [36, 37, 38, 39, 40]
    assert ctx.state(38).version == 38  # still served from memory (no chain or store here)


def test_a_decision_takes_no_more_entries_than_keep_the_record_under_its_cap():
    """Each accepted entry adds a trimmed fraction to every shard's outcome: with many shards the record's
    cap binds before MAX_ACCEPTED_PER_VERSION. Built at the worst case, the record still fits."""
    from krill.coordinator.close import MAX_ACCEPTED_PER_VERSION, MAX_REJECTED_PER_RECORD, fitting_entries
    from krill.protocol.record import (
        MAX_RECORD_BYTES,
        AcceptedEntry,
        AggregationRecord,
        RejectedEntry,
        ShardOutcome,
    )

    def entry(i, shards):
        return AcceptedEntry(commit_id=10**12 + i, worker="0x" + "ab" * 20, header_digest="cd" * 32, model_version=10**6,
                             behaviour_version=10**6, staleness=3, trust=repr(0.1 / 3), weight=repr(0.2 / 7),
                             shards=list(range(shards)), mean_reward=repr(0.1 / 3), tokens=10**6).model_dump(mode="json")

    rejected = [RejectedEntry(commit_id=10**12 + i, worker="0x" + "ef" * 20, reason_code="malformed_payload",
                              reason="\U0010ffff" * 500).model_dump(mode="json") for i in range(MAX_REJECTED_PER_RECORD)]
    for shards in (2, 16, 64, 128, 256):
        accepted = [entry(i, shards) for i in range(MAX_ACCEPTED_PER_VERSION)]
        n, r = fitting_entries(accepted, rejected, shards)
        assert 1 <= n <= MAX_ACCEPTED_PER_VERSION and 1 <= r <= MAX_REJECTED_PER_RECORD
        record = AggregationRecord(
            run_id="ab" * 32, version=10**6, parent_manifest_cid="bafkrei" + "a" * 52, parent_record_cid="bafkrei" + "b" * 52,
            manifest_cid="bafkrei" + "c" * 52, rule={"type": "clip-mix-trim", "trim_fraction": 0.2, "clip": 1e9},
            accepted=[AcceptedEntry(**e) for e in accepted[:n]], rejected=[RejectedEntry(**e) for e in rejected[:r]],
            shards=[ShardOutcome(shard=s, submissions=n, optimizer_state_cid="bafkrei" + "d" * 52,
                                 optimizer_state_sha256="e" * 64, trimmed_fractions=[repr(1 / 3 - 1e-17)] * n,
                                 clipped=n, update_norm=repr(1e-300 / 3), grad_norm=repr(1e300 / 3)) for s in range(shards)],
            masks_cid="bafkrei" + "f" * 52, masks_sha256="0" * 64, closed_by="deadline")
        assert len(record.encode()) <= MAX_RECORD_BYTES, (shards, n, len(record.encode()))
        if shards <= 2:
            assert n == MAX_ACCEPTED_PER_VERSION  # the common case is not limited
    ascii_reasons = [{**e, "reason": "x" * 500} for e in rejected]
    assert fitting_entries([entry(i, 2) for i in range(200)], ascii_reasons, 2) == (200, MAX_REJECTED_PER_RECORD)
    assert fitting_entries([entry(i, 256) for i in range(200)], rejected, 256)[0] < 200


def test_ensure_tables_adds_the_journal_columns_an_older_table_lacks(tmp_path):
    from sqlalchemy import inspect, text

    from krill.coordinator.journal import ensure_tables
    from krill.db.session import open_database

    db = open_database(f"sqlite:///{tmp_path / 'old.db'}")
    with db.engine.begin() as conn:  # the table as the first release created it
        conn.execute(text("CREATE TABLE coordinator_versions (run_id VARCHAR(64) NOT NULL, version BIGINT NOT NULL, "
                          "state VARCHAR(16) NOT NULL, closed_by VARCHAR(16) NOT NULL, accepted JSON NOT NULL, "
                          "rejected JSON NOT NULL, decided_at FLOAT NOT NULL, window_s FLOAT NOT NULL, "
                          "manifest_digest VARCHAR(64), record_digest VARCHAR(64), bytes_published BIGINT, note TEXT, "
                          "PRIMARY KEY (run_id, version))"))
        conn.execute(text("INSERT INTO coordinator_versions VALUES ('ab', 1, 'settled', 'count', '[]', '[]', 0, 0, "
                          "NULL, NULL, NULL, NULL)"))
    ensure_tables(db)
    ensure_tables(db)  # idempotent
    with db.engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("coordinator_versions")}
        row = conn.execute(text("SELECT served_shards, keep_states FROM coordinator_versions")).one()
    assert {"served_shards", "keep_states"} <= columns and tuple(row) == (None, None)
    db.close()


def test_had_room_sizes_the_largest_rejection_as_the_coordinator_can_meet_it():
    """A rejection's reason may echo a worker's text: 500 characters outside the BMP are 12 JSON bytes each.
    A record with room for a 3 kB rejection but not a 6 kB one may have left one waiting, so the audit's
    coverage row must not count it as having had room (an attacker's junk could otherwise make an honest
    coordinator fail it)."""
    import json

    from krill.protocol.record import (
        MAX_RECORD_BYTES,
        RECORD_FIXED_BYTES,
        SHARD_FIXED_BYTES,
        AggregationRecord,
        RejectedEntry,
        ShardOutcome,
        fitting_entries,
        had_room,
    )

    half = (MAX_RECORD_BYTES - RECORD_FIXED_BYTES - 2 * SHARD_FIXED_BYTES) // 2

    def rejection(i, reason):
        return RejectedEntry(commit_id=i + 1, worker="0x" + "ef" * 20, reason_code="malformed_payload", reason=reason)

    rejected, used = [], 0
    while half - used > 4_500:  # fill with 3 kB reasons until 4.5 kB or less of the rejections' half is left
        rejected.append(rejection(len(rejected), "\u00e9" * 500))
        used += len(json.dumps(rejected[-1].model_dump(mode="json"), separators=(",", ":"))) + 1
    assert len(rejected) < 100
    dumped = [r.model_dump(mode="json") for r in rejected]
    assert fitting_entries([], dumped, 2)[1] == len(rejected)  # the coordinator named them all
    emoji = rejection(999, "\U0001f600" * 500).model_dump(mode="json")
    assert fitting_entries([], dumped + [emoji], 2)[1] == len(rejected)  # an emoji reason would have waited
    record = AggregationRecord(
        run_id="ab" * 32, version=3, parent_manifest_cid="bafkrei" + "a" * 52, parent_record_cid=None,
        manifest_cid="bafkrei" + "c" * 52, rule={"type": "clip-mix-trim"}, accepted=[], rejected=rejected,
        shards=[ShardOutcome(shard=s, submissions=0, optimizer_state_cid=None) for s in range(2)],
        masks_cid="bafkrei" + "f" * 52, masks_sha256="0" * 64, closed_by="count")
    assert not had_room(record, 2)
    assert had_room(record.model_copy(update={"rejected": rejected[:-2]}), 2)


@pytest.mark.parametrize("trust, staleness, at", [
    ({"floor": 0.0, "prior_alpha": 5e-324}, StalenessConfig(), 0),  # trust itself is 0.0
    ({"floor": 0.0, "prior_alpha": 1e-300}, StalenessConfig(kind="exp", tau=1.0, max_staleness=700), 700),  # underflow
])
def test_a_weight_that_is_not_positive_is_rejected_as_below_the_floor(trust, staleness, at):
    """The validators take a floor of 0 and any positive prior, so trust x staleness weight can be 0.0; accepted,
    it could not be folded (a version of only such weights sums to 0, and the journalled decision stopped the
    coordinator) and the audit fails any weight <= 0."""
    from krill.protocol.spec import TrustSpec

    spec = _spec(trust=TrustSpec(**trust), staleness=staleness)
    w = weigh(spec, Standing(0, 0, False), version=at + 1, model_version=0)
    assert w.weight is None and w.code == RejectionCode.BELOW_TRUST_FLOOR, w
    assert "cannot be folded" in w.reason
