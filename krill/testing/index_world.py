"""A small hand-filled index for tests of what reads the index (the explorer, on SQLite and PostgreSQL).

One run with three versions, an honest worker, a forger and a verifier. The forger's commit 2 was
rejected (wrong rewards), failed a verdict whose evidence document is in the store, and was
slashed; the honest worker has 30 more commits so lists span several pages. Version 1's
aggregation record is in the store; version 2's is not. The audit report passes version 1 and
fails version 2. Test data only: nothing here is used by Krill itself.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

from krill.db.models import (
    Commit,
    Contribution,
    ContributionStatus,
    Eval,
    FetchStatus,
    Header,
    IndexMeta,
    Metric,
    Participant,
    RejectionCode,
    Reward,
    RewardKind,
    Run,
    Shard,
    Slash,
    Verdict,
    Version,
)
from krill.db.session import open_database
from krill.payload.canonical import canonical_json
from krill.protocol.record import (
    AcceptedEntry,
    AggregationRecord,
    RejectedEntry,
    ShardOutcome,
    publish_record,
)
from krill.store.local import LocalStore

TOKEN = 10**18
RUN = "ab" * 32
HONEST = "0x" + "11" * 20
FORGER = "0x" + "22" * 20
VERIFIER = "0x" + "33" * 20
EXTRA_COMMITS = 30


def _tx(n: int) -> str:
    return "0x" + f"{n:064x}"


def _participant(address: str, role: int, **kw) -> Participant:
    values = dict(address=address, role=role, ed25519_key="ee" * 32, staked=500 * TOKEN, unbonding=0, release_block=0,
                  jailed=False, jailed_commit_id=None, slashed_total=0, first_block=1, commits=0, checks_passed=0,
                  checks_failed=0, trust_alpha=1.0, trust_beta=3.0, rewards_credited=0, bounties_credited=0,
                  claimed=0)
    values.update(kw)
    return Participant(**values)


def _commit(cid: int, worker: str, version: int, **kw) -> Commit:
    values = dict(commit_id=cid, run_id=RUN, worker=worker, version=version, nonce=cid, header_digest=f"{cid:064x}",
                  header_cid=f"bafkreifake{cid}", worker_key="ee" * 32, block_number=10 + cid, tx_hash=_tx(1000 + cid),
                  randomness="cd" * 32, sealed_block=11 + cid, pass_count=0, fail_count=0, slashed=False)
    values.update(kw)
    return Commit(**values)


def _evidence_doc() -> dict:
    return {"format": "krill-evidence/1", "chain_id": 31337, "contract": "0x" + "44" * 20, "run_id": RUN,
            "commit_id": 2, "header_digest": f"{2:064x}", "header_cid": "bafkreifake2", "worker": FORGER,
            "model_version": 1, "behaviour_version": 1, "nonce": 2, "verifier": VERIFIER, "verifier_key": "ff" * 32,
            "randomness": "cd" * 32, "gradient_shard": None, "ok": False, "reason": "rewards", "failed_field": None,
            "checks": [{"name": "signature", "ok": True, "detail": "signature ok", "figures": {}, "ms": 1},
                       {"name": "rewards", "ok": False, "detail": "32 of 32 rewards differ from the task's",
                        "figures": {"mismatched": 32, "claimed_mean": "1.0"}, "ms": 4}],
            "engine": "hf-torch", "krill_version": "0.1.0"}


def _record(manifest_cid: str) -> AggregationRecord:
    return AggregationRecord(
        run_id=RUN, version=1, parent_manifest_cid="bafkreimanifest0", parent_record_cid=None, manifest_cid=manifest_cid,
        rule={"type": "clip-mix-trim", "trim_fraction": 0.2},
        accepted=[AcceptedEntry(commit_id=1, worker=HONEST, header_digest=f"{1:064x}", model_version=0,
                                behaviour_version=0, staleness=0, trust="0.25", weight="0.25", shards=[0, 1],
                                mean_reward="0.5", tokens=120)],
        rejected=[RejectedEntry(commit_id=2, worker=FORGER, reason_code="wrong_rewards", reason="rewards differ")],
        shards=[ShardOutcome(shard=0, submissions=1, optimizer_state_cid=None, optimizer_state_sha256="1" * 64,
                             trimmed_fractions=["0.125"]),
                ShardOutcome(shard=1, submissions=1, optimizer_state_cid=None, optimizer_state_sha256="2" * 64,
                             trimmed_fractions=["0.375"])],
        masks_cid="bafkreimasks1", masks_sha256="0" * 64, closed_by="count")


def fill_index_world(url: str, workdir: Path) -> SimpleNamespace:
    """Fill the empty database at `url` (tables are created) and a local store under `workdir`;
    returns the facts tests check against (addresses, digests, CIDs, the audit report path)."""
    store = LocalStore(workdir / "store")
    evidence_bytes = canonical_json(_evidence_doc())
    evidence_cid = store.put_block(evidence_bytes, pin=True)
    evidence_digest = hashlib.sha256(evidence_bytes).hexdigest()
    record = _record("bafkreimanifest1")
    record_cid = publish_record(store, record)
    with open_database(url) as db, db.write() as s:
        s.add(IndexMeta(id=1, chain_id=31337, protocol="0x" + "44" * 20, start_block=0, next_block=100))
        s.add(Run(run_id=RUN, coordinator="0x" + "99" * 20, base_manifest_digest="00" * 32, max_staleness=2,
                  attestation_quorum=1, slash_fraction_bps=5000, verifier_bounty_bps=2000, check_probability_ppm=100_000,
                  challenge_window_blocks=2000, reward_per_version=10 * TOKEN, reward_pool=19_980 * TOKEN,
                  funded_total=20_000 * TOKEN, latest_version=2, created_block=5, created_tx=_tx(5)))
        for v in range(3):
            s.add(Version(run_id=RUN, version=v, manifest_digest=f"{v + 100:064x}",
                          record_digest=record.digest.hex() if v == 1 else (None if v == 0 else "77" * 32),
                          published_block=20 + v, published_tx=_tx(20 + v), settled=v > 0, settled_block=None,
                          settled_accounts=None, settled_total=None, manifest_cid=f"bafkreimanifest{v}",
                          manifest_status=FetchStatus.AVAILABLE, manifest_attempts=1, manifest_error=None,
                          parent_cid=None if v == 0 else f"bafkreimanifest{v - 1}", num_shards=2))
        for shard in range(2):
            s.add(Shard(run_id=RUN, version=1, shard=shard, cid=f"bafkreishard{shard}", sha256="aa" * 32, size=1000,
                        parameters=3, elements=250))
        s.add(_participant(HONEST, 1, commits=1 + EXTRA_COMMITS, checks_passed=1, trust_alpha=2.0,
                           rewards_credited=10 * TOKEN))
        s.add(_participant(FORGER, 1, commits=1, checks_failed=1, jailed=True, jailed_commit_id=2,
                           staked=250 * TOKEN, slashed_total=250 * TOKEN, trust_beta=4.0))
        s.add(_participant(VERIFIER, 2, bounties_credited=50 * TOKEN, claimed=5 * TOKEN))
        s.add(_commit(1, HONEST, 0, pass_count=1))
        s.add(_commit(2, FORGER, 1, fail_count=1, slashed=True))
        for i in range(EXTRA_COMMITS):
            s.add(_commit(3 + i, HONEST, 2))
        s.add(Header(commit_id=1, status=FetchStatus.AVAILABLE, attempts=1, error=None, task="arithmetic",
                     engine="hf-torch", shards=[0, 1], total_bytes=9000))
        s.add(Header(commit_id=2, status=FetchStatus.AVAILABLE, attempts=1, error=None, task="arithmetic"))
        s.add(Verdict(commit_id=1, verifier=VERIFIER, ok=True, evidence_digest="88" * 32, pass_count=1, fail_count=0,
                      block_number=30, tx_hash=_tx(30)))
        s.add(Verdict(commit_id=2, verifier=VERIFIER, ok=False, evidence_digest=evidence_digest, pass_count=0,
                      fail_count=1, block_number=31, tx_hash=_tx(31)))
        s.add(Slash(commit_id=2, worker=FORGER, amount=250 * TOKEN, bounty=50 * TOKEN, burned=200 * TOKEN,
                    block_number=32, tx_hash=_tx(32)))
        s.add(Reward(tx_hash=_tx(40), log_index=0, kind=RewardKind.REWARD, account=HONEST, amount=10 * TOKEN,
                     run_id=RUN, version=1, commit_id=None, block_number=40))
        s.add(Reward(tx_hash=_tx(41), log_index=0, kind=RewardKind.BOUNTY, account=VERIFIER, amount=50 * TOKEN,
                     run_id=RUN, version=None, commit_id=2, block_number=41))
        s.add(Reward(tx_hash=_tx(42), log_index=0, kind=RewardKind.CLAIM, account=VERIFIER, amount=5 * TOKEN,
                     run_id=RUN, version=None, commit_id=None, block_number=42))
        s.add(Contribution(commit_id=1, run_id=RUN, worker=HONEST, version=0, status=ContributionStatus.ACCEPTED,
                           weight=0.25, staleness=0, trust=0.25, aggregated_version=1))
        s.add(Contribution(commit_id=2, run_id=RUN, worker=FORGER, version=1, status=ContributionStatus.REJECTED,
                           reason_code=RejectionCode.WRONG_REWARDS, reason="rewards: 32 of 32 differ",
                           aggregated_version=1))
        s.add(Metric(run_id=RUN, version=1, accepted=1, rejected=1, mean_reward=0.5, sampled_tokens=120,
                     wall_seconds=2.0, mean_staleness=0.0, aggregation_rule="clip-mix-trim"))
        s.add(Metric(run_id=RUN, version=2, accepted=0, rejected=0, mean_reward=float("nan"), sampled_tokens=0,
                     wall_seconds=1.0))
        for v, acc in ((0, 0.1), (2, 0.3)):
            s.add(Eval(run_id=RUN, version=v, task="arithmetic", split="eval", n=10, correct=int(acc * 10),
                       accuracy=acc))
    audit = workdir / "audit.json"
    audit.write_text(json.dumps({"ok": False, "versions": [
        {"run_id": RUN, "version": 1, "ok": True, "checks": [{"name": "manifest", "ok": True, "detail": ""}]},
        {"run_id": RUN, "version": 2, "ok": False, "checks": [{"name": "manifest", "ok": False, "detail": "differs"}]},
    ]}))
    return SimpleNamespace(url=url, store=store, run=RUN, honest=HONEST, forger=FORGER, verifier=VERIFIER,
                           evidence_digest=evidence_digest, evidence_cid=evidence_cid, record_cid=record_cid,
                           audit=audit, commits=2 + EXTRA_COMMITS)
