"""Honest contributions produced and replayed in-process, with the protocol's own functions.

Design decisions:
- Nothing is re-implemented: a producer runs `sample` -> `learn` -> `package` exactly as a worker
  does; its bytes are decoded by `validate_contribution` as a verifier's are; the replayer runs
  `check_resample` and `check_gradient` (every shard, one check each) on the decoded payload and
  the figures they return are the statistics recorded. `teacher_logprob_diff` (the resample
  check's fallback comparison) is measured on every contribution too, so the table covers a run
  with `exact_resample = false`.
- Producer and replayer hold their own model instances built from the store (as two machines
  would), and run under their own torch thread counts (`torch.set_num_threads`, restored after).
- Conditions: prompts per contribution x gradient codec are run specs of their own (the codec is
  part of the spec, hence of the run id and every seed); for each, a short chain of real versions
  is built by folding the honest gradients (`fold_version`, AdamW), so later versions have
  momentum-steered masks; at version v >= 1 every other contribution samples at v - 1 (a stale,
  honest worker). Each contribution is produced under every producer thread count in turn and
  replayed under every replayer thread count.
- Size: rounds of one contribution per (spec, version, producer threads) are added until the
  plan's check count is reached, so every condition gets its share.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from krill.calibration.table import HonestCheck


@dataclass(frozen=True)
class Plan:
    """What to measure."""

    checks: int = 1000
    batches: tuple[int, ...] = (2, 4, 8, 16)
    codecs: tuple[str, ...] = ("fp16", "bf16", "int8")
    producer_threads: tuple[int, ...] = (1, 2)
    replayer_threads: tuple[int, ...] = (1, 2)
    versions: int = 3
    group_size: int = 8
    num_shards: int = 2
    density: float = 0.25
    seed: int = 0
    task: str | None = None  # default: the task the model was warm-started on, else "arithmetic"

    @property
    def checks_per_contribution(self) -> int:
        return len(self.replayer_threads) * (1 + self.num_shards)

    @property
    def rounds(self) -> int:
        per_round = (len(self.batches) * len(self.codecs) * self.versions * len(self.producer_threads)
                     * self.checks_per_contribution)
        return max(1, math.ceil(self.checks / per_round))

    @property
    def contributions(self) -> int:
        return len(self.batches) * len(self.codecs) * self.versions * len(self.producer_threads) * self.rounds


@contextmanager
def threads(n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def model_task(model_dir: Path) -> str:
    """The task a Krill base model was warm-started on (its build.json), else the default task."""
    info = Path(model_dir) / "build.json"
    if info.is_file():
        return json.loads(info.read_text())["recipe"]["task"]
    return "arithmetic"


@dataclass
class _Side:
    """The models one party holds, per version: behaviour engines and learners."""

    engines: dict[int, object] = field(default_factory=dict)
    learners: dict[int, object] = field(default_factory=dict)

    def engine(self, state, tok):
        from krill.protocol.policy import build_model
        from krill.rl.engine.hf import HFEngine

        if state.version not in self.engines:
            self.engines[state.version] = HFEngine(build_model(state), eos_id=tok.eos_token_id,
                                                   pad_id=tok.pad_token_id, version=state.version)
        return self.engines[state.version]

    def learner(self, state):
        from krill.protocol.policy import build_model

        if state.version not in self.learners:
            self.learners[state.version] = build_model(state)
        return self.learners[state.version]


class _SpecRun:
    """One run spec (batch size x codec): its versions, producer and replayer."""

    def __init__(self, store, manifest, manifest_cid: str, plan: Plan, task_name: str, batch: int, codec: str):
        from krill.payload.limits import PayloadLimits
        from krill.protocol.policy import load_tokenizer
        from krill.protocol.spec import RewardSpec, RolloutSpec, RunSpec, VersionSpec
        from krill.protocol.state import load_version
        from krill.rl.compression import CompressionConfig
        from krill.rl.tasks import get_task

        self.store, self.batch, self.codec = store, batch, codec
        self.spec = RunSpec(name=f"calibrate-{batch}-{codec}", seed=plan.seed, task=task_name,
                            base_manifest_cid=manifest_cid, num_shards=plan.num_shards,
                            rollout=RolloutSpec(prompts_per_contribution=batch, group_size=plan.group_size),
                            compression=CompressionConfig(density=plan.density, dtype=codec),
                            # no coordinator closes versions here: the class default, so the spec (its run
                            # id, hence every seed) does not move with a new run's version defaults
                            version=VersionSpec(),
                            # nothing is settled here: the class default for the same reason
                            reward=RewardSpec(),
                            limits=PayloadLimits(vocab_size=int(manifest.architecture["vocab_size"])))
        self.states = {0: load_version(store, self.spec, 0, hashlib.sha256(manifest.canonical_bytes()).digest(), None)}
        self.producer, self.replayer = _Side(), _Side()
        self.tok, self.task = load_tokenizer(self.states[0]), get_task(task_name)

    def produce(self, who, version: int, behaviour: int, nonce: int):
        """An honest worker's contribution: (header bytes, files)."""
        from krill.protocol.work import learn, package, sample

        behaviour_state, learner_state = self.states[behaviour], self.states[version]
        sampled = sample(self.spec, self.task, self.tok, self.producer.engine(behaviour_state, self.tok),
                         who.worker, nonce)
        shards = list(range(learner_state.manifest.num_shards))
        learned = learn(self.spec, self.producer.learner(learner_state), learner_state, sampled, shards,
                        self.tok.pad_token_id)
        header, files = package(self.spec, self.task, who, learner_state, sampled, learned)
        return header.encode(), files

    def decode(self, header_bytes: bytes, files: dict[str, bytes], version: int):
        from krill.payload.contribution import ExpectedContext, validate_contribution

        state = self.states[version]
        masks = state.masks()
        lengths = {s: {n: int(masks[n].numel()) for n in state.manifest.shard_names(s)}
                   for s in range(state.manifest.num_shards)}
        context = ExpectedContext(run_id=self.spec.run_id.hex(), model_version=version,
                                  manifest_cid=state.manifest_cid, digest=hashlib.sha256(header_bytes).digest())
        return validate_contribution(header_bytes, files, self.spec.limits, context, lengths)

    def replay(self, contribution, version: int, base: dict) -> list[HonestCheck]:
        """The verifier's resample and gradient checks (every shard), as records."""
        from krill.protocol.work import (
            check_gradient,
            check_resample,
            rollouts_from_payload,
            teacher_logprob_diff,
        )

        header, batch = contribution.header, contribution.rollouts
        behaviour = header.behaviour_version
        engine = self.replayer.engine(self.states[behaviour], self.tok)
        started = time.perf_counter()
        outcome = check_resample(self.spec, self.task, self.tok, header, batch, engine)
        teacher = teacher_logprob_diff(engine, rollouts_from_payload(batch), self.spec.rollout.temperature_milli / 1000)
        mismatches = outcome.figures["token_mismatches"]
        out = [HonestCheck(stage="resample", behaviour_version=behaviour, token_mismatches=mismatches,
                           max_logprob_diff=outcome.figures["max_logprob_diff"] if mismatches == 0 else 0.0,
                           teacher_logprob_diff=teacher, seconds=time.perf_counter() - started, **base)]
        learner = self.replayer.learner(self.states[version])
        for shard in sorted(contribution.gradients):
            started = time.perf_counter()
            g = check_gradient(self.spec, header, batch, contribution.gradients[shard].values, shard, learner,
                               self.states[version], self.tok.pad_token_id)
            out.append(HonestCheck(stage="gradient", behaviour_version=behaviour, shard=shard,
                                   cosine=g.figures["cosine"], rel_norm_diff=g.figures["rel_norm_diff"],
                                   zero_gradient="claimed_norm" not in g.figures,
                                   seconds=time.perf_counter() - started, **base))
        return out

    def fold(self, version: int, contributions: list) -> None:
        """Publish version + 1 from the honest contributions computed at `version` (weights 1/n)."""
        from krill.protocol.record import AcceptedEntry
        from krill.protocol.state import load_version
        from krill.protocol.step import Submission, fold_version, publish_version_content

        parent = self.states[version]
        subs, accepted = [], []
        for i, c in enumerate(contributions, start=1):
            h = c.header
            subs.append(Submission(commit_id=i, weight=1.0 / len(contributions), model_version=version,
                                   values={s: g.values for s, g in c.gradients.items()}))
            accepted.append(AcceptedEntry(commit_id=i, worker=h.worker, header_digest=h.digest.hex(),
                                          model_version=version, behaviour_version=h.behaviour_version,
                                          staleness=0, trust="1.0", weight=repr(1.0 / len(contributions)),
                                          shards=sorted(c.gradients), mean_reward=repr(float(c.rollouts.rewards.mean())),
                                          tokens=int(c.rollouts.n_tokens)))
        results = fold_version(self.spec, parent, subs, {version: parent})
        manifest, _, record, *_ = publish_version_content(self.store, self.spec, parent, results, accepted, [], "count")
        self.states[version + 1] = load_version(self.store, self.spec, version + 1,
                                                hashlib.sha256(manifest.canonical_bytes()).digest(), record.digest)


