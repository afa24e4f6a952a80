"""`krill train local`: the whole RL loop in one process, with simulated workers.

Design decisions:
- The same code paths as the distributed system, minus chain and store: N simulated workers
  each make a contribution (`krill.rl.contribution`) for their assigned prompts, sampling with
  an engine serving a possibly stale version (drawn deterministically up to `max_staleness`
  behind; the workers at one version are sampled in one batch, each with its own seeded
  generator, so each gets the rollouts it would draw alone), taking gradients at the current
  version (all workers in one batched pass that keeps their weight gradients apart,
  `krill.rl.grouped_gradient`), compressing them on the public mask; the
  coordinator step decompresses, weighs by staleness (of the rollouts here, as every simulated
  gradient is fresh; the protocol weighs by the gradient's learner version and only caps the
  rollouts' age at S_max, so a sample-ahead commit with fresh gradient weighs 1 there and
  1/(1 + s) here), aggregates each shard with the robust
  rule (clip, nearest-neighbour mixing, trimmed mean by default), applies per-shard AdamW, and
  publishes the next version (here: a snapshot kept for stale engines).
- Gradients are taken at the current version by default: stale rollouts, fresh gradient, the
  truncated importance weights correcting the drift. `stale_gradients` instead applies each
  version's contributions (sampled and differentiated at that version) one version later, as the
  protocol does when its coordinator folds what arrived while it published. With the demo's
  batch (`--workers 6 --prompts-per-worker 16 --max-staleness 1 --stale-gradients`, 300 eval
  prompts, 2026-12-04) greedy accuracy fell from 44.3% at version 80 to 24.7% at 140 (41.3% at
  200); with fresh gradients (`--max-staleness 0`) it went from 44.0% to 55.3%: the dip the
  pipelined demo showed. With stale rollouts as well (`--max-staleness 2`) it stalled at 38-41%
  from version 60 to 120 (fresh gradients: 38.7% -> 49.0%).
  The first version's batch is then applied twice (at versions 0 and 1): nothing older exists.
- The loss's temperature must be the sampling temperature and its KL weight 0, as in a run spec:
  the config refuses anything else rather than train on log-probs of another distribution or
  drop a KL term for want of a reference model.
- The public mask reference is the shard optimizer's first moment (momentum): smoother than one
  aggregate, and public because any auditor can recompute it from the aggregation records.
- Evaluation is greedy accuracy on the first `eval_n` prompts of the task's eval split, every
  `eval_every` versions and at the end; the clock for `--minutes` counts training only, and the
  summary reports both training and total wall time.
- One dense status line per version, the summary JSON and a PNG learning curve (matplotlib
  Agg backend, no display needed).
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from krill.rl.aggregate import AggregationRule, aggregate, default_rule, rule_over_run_default
from krill.rl.compression import CompressionConfig, decompress_values, densify, shared_masks
from krill.rl.contribution import (
    Contribution,
    SampledWork,
    contribution_prompts,
    make_contributions,
    sampling_seed,
)
from krill.rl.engine.base import Rollouts, SamplingParams
from krill.rl.engine.hf import HFEngine
from krill.rl.loss import LossConfig
from krill.rl.optimizer import AdamWConfig, ShardAdamW
from krill.rl.run_defaults import RUN_DEFAULTS
from krill.rl.staleness import StalenessConfig, staleness_weight


class LocalTrainConfig(BaseModel):
    """Everything `krill train local` varies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field("arithmetic", description="Task name (optionally name:level).")
    seed: int = Field(0, ge=0, description="Run seed: prompts, sampling, masks and staleness draws follow from it.")
    workers: int = Field(8, ge=1, le=256, description="Simulated workers per version.")
    prompts_per_worker: int = Field(4, ge=1, le=4096, description="Prompts each worker is assigned per version.")
    group_size: int = Field(8, ge=2, le=256, description="Samples per prompt (G).")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    num_shards: int = Field(2, ge=1, le=64, description="Contiguous parameter shards, each with its own optimizer.")
    versions: int | None = Field(None, ge=1, description="Stop after this many versions.")
    minutes: float | None = Field(10.0, gt=0.0, description="Stop after this much training time.")
    eval_n: int = Field(500, ge=1, description="Held-out prompts per evaluation.")
    eval_every: int = Field(20, ge=1, description="Evaluate every this many versions (and at the end).")
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optimizer: AdamWConfig = Field(default_factory=lambda: RUN_DEFAULTS["optimizer"])
    compression: CompressionConfig = Field(default_factory=lambda: RUN_DEFAULTS["compression"])
    rule: AggregationRule = Field(default_factory=default_rule)
    stale_gradients: bool = Field(False, description="Apply each version's contributions one version later "
                                                     "(gradients one version stale, as a pipelined protocol run).")

    @field_validator("rule", mode="before")
    @classmethod
    def _rule_over_run_default(cls, value):
        return rule_over_run_default(value)

    @model_validator(mode="after")
    def _room_for_stale_gradients(self) -> LocalTrainConfig:
        if self.stale_gradients and self.staleness.max_staleness < 1:
            raise ValueError("stale_gradients: needs staleness.max_staleness >= 1 (the gradients are one version old)")
        return self

    @model_validator(mode="after")
    def _loss_fits_the_sampler(self) -> LocalTrainConfig:
        # The run spec's rules (`krill.protocol.spec.RunSpec`): the learner's log-probs must be of the
        # distribution the rollouts were drawn from, or on-policy rollouts get ratios != 1 (at sampling
        # temperature 0.7 and the loss's default 1.0, 4-9% of on-policy tokens were clipped); and no
        # reference policy is kept, so a KL weight would be silently ignored.
        if abs(self.loss.temperature - self.temperature) > 1e-9:
            raise ValueError(f"loss.temperature {self.loss.temperature:g} must equal the sampling temperature "
                             f"{self.temperature:g}")
        if self.loss.kl_coef != 0.0:
            raise ValueError(f"loss.kl_coef {self.loss.kl_coef:g}: the local trainer keeps no reference policy")
        return self


