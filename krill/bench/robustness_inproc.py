"""The in-process part of `krill bench robustness`: attacks, aggregation cost and staleness.

Design decisions:
- Training figures come from `LocalTrainer`, the same loop as `krill train local` (real
  rollouts, gradients, shared-mask compression, per-shard AdamW); no chain, no store. Every cell
  of a grid uses the same base model, seed, versions and evaluation prompts (greedy accuracy on
  eval indices 0..eval_n-1), so cells differ only in what the grid varies.
- Byzantine workers replace honest ones: with n submissions per version and a fraction b, the
  trainer simulates n - round(b n) honest workers (the same addresses, prompts and seeds as the
  first workers of the clean run) and, in `shard_updates`, appends round(b n) rows from
  `krill.rl.attacks.byzantine_updates` computed from that shard's honest rows (omniscient
  attackers). Byzantine rows claim the current version (staleness weight 1) and skip the int8
  round trip: a real attacker can encode any row it likes, up to quantisation.
- Attacks on the attacker's own gradient (`OWN_GRADIENT_ATTACKS`: `tolerance-edge`, whose rows
  pass the verifier's gradient check) need the Byzantine workers' honest work: there the trainer
  simulates all n workers (the clean run's), and `shard_updates` replaces the last round(b n)
  decoded rows by the attack's, keeping their weights (they are real, replayable commits).
- `measure_shift` (off in the grids: it aggregates each shard twice) records per shard update
  how far the Byzantine rows move the rule's aggregate: |agg - ref| / |ref| and
  (mu . agg) / (mu . ref), with ref the aggregate without the attack (the honest rows alone, or
  for own-gradient attacks all n rows unperturbed) and mu the mean of the honest rows.
- Aggregation cost is timed on seeded Gaussian rows, [n, d] float32 with unit weights, per
  rule and against the plain mean; each cell repeats until `timing_repeats` runs or until
  `timing_budget_s` is spent (at least once) and reports the median. Cells with n x d above
  `timing_max_elements` are skipped: the robust rules hold several float64 copies of the rows
  (sort, indices, cumulative weights), which a 2-core / 23 GiB machine cannot afford at
  64 x 8M.
- Staleness: the default rule with rollouts drawn up to S_max versions behind, once with the
  loss's truncated importance weights and once with the ratio fixed at 1
  (`LossConfig.off_policy_correction = "none"`); staleness weighting stays at its default
  (inverse), so only the correction differs.
- Three sizes: `tiny` (a random tiny model on one torch thread, which an oversubscribed CI
  machine runs far faster than two spinning threads: the smoke test), `default` (a subset of
  the grid: 25 cells of 25 versions at about 20 s each on 2 idle cores, about 10 minutes in
  all; 22 minutes measured on a shared, loaded machine) and `full` (every attack x fraction x
  rule, 60 versions, shards up to 8M parameters: hours).
"""

from __future__ import annotations

import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from krill.rl.attacks import GRADIENT_ATTACKS, OWN_GRADIENT_ATTACKS, AttackParams, byzantine_updates
from krill.rl.local_train import LocalTrainConfig, LocalTrainer

RULES: tuple[str, ...] = ("mean", "median", "trimmed-mean", "clip-mix-trim", "centered-clipping")


@dataclass(frozen=True)
class GridSize:
    """What one size of the benchmark runs."""

    attacks: tuple[str, ...]
    fractions: tuple[float, ...]
    rules: tuple[str, ...]
    workers: int  # submissions per version, Byzantine ones included
    prompts_per_worker: int
    group_size: int
    versions: int
    eval_n: int
    staleness_bounds: tuple[int, ...]
    staleness_workers: int
    timing_ns: tuple[int, ...]
    timing_ds: tuple[int, ...]
    timing_max_elements: int
    timing_repeats: int
    timing_budget_s: float
    tiny_model: bool = False
    threads: int = 0  # torch CPU threads; 0: torch's default (one per core)


