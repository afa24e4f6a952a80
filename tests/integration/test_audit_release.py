"""`krill audit` and `krill release` against a real Anvil and a local store.

The module fixture plays a tiny run by hand, acting as the coordinator: two staked workers make
real signed contributions with `krill.protocol.work` (a random tiny model earns no reward, so the
gradients they sign are seeded random values on the public masks: the fold then moves weights),
upload and commit them; the test folds them with `fold_version`, publishes the content and calls
`publishVersion`, and settles rewards by the record (`reward_split`, as the coordinator does). Versions:
  1  honest, both workers fresh;
  2  honest, one worker's gradient computed at version 0 (staleness 1);
  3  the record claims weights other than those folded;
  4  the published manifest does not match the fold (a shard 1 tensor nudged after folding);
  5  the record's weight of one entry is not trust x staleness weight (but is the weight folded);
  6  honest, but one contribution's gradient file never reached the store (the audit cannot recompute).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from nacl.signing import SigningKey

from krill.chain.anvil import AnvilProcess
from krill.chain.client import KrillChain
from krill.chain.deploy import TOKEN, deploy, fund_accounts
from krill.chain.events import Committed
from krill.chain.rpc import connect_http, dev_accounts
from krill.chain.types import Role, RunParams
from krill.commands.audit_cmd import audit
from krill.commands.release_cmd import release
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
TRUST = 0.25


class Run:
    """The chain, store and run of the fixture, and the test's coordinator actions."""

    def __init__(self, tmp, node):
        self.w3 = connect_http(node.rpc_url)
        self.admin, *workers = dev_accounts(3)
        self.deployment = deploy(self.w3, self.admin)
        fund_accounts(self.w3, self.deployment, self.admin, [a.address for a in (self.admin, *workers)], 10_000 * TOKEN)
        self.chain = KrillChain(self.w3, self.deployment.protocol, self.admin)
        self.store_path = tmp / "store"
        self.store = LocalStore(self.store_path)
        _, tokenizer = build_tiny_model(seed=3, spec=TINY, directory=tmp / "model")
        manifest, manifest_cid = publish_model_dir(self.store, tmp / "model", num_shards=2)
        self.spec = RunSpec(name="audit-test", seed=7, task="arithmetic", base_manifest_cid=manifest_cid, num_shards=2,
                            rollout=RolloutSpec(prompts_per_contribution=4, group_size=4),
                            version=VersionSpec(contributions=2), compression=CompressionConfig(density=0.25, dtype="int8", dense_versions=1),
                            limits=PayloadLimits(vocab_size=tokenizer.vocab_size + 8))
        self.run_id = publish_spec(self.store, self.spec)
        c = self.spec.chain
        self.chain.create_run(self.run_id, hashlib.sha256(manifest.canonical_bytes()).digest(), RunParams(
            coordinator=self.admin.address, max_staleness=c.max_staleness, attestation_quorum=c.attestation_quorum,
            slash_fraction_bps=c.slash_fraction_bps, verifier_bounty_bps=c.verifier_bounty_bps,
            check_probability_ppm=c.check_probability_ppm, challenge_window_blocks=c.challenge_window_blocks,
            reward_per_version=c.reward_per_version))
        self.chain.token.approve(self.chain.address, 1_000 * TOKEN)
        self.chain.fund_rewards(self.run_id, 1_000 * TOKEN)
        self.accounts, self.workers = {}, []
        for i, account in enumerate(workers):
            key = SigningKey(bytes([i + 11]) * 32)
            client = self.chain.as_account(account)
            client.approve_stake(500 * TOKEN)
            client.stake(Role.WORKER, 500 * TOKEN, bytes(key.verify_key))
            who = Identity(self.deployment.chain_id, self.deployment.protocol, account.address.lower(), key)
            self.accounts[who.worker] = client
            self.workers.append(who)
        self.nonces = {w.worker: 0 for w in self.workers}
        self.folded_states = {}  # version -> shard -> the optimizer state its fold gave
        self.rng = np.random.default_rng(0)
        self.task = get_task(self.spec.task)

    def state(self, version):
        state = load_chain_version(self.chain, self.store, self.spec, version)
        for shard, blob in self.folded_states.get(version, {}).items():  # as a coordinator keeps them
            state.preload_optimizer_state(shard, blob)
        return state

    def contribute(self, who, behaviour, learner, withhold=None):
        """Sample at `behaviour`, sign gradients at `learner`, upload (all but `withhold`) and commit."""
        b, v = self.state(behaviour), self.state(learner)
        tok = load_tokenizer(b)
        engine = HFEngine(build_model(b), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, version=behaviour)
        nonce = self.nonces[who.worker]
        self.nonces[who.worker] += 1
        sampled = sample(self.spec, self.task, tok, engine, who.worker, nonce)
        learned = learn(self.spec, build_model(v), v, sampled, [0, 1], tok.pad_token_id)
        values = {s: {n: (self.rng.standard_normal(len(x)) * 1e-2).astype(np.float32) for n, x in vals.items()}
                  for s, vals in learned.values.items()}
        header, files = package(self.spec, self.task, who, v, sampled, Learned(learner, values, 0.0))
        for name, data in files.items():
            if name != withhold:
                self.store.add(data, pin=True)
        self.store.put_block(header.encode(), pin=True)
        receipt = self.accounts[who.worker].commit(self.run_id, learner, nonce, header.digest)
        return receipt.event(Committed).commit_id, header, files

    def publish(self, version, contributions, tamper=None, keep_states=True):
        """Fold `contributions` into `version` as the coordinator would (or with one `tamper`), publish, settle."""
        parent = self.state(version - 1)
        accepted, submissions = [], []
        for i, (commit_id, header, files) in enumerate(contributions):
            learner = self.state(header.model_version)
            masks = learner.masks()
            lengths = {s: {n: int(masks[n].numel()) for n in learner.manifest.shard_names(s)} for s in (0, 1)}
            c = validate_contribution(header.encode(), files, self.spec.limits,
                                      ExpectedContext(digest=header.digest), lengths)
            staleness = version - 1 - header.model_version
            weight = TRUST * staleness_weight(staleness, self.spec.staleness)
            claimed = weight
            if tamper == "weights" and i == 0:
                weight *= 3.0  # folded with one weight, recorded with another
            if tamper == "inconsistent-weight" and i == 0:
                weight = claimed = 2 * weight  # folded with the recorded weight, which the spec does not allow
            submissions.append(Submission(commit_id, weight, header.model_version,
                                          {s: g.values for s, g in c.gradients.items()}))
            accepted.append(AcceptedEntry(commit_id=commit_id, worker=header.worker, header_digest=header.digest.hex(),
                                          model_version=header.model_version,
                                          behaviour_version=header.behaviour_version, staleness=staleness,
                                          trust=repr(TRUST), weight=repr(claimed), shards=sorted(c.gradients),
                                          mean_reward=repr(float(c.rollouts.rewards.mean())),
                                          tokens=int((np.diff(c.rollouts.offsets) - c.rollouts.prompt_lengths).sum())))
        learners = {v: self.state(v) for v in {s.model_version for s in submissions}}
        results = fold_version(self.spec, parent, submissions, learners)
        if tamper == "manifest":
            name = parent.manifest.shard_names(1)[0]
            nudged = dict(results[1].tensors)
            nudged[name] = nudged[name] + 1e-3
            results[1] = dataclasses.replace(results[1], tensors=nudged)
        manifest, _, record, *_ = publish_version_content(self.store, self.spec, parent, results, accepted, [], "count",
                                                          keep_states=keep_states)
        self.folded_states[version] = {r.shard: r.optimizer_state for r in results if r.submissions}
        if tamper == "masks":  # well-formed masks (right sizes and counts) that the momentum does not give
            from krill.protocol.mask_blob import encode_masks
            from krill.protocol.record import publish_record
            from krill.rl.compression import shared_masks

            shapes = parent.shapes()
            blob = encode_masks(shared_masks(shapes, None, self.spec.compression, self.spec.run_id.hex(), version),
                                shapes, self.spec.run_id.hex(), version)
            record = record.model_copy(update={"masks_cid": self.store.add(blob, pin=True),
                                               "masks_sha256": hashlib.sha256(blob).hexdigest()})
            publish_record(self.store, record)
        self.chain.publish_version(self.run_id, version, hashlib.sha256(manifest.canonical_bytes()).digest(),
                                   record.digest)
        split = reward_split(self.spec.chain.reward_per_version, [a.model_dump() for a in accepted])
        self.chain.settle(self.run_id, version, [a for a, _ in split], [n for _, n in split])

    def overrides(self):
        return ["chain.rpc_url=" + f"http://127.0.0.1:{self.w3.provider.endpoint_uri.rsplit(':', 1)[1]}",
                f"chain.protocol_address={self.deployment.protocol}",
                f"chain.deploy_block={self.deployment.block_number}", "store.type=local",
                f"store.path={self.store_path}", f"run.id={self.run_id.hex()}"]

    def invoke(self, command, args):
        return CliRunner().invoke(command, args, obj={"config_path": None, "overrides": tuple(self.overrides())})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.set_num_threads(1)
    node = AnvilProcess.start()
    try:
        r = Run(tmp_path_factory.mktemp("audit-run"), node)
        w1, w2 = r.workers
        r.publish(1, [r.contribute(w1, 0, 0), r.contribute(w2, 0, 0)], keep_states=False)  # replayed by audits
        stale = r.contribute(w2, 0, 0)  # committed at version 0 after version 1 is out
        r.publish(2, [r.contribute(w1, 1, 1), stale])
        r.publish(3, [r.contribute(w1, 2, 2), r.contribute(w2, 2, 2)], tamper="weights")
        r.publish(4, [r.contribute(w1, 3, 3), r.contribute(w2, 3, 3)], tamper="manifest")
        r.publish(5, [r.contribute(w1, 4, 4), r.contribute(w2, 4, 4)], tamper="inconsistent-weight")
        r.publish(6, [r.contribute(w1, 5, 5), r.contribute(w2, 5, 5, withhold="grad-1.safetensors")])
        r.publish(7, [r.contribute(w1, 6, 6), r.contribute(w2, 6, 6)], tamper="masks")
        yield r
    finally:
        node.stop()


