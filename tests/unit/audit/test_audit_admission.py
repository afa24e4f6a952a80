"""The audit fails a version whose record folded a contribution an honest coordinator rejects.

A tiny random Llama in a local store and the fake chain of `audit_fakes.py`. Two workers make real
signed contributions with `krill.protocol.work` (the values they sign are seeded random gradients on
the public masks, as in the integration fixture: a random model earns no reward). Versions 1..3 are
honest and shared; each test forks the chain and publishes its own version 4, folded exactly as
its record says, with one contribution that breaks one admission rule of `coordinator/ingest.py`.
The audit must name that rule's check, and only it (and what cannot run after it).
"""

from __future__ import annotations

import hashlib
from contextlib import nullcontext
from unittest import mock

import numpy as np
import pytest
import torch
from audit_fakes import CHAIN_ID, CONTRACT, COORDINATOR, FakeChain
from nacl.signing import SigningKey

from krill.audit import AuditSource, audit_versions
from krill.model.build import TinyModelSpec, build_tiny_model
from krill.model.publish import publish_model_dir
from krill.payload.contribution import ExpectedContext, validate_contribution
from krill.payload.limits import PayloadLimits
from krill.protocol.policy import build_model, load_tokenizer
from krill.protocol.record import AcceptedEntry
from krill.protocol.rewards import reward_split
from krill.protocol.spec import RolloutSpec, RunSpec, VersionSpec, publish_spec
from krill.protocol.state import load_chain_version
from krill.protocol.step import Submission, fold_version, publish_version_content
from krill.protocol.work import Identity, Learned, learn, package, sample
from krill.rl.compression import CompressionConfig
from krill.rl.engine.hf import HFEngine
from krill.rl.staleness import staleness_weight
from krill.rl.tasks import get_task
from krill.store.local import LocalStore

TINY = TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64)
TRUST = 0.25  # a new worker's trust, prior 1 / (1 + 3): no verdict in these worlds