SIZES: dict[str, GridSize] = {
    "tiny": GridSize(attacks=("sign-flip", "alie"), fractions=(0.0, 0.2), rules=("mean", "clip-mix-trim"),
                     workers=5, prompts_per_worker=2, group_size=4, versions=2, eval_n=20,
                     staleness_bounds=(0, 2), staleness_workers=3, timing_ns=(4, 8), timing_ds=(4096,),
                     timing_max_elements=1 << 20, timing_repeats=1, timing_budget_s=1.0, tiny_model=True,
                     threads=1),
    "default": GridSize(attacks=("sign-flip", "scale", "alie", "ipm"), fractions=(0.0, 0.2),
                        rules=("mean", "median", "clip-mix-trim"), workers=10, prompts_per_worker=4, group_size=8,
                        versions=25, eval_n=500, staleness_bounds=(0, 1, 2, 4, 8), staleness_workers=8,
                        timing_ns=(8, 16, 64), timing_ds=(1 << 16, 1 << 20), timing_max_elements=1 << 24,
                        timing_repeats=3, timing_budget_s=10.0),
    "full": GridSize(attacks=GRADIENT_ATTACKS, fractions=(0.0, 0.1, 0.2, 0.3), rules=RULES, workers=10,
                     prompts_per_worker=4, group_size=8, versions=60, eval_n=500,
                     staleness_bounds=(0, 1, 2, 4, 8), staleness_workers=8, timing_ns=(8, 16, 64),
                     timing_ds=(1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 23), timing_max_elements=1 << 26,
                     timing_repeats=5, timing_budget_s=60.0),
}


def make_rule(name: str, new_run: bool = False):
    """Rule `name` with its class defaults (the training cells, as their recorded results were made), or
    as a new run's spec gets it (`new_run`: fixed-tree reductions, clip-mix-trim's non-zero-median basis)."""
    from pydantic import TypeAdapter

    from krill.rl.aggregate import AggregationRule, rule_over_run_default

    table = {"type": name}
    return TypeAdapter(AggregationRule).validate_python(rule_over_run_default(table) if new_run else table)