def _workers(n: int):
    from nacl.signing import SigningKey

    from krill.protocol.work import Identity

    return [Identity(31337, "0x" + "ca" * 20, "0x" + f"{i + 1:02x}" * 20, SigningKey(bytes([i + 1]) * 32))
            for i in range(n)]


def measure(model_dir: Path, plan: Plan = Plan(),
            progress: Callable[[int, int, list[HonestCheck]], None] | None = None) -> tuple[list[HonestCheck], dict]:
    """Run the plan on the model in `model_dir`; returns (records, run facts).

    `progress(contributions done, contributions planned, records so far)` after each contribution.
    """
    from krill.model.publish import publish_model_dir
    from krill.store.local import LocalStore

    started = time.perf_counter()
    task_name = plan.task or model_task(model_dir)
    records: list[HonestCheck] = []
    workers = _workers(2)
    done, nonce = 0, 0
    with tempfile.TemporaryDirectory(prefix="krill-calibrate-") as tmp:
        store = LocalStore(Path(tmp) / "store")
        manifest, manifest_cid = publish_model_dir(store, model_dir, num_shards=plan.num_shards)
        for batch in plan.batches:
            for codec in plan.codecs:
                run = _SpecRun(store, manifest, manifest_cid, plan, task_name, batch, codec)
                for version in range(plan.versions):
                    made = []
                    for r in range(plan.rounds):
                        for p_threads in plan.producer_threads:
                            who = workers[(r + p_threads) % len(workers)]
                            stale = version > 0 and (r + p_threads) % 2 == 1
                            behaviour = version - 1 if stale else version
                            with threads(p_threads):
                                header_bytes, files = run.produce(who, version, behaviour, nonce)
                            nonce += 1
                            contribution = run.decode(header_bytes, files, version)
                            made.append(contribution)
                            for r_threads in plan.replayer_threads:
                                base = dict(batch=batch, codec=codec, producer_threads=p_threads,
                                            replayer_threads=r_threads, version=version)
                                with threads(r_threads):
                                    records.extend(run.replay(contribution, version, base))
                            done += 1
                            if progress is not None:
                                progress(done, plan.contributions, records)
                    if version + 1 < plan.versions:
                        with threads(1):
                            run.fold(version, made)
    meta = {"model": str(model_dir), "task": task_name, "contributions": done,
            "seconds": round(time.perf_counter() - started, 1),
            "plan": {"checks": plan.checks, "batches": list(plan.batches), "codecs": list(plan.codecs),
                     "producer_threads": list(plan.producer_threads), "replayer_threads": list(plan.replayer_threads),
                     "versions": plan.versions, "group_size": plan.group_size, "num_shards": plan.num_shards,
                     "density": plan.density, "seed": plan.seed, "rounds": plan.rounds}}
    base_info = Path(model_dir) / "build.json"
    if base_info.is_file():
        meta["model_recipe_digest"] = json.loads(base_info.read_text()).get("recipe_digest")
    return records, meta