class Run:
    """The store, spec and workers of the run, and the coordinator's actions on a given fake chain."""

    def __init__(self, root):
        _, tokenizer = build_tiny_model(seed=3, spec=TINY, directory=root / "model")
        self.store = LocalStore(root / "store")
        manifest, manifest_cid = publish_model_dir(self.store, root / "model", num_shards=2)
        self.spec = RunSpec(name="audit-unit", seed=7, task="arithmetic", base_manifest_cid=manifest_cid,
                            num_shards=2, rollout=RolloutSpec(prompts_per_contribution=2, group_size=2),
                            version=VersionSpec(contributions=2),
                            compression=CompressionConfig(density=0.25, dtype="int8", dense_versions=1),
                            limits=PayloadLimits(vocab_size=tokenizer.vocab_size + 8))
        publish_spec(self.store, self.spec)
        self.chain = FakeChain(self.spec.run_id)
        self.chain.publish(0, hashlib.sha256(manifest.canonical_bytes()).digest(), b"\0" * 32)
        self.workers = []
        for i in range(2):
            key = SigningKey(bytes([i + 21]) * 32)
            who = Identity(CHAIN_ID, CONTRACT, "0x" + f"{i + 1:02x}" * 20, key)
            self.chain.keys[who.worker] = bytes(key.verify_key)
            self.workers.append(who)
        self.task, self.rng = get_task(self.spec.task), np.random.default_rng(0)
        self.next_nonce = {w.worker: 0 for w in self.workers}

    def state(self, chain, version):
        return load_chain_version(chain, self.store, self.spec, version)

    def contribute(self, chain, who, behaviour, learner, *, nonce=None, commit_nonce=None, tamper=None, codec=None):
        """Sample at `behaviour`, sign gradients at `learner`, upload and commit; (commit id, header, files)."""
        b, v = self.state(chain, behaviour), self.state(chain, learner)
        tok = load_tokenizer(b)
        if nonce is None:
            nonce = self.next_nonce[who.worker]
            self.next_nonce[who.worker] += 1
        engine = HFEngine(build_model(b), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, version=behaviour)
        sampled = sample(self.spec, self.task, tok, engine, who.worker, nonce + (1000 if tamper == "assignment" else 0))
        sampled.nonce = nonce  # claims `nonce`; with tamper="assignment" the prompts are another nonce's
        if tamper == "rewards":
            sampled.rewards = 1.0 - sampled.rewards
        learned = learn(self.spec, build_model(v), v, sampled, [0, 1], tok.pad_token_id)
        values = {s: {n: (self.rng.standard_normal(len(x)) * 1e-2).astype(np.float32) for n, x in vals.items()}
                  for s, vals in learned.values.items()}
        with mock.patch("krill.protocol.work.run_codec", return_value=codec) if codec else nullcontext():
            header, files = package(self.spec, self.task, who, v, sampled, Learned(learner, values, 0.0))
        for data in files.values():
            self.store.add(data, pin=True)
        self.store.put_block(header.encode(), pin=True)
        commit_id = chain.commit(who.worker, learner, nonce if commit_nonce is None else commit_nonce, header.digest)
        return commit_id, header, files

    def publish(self, chain, version, contributions, record_weight=None, rejected=(), record_tokens=None):
        """Fold `contributions` as their record says (bar `record_weight`, the weight it claims, and
        `record_tokens`, the completion tokens) and publish."""
        parent = self.state(chain, version - 1)
        accepted, submissions = [], []
        for commit_id, header, files in contributions:
            learner = self.state(chain, header.model_version)
            masks = learner.masks()
            lengths = {s: {n: int(masks[n].numel()) for n in learner.manifest.shard_names(s)} for s in (0, 1)}
            c = validate_contribution(header.encode(), files, self.spec.limits, ExpectedContext(digest=header.digest),
                                      lengths)
            staleness = version - 1 - header.model_version
            weight = TRUST * staleness_weight(staleness, self.spec.staleness)
            submissions.append(Submission(commit_id, weight, header.model_version,
                                          {s: g.values for s, g in c.gradients.items()}))
            accepted.append(AcceptedEntry(commit_id=commit_id, worker=header.worker, header_digest=header.digest.hex(),
                                          model_version=header.model_version,
                                          behaviour_version=header.behaviour_version, staleness=staleness,
                                          trust=repr(TRUST), weight=record_weight or repr(weight),
                                          shards=sorted(c.gradients), mean_reward=repr(float(c.rollouts.rewards.mean())),
                                          tokens=record_tokens or int((np.diff(c.rollouts.offsets)
                                                                       - c.rollouts.prompt_lengths).sum())))
        learners = {v: self.state(chain, v) for v in {s.model_version for s in submissions}}
        results = fold_version(self.spec, parent, submissions, learners)
        content = publish_version_content(self.store, self.spec, parent, results, accepted, list(rejected), "count")
        chain.publish(version, hashlib.sha256(content.manifest.canonical_bytes()).digest(), content.record.digest)

    def audit(self, chain, version):
        (report,) = audit_versions(AuditSource(chain, self.store, self.spec), [version])
        return report


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = Run(tmp_path_factory.mktemp("audit-admission"))
        w1, w2 = r.workers
        r.publish(r.chain, 1, [r.contribute(r.chain, w1, 0, 0), r.contribute(r.chain, w2, 0, 0)])
        r.publish(r.chain, 2, [r.contribute(r.chain, w1, 1, 1)])
        r.publish(r.chain, 3, [r.contribute(r.chain, w2, 2, 2)])
        yield r
    finally:
        torch.set_num_threads(threads)


def _failed(report):
    return {c.name: c.detail for c in report.failures}


def test_honest_versions_pass_every_admission_check(run):
    source = AuditSource(run.chain, run.store, run.spec)
    for report in audit_versions(source, [1, 2, 3]):
        assert report.ok, _failed(report)
    names = {c.name for c in report.checks}
    entry = next(n.removesuffix(" on-chain") for n in names if n.endswith(" on-chain"))
    assert {f"{entry} {row}" for row in ("nonce", "rollout staleness", "payload", "figures", "assignment",
                                         "rewards")} <= names


def test_a_header_naming_another_nonce_than_its_commit_fails_the_payload(run):
    chain = run.chain.fork()
    cid, *_ = contribution = run.contribute(chain, run.workers[0], 3, 3, nonce=50, commit_nonce=51)
    run.publish(chain, 4, [contribution])
    failed = _failed(run.audit(chain, 4))
    assert "(header.nonce)" in failed[f"commit {cid} payload"], failed
    assert set(failed) == {f"commit {cid} payload", f"commit {cid} assignment", f"commit {cid} rewards", "recompute"}
    assert failed[f"commit {cid} rewards"] == "not run: the payload is not valid"