def _audit(run, version):
    result = run.invoke(audit, ["--version", str(version), "--json"])
    return result.exit_code, json.loads(result.output)


def _failed(report):
    return sorted(c["name"] for c in report["checks"] if not c["ok"])


def test_audit_passes_for_honest_versions(run):
    for version in (1, 2):
        code, report = _audit(run, version)
        assert code == 0 and report["ok"], _failed(report)
        names = {c["name"] for c in report["checks"]}
        assert {"manifest digest", "manifest cid", "shard 0 weights", "shard 1 weights", "recompute"} <= names
        optimizer = next(c["detail"] for c in report["checks"] if c["name"] == "shard 0 optimizer")
        assert ("not stored at this version" in optimizer) == (version == 1), optimizer
        for entry in report["contributions"]:  # the coordinator's admission rules, from the real chain's events
            rows = {f"commit {entry['commit_id']} {row}" for row in ("nonce", "rollout staleness", "assignment", "rewards")}
            assert rows <= names
    stale = [e for e in report["contributions"] if e["staleness"] == 1]
    assert len(stale) == 1 and stale[0]["weight"] == TRUST / 2 and stale[0]["trust"] == TRUST


def test_audit_names_weights_the_record_did_not_fold(run):
    code, report = _audit(run, 3)
    assert code == 1 and not report["ok"]
    failed = _failed(report)
    assert "manifest digest" in failed and "manifest cid" in failed
    assert {"shard 0 weights", "shard 1 weights"} & set(failed)
    assert not [n for n in failed if n.startswith("commit")]  # every entry is consistent; the fold is not