class AttackedTrainer(LocalTrainer):
    """A `LocalTrainer` whose every shard also receives `n_byzantine` rows of `attack` (for an attack in
    `OWN_GRADIENT_ATTACKS`: whose last `n_byzantine` rows are replaced by the attack's)."""

    def __init__(self, model_dir: Path, config: LocalTrainConfig, attack: str | None = None, n_byzantine: int = 0,
                 params: AttackParams | None = None, measure_shift: bool = False):
        super().__init__(model_dir, config)
        self.attack, self.n_byzantine, self.attack_params = attack, n_byzantine, params or AttackParams()
        self.own = attack in OWN_GRADIENT_ATTACKS
        if self.own and n_byzantine >= config.workers:
            raise ValueError(f"{attack}: {n_byzantine} Byzantine of {config.workers} simulated workers leaves no "
                             "honest one")
        self.measure_shift = measure_shift
        self.shifts: list[dict[str, float]] = []

    def shard_updates(self, shard: int, rows: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.attack is None or self.n_byzantine == 0:
            return rows, weights
        seed = hashlib.sha256(f"krill-bench-attack/{self.config.seed}/{self.version}/{shard}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(seed[:8], "big") >> 1)
        f = self.n_byzantine
        if self.own:
            honest = rows[:-f]
            bad = byzantine_updates(self.attack, honest, f, gen, self.attack_params, n_total=rows.shape[0],
                                    own=rows[-f:])
            out, out_w = torch.cat([honest, bad]), weights
        else:
            honest = rows
            bad = byzantine_updates(self.attack, rows, f, gen, self.attack_params, n_total=rows.shape[0] + f)
            out, out_w = torch.cat([rows, bad]), torch.cat([weights, torch.ones(f, dtype=weights.dtype)])
        if self.measure_shift:
            self.shifts.append(_shift(out, out_w, rows, weights, honest, self.config.rule))
        return out, out_w


def _shift(rows: torch.Tensor, weights: torch.Tensor, ref_rows: torch.Tensor, ref_weights: torch.Tensor,
           honest: torch.Tensor, rule) -> dict[str, float]:
    """How far the attacked aggregate lies from the reference one (see the module docstring)."""
    from krill.rl.aggregate import aggregate

    agg = aggregate(rows, weights, rule)[0].double()
    clean = aggregate(ref_rows, ref_weights, rule)[0].double()
    mu = honest.double().mean(0)
    along = float(mu @ clean)
    return {"shift": float((agg - clean).norm() / clean.norm().clamp_min(1e-30)),
            "progress": float(mu @ agg) / along if along else float("nan")}


def train_cell(model_dir: Path, config: LocalTrainConfig, attack: str | None = None, n_byzantine: int = 0,
               params: AttackParams | None = None, measure_shift: bool = False) -> dict:
    """Train `config.versions` versions; final greedy accuracy, honest reward of the last versions, seconds
    (with `measure_shift`, also the median and extremes of the per-shard aggregate shift and progress)."""
    started = time.perf_counter()
    trainer = AttackedTrainer(model_dir, config, attack, n_byzantine, params, measure_shift)
    rewards = []
    while trainer.version < (config.versions or 0):
        masks = trainer.masks()
        contributions = trainer.contributions(masks)
        trainer.step(contributions, masks)
        rewards.append(float(torch.cat([x.rewards for x in contributions]).mean()))
    tail = rewards[-max(1, len(rewards) // 4):]
    cell = {"accuracy": trainer.evaluate(), "reward": sum(tail) / len(tail),
            "seconds": round(time.perf_counter() - started, 2)}
    if measure_shift and trainer.shifts:
        for key in ("shift", "progress"):
            values = [x[key] for x in trainer.shifts]
            cell[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return cell


def _config(size: GridSize, workers: int, **overrides) -> LocalTrainConfig:
    return LocalTrainConfig(workers=workers, prompts_per_worker=size.prompts_per_worker, group_size=size.group_size,
                            versions=size.versions, minutes=None, eval_n=size.eval_n, eval_every=size.versions,
                            **overrides)


def robustness_grid(model_dir: Path, size: GridSize, echo: Callable[[str], None]) -> list[dict]:
    """Final accuracy per rule x attack x Byzantine fraction (fraction 0 once per rule, attack None)."""
    rows = []
    for rule in size.rules:
        for fraction in size.fractions:
            f = round(fraction * size.workers)
            for attack in ([None] if f == 0 else size.attacks):
                simulated = size.workers if attack in OWN_GRADIENT_ATTACKS else size.workers - f
                cell = train_cell(model_dir, _config(size, simulated, rule=make_rule(rule)), attack, f)
                rows.append({"rule": rule, "attack": attack, "fraction": fraction, "byzantine": f,
                             "workers": size.workers, **cell})
                echo(f"robustness  {rule:17s} {attack or 'none':9s} {f}/{size.workers} Byzantine  "
                     f"acc {cell['accuracy']:.3f}  reward {cell['reward']:.3f}  {cell['seconds']:.0f} s")
    return rows


def staleness_grid(model_dir: Path, size: GridSize, echo: Callable[[str], None]) -> list[dict]:
    """Final accuracy per S_max, with and without the truncated-importance-weight correction."""
    from krill.rl.loss import LossConfig
    from krill.rl.staleness import StalenessConfig

    rows = []
    for bound in size.staleness_bounds:
        for correction in ("truncated-is", "none"):
            config = _config(size, size.staleness_workers, staleness=StalenessConfig(max_staleness=bound),
                             loss=LossConfig(off_policy_correction=correction))
            cell = train_cell(model_dir, config)
            rows.append({"max_staleness": bound, "correction": correction, **cell})
            echo(f"staleness   S_max {bound}  correction {correction:12s}  acc {cell['accuracy']:.3f}  "
                 f"reward {cell['reward']:.3f}  {cell['seconds']:.0f} s")
    return rows


def aggregation_timing(size: GridSize, echo: Callable[[str], None]) -> list[dict]:
    """Median seconds per aggregation for each n x d x rule (all five rules, each as a new run's spec gets
    it; mean is the reference)."""
    from krill.rl.aggregate import aggregate

    rows = []
    for n in size.timing_ns:
        for d in size.timing_ds:
            if n * d > size.timing_max_elements:
                continue
            x = torch.randn((n, d), generator=torch.Generator().manual_seed(n * 1_000_003 + d))
            w = torch.ones(n, dtype=torch.float64)
            cell = {}
            for rule_name in RULES:
                rule, times = make_rule(rule_name, new_run=True), []
                while len(times) < size.timing_repeats and (not times or sum(times) < size.timing_budget_s):
                    start = time.perf_counter()
                    aggregate(x, w, rule)
                    times.append(time.perf_counter() - start)
                cell[rule_name] = (statistics.median(times), len(times), rule.reductions)
            for rule_name, (seconds, repeats, reductions) in cell.items():
                rows.append({"n": n, "d": d, "rule": rule_name, "seconds": seconds, "repeats": repeats,
                             "vs_mean": seconds / cell["mean"][0], "reductions": reductions})
            echo(f"aggregation n {n:3d}  d {d:>9,d}  " + "  ".join(f"{r} {1000 * s:.0f} ms" for r, (s, _, _) in cell.items()))
            del x
    return rows


def _tiny_model(directory: Path) -> Path:
    from krill.model.build import TinyModelSpec, build_tiny_model

    build_tiny_model(seed=0, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=directory)
    return directory


def base_model_figures(model_dir: Path, size: GridSize) -> tuple[float, int]:
    """Greedy accuracy of the untrained model on the grid's eval prompts, and its parameter count."""
    from krill.model.build import load_model
    from krill.model.evaluate import evaluate
    from krill.rl.tasks import get_task

    model, tokenizer = load_model(model_dir, dtype=torch.float32)
    accuracy = evaluate(model, get_task(LocalTrainConfig().task), n=size.eval_n, tokenizer=tokenizer).accuracy
    return accuracy, sum(p.numel() for p in model.parameters())


def run_inproc(size_name: str, echo: Callable[[str], None] = print, model_dir: Path | None = None) -> dict:
    """Every in-process figure of `krill bench robustness` at size `size_name` (tiny, default, full)."""
    size = SIZES[size_name]
    started = time.perf_counter()
    threads = torch.get_num_threads()
    if size.threads:
        torch.set_num_threads(size.threads)
    try:
        result = _run(size_name, size, echo, model_dir)
    finally:
        torch.set_num_threads(threads)
    result["seconds"]["inproc_total"] = round(time.perf_counter() - started, 1)
    return result


def _run(size_name: str, size: GridSize, echo: Callable[[str], None], model_dir: Path | None) -> dict:
    from krill.bench_env import machine_facts

    with tempfile.TemporaryDirectory(prefix="krill-bench-robustness-") as tmp:
        if model_dir is None and size.tiny_model:
            model_dir, model_name = _tiny_model(Path(tmp) / "model"), "tiny random Llama (hidden 32, 2 layers)"
        elif model_dir is None:
            from krill.model.base import ensure_base_model

            model_dir = ensure_base_model()
            model_name = f"default base model {model_dir.name}"
        else:
            model_name = str(model_dir)
        accuracy, params = base_model_figures(model_dir, size)
        result = {"size": size_name, "machine": machine_facts(),
                  "settings": {**asdict(size), "model": model_name, "parameters": params,
                               "config": _config(size, size.workers).model_dump(mode="json", exclude={"rule"})},
                  "base_accuracy": accuracy, "seconds": {}}
        echo(f"base model: {model_name}, {params:,} parameters, accuracy {result['base_accuracy']:.3f} "
             f"on {size.eval_n} held-out prompts")
        for key, fn in (("robustness", lambda: robustness_grid(model_dir, size, echo)),
                        ("aggregation_time", lambda: aggregation_timing(size, echo)),
                        ("staleness", lambda: staleness_grid(model_dir, size, echo))):
            t0 = time.perf_counter()
            result[key] = fn()
            result["seconds"][key] = round(time.perf_counter() - t0, 1)
    return result