def _address(seed: int, i: int) -> str:
    return "0x" + hashlib.sha256(f"krill-local-worker/{seed}/{i}".encode()).digest()[:20].hex()


def _draw_staleness(run_seed: bytes, worker: int, version: int, bound: int) -> int:
    h = hashlib.sha256(run_seed + b"staleness" + worker.to_bytes(4, "big") + version.to_bytes(8, "big")).digest()
    return min(int.from_bytes(h[:8], "big") % (bound + 1), version)


class LocalTrainer:
    """The simulated run: a learner model, stale snapshots, per-shard optimizers."""

    def __init__(self, model_dir: Path, config: LocalTrainConfig):
        from krill.model.build import load_model
        from krill.model.shards import num_layers_of, plan_shards
        from krill.rl.tasks import get_task

        self.config = config
        self.task = get_task(config.task)
        self.model, self.tokenizer = load_model(model_dir, dtype=torch.float32)
        self.run_seed = hashlib.sha256(f"krill-local-run/{config.seed}".encode()).digest()
        self.run_id = self.run_seed.hex()
        names = [n for n, _ in self.model.named_parameters()]
        plan = plan_shards(names, num_layers_of(self.model.config.to_dict(), names), config.num_shards)
        self.shards = {i: list(s) for i, s in enumerate(plan) if s}
        params = dict(self.model.named_parameters())
        self.shapes = {n: params[n].shape for n in names}
        self.optimizers = {i: ShardAdamW({n: params[n].data for n in s}, config.optimizer, config.rule.reductions)
                           for i, s in self.shards.items()}
        self.version = 0
        self.snapshots = {0: self._snapshot()}
        self.engines: dict[int, HFEngine] = {}
        self.params = SamplingParams(temperature=config.temperature, top_p=config.top_p,
                                     max_new_tokens=self.task.max_new_tokens)
        self._pending: tuple[list[Contribution], dict[str, torch.Tensor]] | None = None  # stale_gradients

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def _engine(self, version: int) -> HFEngine:
        """An engine serving `version`: engines are recycled as versions fall out of the window."""
        if version in self.engines:
            return self.engines[version]
        free = [v for v in self.engines if v < self.version - self.config.staleness.max_staleness]
        engine = self.engines.pop(free[0]) if free else HFEngine(copy.deepcopy(self.model),
                                                                 eos_id=self.tokenizer.eos_token_id,
                                                                 pad_id=self.tokenizer.pad_token_id)
        engine.load_state_dict(self.snapshots[version], version)
        self.engines[version] = engine
        return engine

    def masks(self) -> dict[str, torch.Tensor]:
        references: dict[str, torch.Tensor] | None = None
        if self.version > 0:
            references = {}
            for opt in self.optimizers.values():
                references.update(opt.momentum())
        return shared_masks(self.shapes, references, self.config.compression, self.run_id, self.version)

    def next_batch(self) -> tuple[list[Contribution], dict[str, torch.Tensor]]:
        """The contributions the coordinator folds into the current version, and their masks.

        With `stale_gradients`, those made at the previous version (the first version's twice).
        """
        masks = self.masks()
        made = self.contributions(masks)
        if not self.config.stale_gradients:
            return made, masks
        pending, self._pending = self._pending, (made, masks)
        return pending or (made, masks)

    def contributions(self, masks: dict[str, torch.Tensor]) -> list[Contribution]:
        c = self.config
        from krill.rl.assign import assign_prompts

        # Rollouts at most S_max versions behind the version that folds them: with stale gradients
        # that version is the next one.
        bound = c.staleness.max_staleness - int(c.stale_gradients)
        plans = []  # (worker, behaviour version, prompt indices)
        for i in range(c.workers):
            behaviour = self.version - _draw_staleness(self.run_seed, i, self.version, bound)
            worker = _address(c.seed, i)
            plans.append((worker, behaviour, assign_prompts(self.run_seed, worker, behaviour, self.version,
                                                            c.prompts_per_worker)))
        sampled = self._sample(plans)
        work = [SampledWork(worker=worker, version=behaviour, prompt_indices=indices, rollouts=rollouts,
                            sample_seconds=seconds)
                for (worker, behaviour, indices), (rollouts, seconds) in zip(plans, sampled, strict=True)]
        return make_contributions(task=self.task, tokenizer=self.tokenizer, learner=self.model, nonce=self.version,
                                  work=work, group_size=c.group_size, loss_config=c.loss, shards=self.shards,
                                  masks=masks, compression=c.compression)

    def _sample(self, plans: list[tuple[str, int, list[int]]]) -> list[tuple[Rollouts, float]]:
        """Every worker's rollouts, the workers at one behaviour version batched through its engine.

        Each worker samples with its own seeded generator (`generate_groups`), so its rollouts are
        those it would draw alone; the batch's time is shared out by rows.
        """
        out: list[tuple[Rollouts, float] | None] = [None] * len(plans)
        for behaviour in sorted({b for _, b, _ in plans}):
            ks = [k for k, (_, b, _) in enumerate(plans) if b == behaviour]
            groups = [(contribution_prompts(self.task, self.tokenizer, plans[k][2], self.config.group_size)[1],
                       sampling_seed(self.run_seed, plans[k][0], behaviour, self.version)) for k in ks]
            started = time.perf_counter()
            rollouts = self._engine(behaviour).generate_groups(groups, self.params)
            seconds = (time.perf_counter() - started) / len(ks)
            for k, r in zip(ks, rollouts, strict=True):
                out[k] = (r, seconds)
        return out  # type: ignore[return-value]

    def shard_updates(self, shard: int, rows: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows [n, d] and weights [n] the rule aggregates for `shard`: the submissions as they are.

        A hook for benchmarks: `krill.bench.robustness_inproc` adds Byzantine rows here.
        """
        return rows, weights

    def step(self, contributions: list[Contribution], masks: dict[str, torch.Tensor]) -> dict[str, float]:
        """The coordinator: weigh, decompress, aggregate and update each shard; publish a version."""
        weights = torch.tensor([staleness_weight(self.version - x.version, self.config.staleness)
                                for x in contributions], dtype=torch.float64)
        trimmed = []
        for shard, names in self.shards.items():
            shard_masks = {n: masks[n] for n in names}
            rows = []
            for x in contributions:
                values = decompress_values(x.gradients[shard], shard_masks, self.config.compression)
                rows.append(torch.cat([values[n] for n in names]))
            agg, stats = aggregate(*self.shard_updates(shard, torch.stack(rows), weights), self.config.rule)
            trimmed.extend(stats.trimmed_fractions)
            split = dict(zip(names, torch.split(agg, [int(shard_masks[n].numel()) for n in names]), strict=True))
            self.optimizers[shard].step(densify(split, shard_masks, {n: self.shapes[n] for n in names}))
        self.version += 1
        self.snapshots[self.version] = self._snapshot()
        for v in [v for v in self.snapshots if v < self.version - self.config.staleness.max_staleness]:
            del self.snapshots[v]
        return {"trimmed": sum(trimmed) / max(len(trimmed), 1)}

    def evaluate(self) -> float:
        from krill.model.evaluate import evaluate

        return evaluate(self.model, self.task, n=self.config.eval_n, tokenizer=self.tokenizer).accuracy


def run_local(model_dir: Path, config: LocalTrainConfig, echo: Callable[[str], None] = print) -> dict:
    """Train until `versions` or `minutes` is reached; returns the summary dictionary."""
    started = time.perf_counter()
    trainer = LocalTrainer(model_dir, config)
    base = trainer.evaluate()
    curve = [[0, base]]
    echo(f"base model: eval accuracy {base:.3f} on {config.eval_n} held-out {trainer.task.spec} prompts; "
         f"{len(trainer.shards)} shards, {config.workers} workers, staleness <= {config.staleness.max_staleness}")
    train_seconds = 0.0
    totals = {"sample_s": 0.0, "sample_tokens": 0, "grad_s": 0.0, "grad_steps": 0, "bytes": 0, "dense_bytes": 0}
    accuracy = base
    while True:
        if config.versions is not None and trainer.version >= config.versions:
            break
        if config.versions is None and config.minutes is not None and train_seconds >= 60 * config.minutes:
            break
        t0 = time.perf_counter()
        contributions, masks = trainer.next_batch()
        step_stats = trainer.step(contributions, masks)
        train_seconds += time.perf_counter() - t0
        tokens = sum(x.rollouts.num_completion_tokens for x in contributions)
        sample_s = sum(x.sample_seconds for x in contributions)
        totals["sample_s"] += sample_s
        totals["sample_tokens"] += tokens
        totals["grad_s"] += sum(x.gradient_seconds for x in contributions)
        totals["grad_steps"] += len(contributions)
        sent = sum(len(b) for x in contributions for b in x.gradients.values())
        totals["bytes"] += sent
        reward = float(torch.cat([x.rewards for x in contributions]).mean())
        stale = sum(trainer.version - 1 - x.version for x in contributions) / len(contributions)
        last = config.versions is not None and trainer.version >= config.versions
        last = last or (config.versions is None and train_seconds >= 60 * (config.minutes or 0))
        if trainer.version % config.eval_every == 0 or last:
            accuracy = trainer.evaluate()
            curve.append([trainer.version, accuracy])
        echo(f"v{trainer.version:5d}  reward {reward:.3f}  eval_acc {accuracy:.3f}  staleness {stale:.2f}  "
             f"tok/s {tokens / max(sample_s, 1e-9):8.0f}  loss {sum(x.loss for x in contributions) / len(contributions):+.4f}  "
             f"trimmed {step_stats['trimmed']:.2f}  sent {sent / 1024:.0f} KiB  t {train_seconds:6.1f}s")
    param_bytes = sum(4 * p.numel() for p in trainer.model.parameters())
    summary = {
        "base_accuracy": base,
        "final_accuracy": curve[-1][1],
        "versions": trainer.version,
        "wall_seconds": round(time.perf_counter() - started, 3),
        "train_seconds": round(train_seconds, 3),
        "curve": curve,
        "task": trainer.task.spec,
        "config": json.loads(config.model_dump_json()),
        "rollout_tokens_per_s": totals["sample_tokens"] / max(totals["sample_s"], 1e-9),
        "gradient_seconds_per_worker_step": totals["grad_s"] / max(totals["grad_steps"], 1),
        "compression_ratio": (param_bytes * totals["grad_steps"]) / max(totals["bytes"], 1),
    }
    return summary


def write_summary(summary: dict, path: Path) -> Path:
    """Write the summary JSON at `path` and the learning curve PNG beside it; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    png = path.with_suffix(".png")
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [v for v, _ in summary["curve"]]
    ys = [100 * a for _, a in summary["curve"]]
    ax.plot(xs, ys, marker="o")
    ax.set_xlabel("model version")
    ax.set_ylabel("greedy eval accuracy (%)")
    ax.set_title(f"krill train local: {summary.get('task', '')}, {summary['wall_seconds']:.0f} s wall")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