def test_audit_names_a_manifest_that_does_not_match_the_fold(run):
    code, report = _audit(run, 4)
    assert code == 1
    assert _failed(report) == ["manifest cid", "manifest digest", "shard 1 weights"]


def test_audit_names_a_weight_the_spec_does_not_allow(run):
    code, report = _audit(run, 5)
    assert code == 1
    failed = _failed(report)
    assert len(failed) == 1 and failed[0].startswith("commit") and failed[0].endswith(" weight")
    detail = next(c["detail"] for c in report["checks"] if c["name"] == failed[0])
    assert "trust x staleness weight" in detail


def test_audit_fails_when_a_contribution_is_not_available(run):
    code, report = _audit(run, 6)
    assert code == 1
    failed = _failed(report)
    entry = failed[0].removesuffix(" assignment")
    assert failed == [f"{entry} assignment", f"{entry} payload", f"{entry} rewards", "recompute"], failed
    details = {c["name"]: c["detail"] for c in report["checks"]}
    assert "not available" in details[f"{entry} payload"]
    assert details[f"{entry} rewards"] == "not run: the payload is not valid"  # the cheap replay needs the payload


def test_audit_names_published_masks_the_momentum_does_not_give(run):
    code, report = _audit(run, 7)
    assert code == 1
    assert _failed(report) == ["masks"]
    detail = next(c["detail"] for c in report["checks"] if c["name"] == "masks")
    assert "the momentum gives" in detail
    _, honest = _audit(run, 2)
    assert next(c for c in honest["checks"] if c["name"] == "masks")["ok"]