@pytest.mark.parametrize("codec, field", [({"codec": "fp16", "block_size": 256}, "codec"),
                                          ({"codec": "int8-block", "block_size": 64}, "block_size")])
def test_gradients_in_a_codec_the_run_does_not_use_fail_the_payload(run, codec, field):
    chain = run.chain.fork()
    cid, *_ = contribution = run.contribute(chain, run.workers[0], 3, 3, codec=codec)
    run.publish(chain, 4, [contribution])
    failed = _failed(run.audit(chain, 4))
    assert field in failed[f"commit {cid} payload"], failed
    assert "recompute" in failed


def test_rollouts_older_than_s_max_fail_the_rollout_staleness_check(run):
    chain = run.chain.fork()
    cid, *_ = contribution = run.contribute(chain, run.workers[0], 0, 3)  # sampled 3 > S_max = 2 versions back
    run.publish(chain, 4, [contribution])
    failed = _failed(run.audit(chain, 4))
    assert list(failed) == [f"commit {cid} rollout staleness"], failed
    assert "3 behind the learner version (S_max = 2)" in failed[f"commit {cid} rollout staleness"]


def test_a_nonce_the_worker_committed_before_fails_the_nonce_check(run):
    chain = run.chain.fork()
    who = run.workers[1]
    earlier = chain.commit(who.worker, 2, 77, b"\7" * 32)  # never folded (say rejected): the chain still has it
    cid, *_ = contribution = run.contribute(chain, who, 3, 3, nonce=77)
    run.publish(chain, 4, [contribution])
    failed = _failed(run.audit(chain, 4))
    assert list(failed) == [f"commit {cid} nonce"], failed
    assert f"already committed by this worker in commit {earlier}" in failed[f"commit {cid} nonce"]


def test_forged_rewards_fail_the_rewards_check(run):
    chain = run.chain.fork()
    cid, *_ = contribution = run.contribute(chain, run.workers[0], 3, 3, tamper="rewards")
    run.publish(chain, 4, [contribution])
    failed = _failed(run.audit(chain, 4))
    assert list(failed) == [f"commit {cid} rewards"], failed
    assert "rewards differ from the task's" in failed[f"commit {cid} rewards"]


def test_prompts_not_assigned_to_the_worker_fail_the_assignment_check(run):
    chain = run.chain.fork()
    cid, *_ = contribution = run.contribute(chain, run.workers[0], 3, 3, tamper="assignment")
    run.publish(chain, 4, [contribution])
    failed = _failed(run.audit(chain, 4))
    assert f"commit {cid} assignment" in failed and set(failed) <= {f"commit {cid} assignment", f"commit {cid} rewards"}
    assert "do not start with their assigned prompt" in failed[f"commit {cid} assignment"]


@pytest.mark.parametrize("weight", ["0.0", "-1.0"])
def test_a_weight_that_cannot_be_folded_fails_checks_without_stopping_the_audit(run, weight):
    chain = run.chain.fork()
    cid, *_ = contribution = run.contribute(chain, run.workers[0], 3, 3)
    run.publish(chain, 4, [contribution], record_weight=weight)
    failed = _failed(run.audit(chain, 4))
    assert set(failed) == {f"commit {cid} weight", "recompute"}, failed
    assert "is not a finite positive number" in failed[f"commit {cid} weight"]
    assert failed["recompute"] == "not attempted: an input above failed"


def test_completion_tokens_the_rollouts_do_not_have_fail_the_figures_check(run):
    """The release's contributors table sums the records' tokens: the audit passed any count."""
    chain = run.chain.fork()
    cid, *_ = contribution = run.contribute(chain, run.workers[0], 3, 3)
    run.publish(chain, 4, [contribution], record_tokens=10**12)
    failed = _failed(run.audit(chain, 4))
    assert list(failed) == [f"commit {cid} figures"], failed
    assert "the record says 1000000000000 completion tokens, the rollouts have" in failed[f"commit {cid} figures"]