def test_workers_read_published_masks_without_fetching_optimizer_states(run):
    from krill.protocol.state import load_chain_version

    class Counting:
        def __init__(self, store):
            self.store, self.cids = store, []

        def get(self, cid, **kw):
            self.cids.append(cid)
            return self.store.get(cid, **kw)

    store = Counting(run.store)
    state = load_chain_version(run.chain, store, run.spec, 2)
    masks = state.masks()
    states = {o.optimizer_state_cid for o in state.record.shards}
    assert state.record.masks_cid in store.cids and not states & set(store.cids)
    derived = load_chain_version(run.chain, run.store, run.spec, 2, masks_from_momentum=True).masks()
    assert all(torch.equal(masks[n], derived[n]) for n in derived)


def test_audit_all_prints_a_table_and_exits_1(run):
    result = run.invoke(audit, ["--all"])
    assert result.exit_code == 1
    assert "version 1: all checks match" in result.output and "version 2: all checks match" in result.output
    for version in (3, 4, 5, 6, 7):
        assert f"version {version}: " in result.output and "MISMATCH" in result.output
    data = json.loads(run.invoke(audit, ["--all", "--json"]).output)
    assert [v["ok"] for v in data["versions"]] == [True, True, False, False, False, False, False]
    for report in data["versions"]:  # every version is settled by its record, from a funded pool; none slashed
        rows = {c["name"]: c for c in report["checks"]}
        assert rows["settlement"]["ok"] and "credited to 2 accounts" in rows["settlement"]["detail"], rows["settlement"]
        assert rows["slashing"]["ok"], rows["slashing"]
    last = json.loads(run.invoke(audit, ["--last", "2", "--json"]).output)
    assert [v["version"] for v in last["versions"]] == [6, 7] and last["ok"] is False
    assert run.invoke(audit, ["--last", "2", "--all"]).exit_code == 2