def test_a_settlement_by_the_record_keeps_a_version_clean_and_paying_the_coordinator_fails_only_it(run):
    chain = run.chain.fork()
    per_version = chain.params.reward_per_version
    chain.fund(10 * per_version)
    source = AuditSource(chain, run.store, run.spec)
    chain.settle(1, reward_split(per_version, [{"worker": e.worker, "weight": e.weight}
                                               for e in source.record(1).accepted]))
    chain.settle(2, [(COORDINATOR, per_version)])  # the run's coordinator pays itself version 2's reward
    first, second, third = audit_versions(AuditSource(chain, run.store, run.spec), [1, 2, 3])
    assert first.ok and third.ok, (_failed(first), _failed(third))  # version 3: not settled, not overdue yet
    assert list(_failed(second)) == ["settlement"]
    assert f"{COORDINATOR} was paid {per_version}, the record owes it nothing" in _failed(second)["settlement"]


@pytest.mark.parametrize(("reason", "tamper", "stands"), [
    ("bad_signature", None, False),
    ("malformed_payload", None, False),
    ("wrong_rewards", None, False),
    ("wrong_assignment", None, False),
    ("wrong_rewards", "rewards", True),
    ("wrong_assignment", "assignment", True),
    ("stale", None, False),  # learner version 3 is 0 behind version 4's parent
    ("jailed", None, False),
    ("slashed", None, False),
    ("below_trust_floor", None, False),
    ("unavailable", None, True),  # not judged: the audit cannot see when content appeared
    ("no_served_shard", None, True),  # not judged: which shards a coordinator serves is its setting
])
def test_a_rejection_the_public_data_contradicts_fails_the_entries_check(run, reason, tamper, stands):
    """A coordinator could cut an honest commit out of the fold and the reward under a false reason: the
    audit used to check only that a rejected commit exists and is the named worker's."""
    from krill.protocol.record import RejectedEntry

    chain = run.chain.fork()
    w1, w2 = run.workers
    cid, *_ = run.contribute(chain, w2, 3, 3, tamper=tamper)
    rejected = [RejectedEntry(commit_id=cid, worker=w2.worker, reason_code=reason, reason="says the coordinator")
                .model_dump(mode="json")]
    run.publish(chain, 4, [run.contribute(chain, w1, 3, 3)], rejected=rejected)
    failed = _failed(run.audit(chain, 4))
    if stands:
        assert "entries" not in failed, failed
    else:
        assert f"commit {cid} is rejected as {reason}, but" in failed["entries"], failed


@pytest.mark.parametrize("reason", ["stale", "jailed", "slashed", "below_trust_floor"])
def test_a_rejection_the_chain_bears_out_stands(run, reason):
    """Each standing reason, made true on the chain before the version's publication, passes."""
    from krill.protocol.record import RejectedEntry

    chain = run.chain.fork()
    w1, w2 = run.workers
    if reason == "stale":  # learner version 0: 3 behind version 4's parent, over S_max = 2
        cid, *_ = run.contribute(chain, w2, 0, 0)
    else:
        cid, *_ = run.contribute(chain, w2, 3, 3)
    if reason in ("jailed", "slashed"):
        chain.slash(cid, block=chain.commits[cid].commit_block + 1)
    if reason == "below_trust_floor":  # prior 1 / (1 + 3 + f) < the floor 0.05 from f = 17 failing verdicts
        for _ in range(17):
            chain.attest(cid, ok=False)
    rejected = [RejectedEntry(commit_id=cid, worker=w2.worker, reason_code=reason, reason="says the coordinator")
                .model_dump(mode="json")]
    run.publish(chain, 4, [run.contribute(chain, w1, 3, 3)], rejected=rejected)
    failed = _failed(run.audit(chain, 4))
    assert "entries" not in failed, failed


def test_a_jail_or_slash_after_the_publication_does_not_bear_out_a_rejection(run):
    from krill.protocol.record import RejectedEntry

    chain = run.chain.fork()
    w1, w2 = run.workers
    cid, *_ = run.contribute(chain, w2, 3, 3)
    rejected = [RejectedEntry(commit_id=cid, worker=w2.worker, reason_code=reason, reason="")
                .model_dump(mode="json") for reason in ("jailed",)]
    run.publish(chain, 4, [run.contribute(chain, w1, 3, 3)], rejected=rejected)
    chain.slash(cid, block=chain.versions[4].published_block + 1)  # jailed only after version 4
    detail = _failed(run.audit(chain, 4))["entries"]
    assert f"commit {cid} is rejected as jailed, but the worker was not jailed before version 4" in detail
    assert f"its jail came at block {chain.versions[4].published_block + 1}" in detail