def test_release_writes_a_loadable_model_with_a_card_and_a_deterministic_cid(run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from krill.release import read_archive

    args = ["--version", "2", "--eval-n", "16", "--k", "2", "--json"]
    first = run.invoke(release, [*args, "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    out = json.loads(first.output)
    second = json.loads(run.invoke(release, [*args, "--out", str(tmp_path / "b")]).output)
    assert out["cid"] == second["cid"] and out["evals"] == second["evals"]
    assert set(out["evals"]) >= {"base", "version"} and out["evals"]["version"]["n"] == 16
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a", local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "a", local_files_only=True)
    v2 = run.state(2).all_tensors()
    assert all(torch.equal(p, v2[n]) for n, p in model.state_dict().items() if n in v2)
    assert tokenizer("07+45=")["input_ids"]
    card = (tmp_path / "a" / "README.md").read_text()
    assert "| base (version 0) |" in card and "| version 2 |" in card and "pass@2" in card
    assert run.deployment.protocol in card and run.run_id.hex() in card and run.spec.base_manifest_cid in card
    for who in run.workers:
        assert f"`{who.worker}`" in card
    facts = json.loads((tmp_path / "a" / "krill-release.json").read_text())
    shares = {c["address"]: c["share"] for c in facts["contributors"]}
    rewards = {c["address"]: c["rewards"] for c in facts["contributors"]}
    w1, w2 = (w.worker for w in run.workers)
    assert sum(rewards.values()) == 2 * run.spec.chain.reward_per_version  # the split's remainders are paid too
    assert shares[w1] > shares[w2] > 0
    assert sorted(facts["provenance"]["record_cids"]) == ["1", "2"]
    folder, files = read_archive(run.store.get(out["cid"]))
    assert folder == "krill-audit-test-v2"
    assert files == {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    again = run.invoke(release, [*args, "--out", str(tmp_path / "a")])  # re-running into the same directory is fine
    assert again.exit_code == 0 and json.loads(again.output)["cid"] == out["cid"]
    (tmp_path / "a" / "model-00001-of-00002.safetensors").write_bytes(b"stale")
    refused = run.invoke(release, [*args, "--out", str(tmp_path / "a")])
    assert refused.exit_code != 0 and "model-00001-of-00002.safetensors" in str(refused.exception)


def _release(run, tmp_path, version, *extra):
    out = tmp_path / f"v{version}"
    result = run.invoke(release, ["--version", str(version), "--eval-n", "4", "--k", "1", *extra, "--out", str(out)])
    return result, out


@pytest.mark.slow
def test_release_audits_the_lineage_and_records_it(run, tmp_path):
    checks = sum(len(_audit(run, v)[1]["checks"]) for v in (1, 2))
    result, out = _release(run, tmp_path, 2, "--json")
    assert result.exit_code == 0, result.output
    expected = {"audited": True, "versions": [1, 2], "checks": checks, "not_audited": []}
    assert json.loads(result.output)["audit"] == expected
    assert json.loads((out / "krill-release.json").read_text())["audit"] == expected
    card = (out / "README.md").read_text()
    assert f"recomputed versions 1..2 from public data (chain and store) and all {checks} checks passed" in card
    assert "not audited" not in card.lower()
    plain, _ = _release(run, tmp_path / "plain", 2)
    assert plain.exit_code == 0, plain.output
    assert "audit version 1/2: all" in plain.output and f"audited versions 1..2: all {checks} checks passed" in plain.output


@pytest.mark.slow
def test_release_refuses_a_version_the_audit_fails_or_that_descends_from_one(run, tmp_path):
    pins = sorted(run.store.pins())
    _, report = _audit(run, 3)
    for version in (3, 4):  # 3 folds other weights than its record says; 4 descends from it (and is tampered too)
        result, out = _release(run, tmp_path, version, "--json")
        assert result.exit_code == 1, result.output
        from krill.release import ReleaseAuditError

        assert isinstance(result.exception, ReleaseAuditError), result.exception
        assert result.exception.version == 3 and list(result.exception.failed) == [c["name"] for c in report["checks"]
                                                                                  if not c["ok"]]
        message = str(result.exception)
        assert "\n" not in message and message.startswith("version 3") and "manifest digest" in message
        assert ("an ancestor of version 4" in message) == (version == 4), message
        assert not out.exists()  # nothing written ...
    assert sorted(run.store.pins()) == pins  # ... and nothing stored


@pytest.mark.slow
def test_unaudited_release_says_it_was_not_audited(run, tmp_path):
    result, out = _release(run, tmp_path, 4, "--unaudited", "--json")
    assert result.exit_code == 0, result.output
    expected = {"audited": False, "versions": [], "checks": 0, "not_audited": [1, 4]}
    assert json.loads(result.output)["audit"] == expected
    assert json.loads((out / "krill-release.json").read_text())["audit"] == expected
    card = (out / "README.md").read_text()
    assert "> **Not audited**: versions 1..4 were not checked with `krill audit`" in card
    assert "**Not audited.** This release was made with `--unaudited`" in card
    assert "checks passed" not in card and "Audited:" not in card


@pytest.mark.slow
def test_release_audit_last_audits_only_the_last_versions_and_says_which_were_not(run, tmp_path):
    checks = len(_audit(run, 2)[1]["checks"])
    result, out = _release(run, tmp_path, 2, "--audit-last", "1", "--json")
    assert result.exit_code == 0, result.output
    expected = {"audited": True, "versions": [2, 2], "checks": checks, "not_audited": [1, 1]}
    assert json.loads(result.output)["audit"] == expected
    assert json.loads((out / "krill-release.json").read_text())["audit"] == expected
    card = (out / "README.md").read_text()
    assert "> **Partly audited**: only versions 2..2 were checked" in card and "Versions 1..1 were **not** audited" in card
    plain, _ = _release(run, tmp_path / "plain", 2, "--audit-last", "1")
    assert plain.exit_code == 0, plain.output
    assert "audit version 1/" not in plain.output and "audit version 2/2: all" in plain.output
    assert f"audited versions 2..2: all {checks} checks passed" in plain.output
    assert "NOT AUDITED (--audit-last 1): versions 1..1 were not checked" in plain.output
    # Version 4 fails on its own; its tampered parent 3 is not recomputed, so 4 is the version named.
    refused, refused_out = _release(run, tmp_path, 4, "--audit-last", "1", "--json")
    assert refused.exit_code == 1 and refused.exception.version == 4, refused.output
    assert str(refused.exception).startswith("version 4 fails") and not refused_out.exists()
    both, _ = _release(run, tmp_path / "both", 2, "--audit-last", "1", "--unaudited")
    assert both.exit_code == 2 and "at most one of --audit-last N and --unaudited" in both.output
