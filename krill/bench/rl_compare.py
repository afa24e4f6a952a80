"""`krill bench rl`: time-to-accuracy and steps/min of Krill's in-process loop against TRL's GRPOTrainer.

Design decisions:
- Both sides train the same model (the default base model, or a tiny random one for the smoke
  size) on the same task with the settings the issue lists matched: G samples per prompt,
  prompts per step (Krill: workers x prompts per worker; TRL: one generation batch of
  prompts x G per optimizer step), max completion length (the task's), temperature 1, AdamW at
  a constant learning rate, gradient-norm clip 1, no KL, advantage = reward - group mean (no
  std scaling), token-level loss, fp32, no gradient checkpointing, one process on the CPU.
  Krill keeps what makes it Krill (rollouts up to 2 versions stale, shared-mask int8
  compression, robust aggregation, per-shard AdamW and clipping): that is the loop under test.
  The TRL side lives in `krill.bench.rl_trl`, imported only when TRL is installed.
- One clock for both (`RunClock`): training wall time and process CPU time, both paused while
  the model is evaluated; greedy accuracy (`krill.model.evaluate`, eval prompts 0..eval_n-1,
  the same numbers `krill train local` reports) at fixed training-time checkpoints (every
  `eval_every_s` seconds, checked after each optimizer step) and at the end, so both systems
  are sampled on the same time grid whatever their step rate. Model loading, trainer set-up
  and the dataset are outside the clock, for both. The grid is 5 s at the default size (15 s
  until 2026-12-06: TRL's 60 s to 50% then stood for anything in 45-60 s, while a demo, which
  evaluates every few versions, was read to the second).
- Runs alternate (Krill seed 0, TRL seed 0, Krill seed 1, ...) so slow drifts in a shared
  machine's load hit both sides alike; each run records the load average and the CPU time other
  processes used meanwhile (/proc/stat busy time minus this process's), so the output can say
  when the machine was shared.
- Time to a target accuracy is the training time at the first checkpoint at or above it (steps
  to it likewise: learning per step, apart from the step rate); the median over seeds counts a run that never got there as slower than any that did (median
  "not reached" when half of the runs or more did not: with an even number of runs the median
  averages the two middle ones, and one of them is then never). The Krill/TRL ratios are ratios
  of medians.
- One torch thread per run by default, for both sides: on a 2-core machine shared with other
  work, two OpenMP threads stall whenever another process takes a core (measured under the
  same load: Krill 3.6 steps/min with two threads, 65 with one; TRL 108 with one).
  `--threads 0` gives torch's default (one per core) for an idle machine.
- Three sizes: `tiny` (a random tiny model, 3 steps each: the CI smoke test, TRL only when
  installed), `default` (3 seeds x 3 minutes per run, about 20 minutes on 2 cores) and `full`
  (5 seeds x 10 minutes).
"""

from __future__ import annotations

import importlib.util
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch


@dataclass(frozen=True)
class RLSize:
    """What one size of the benchmark runs."""

    seeds: int
    seconds: float  # training-time budget per run
    max_steps: int | None  # stop earlier at this many optimizer steps (None: time only)
    eval_every_s: float
    eval_n: int
    workers: int  # Krill workers; prompts per step = workers x prompts_per_worker on both sides
    prompts_per_worker: int
    group_size: int
    lr: float = 1.5e-4
    task: str = "arithmetic"  # the default task at its default level
    targets: tuple[float, ...] = (0.3, 0.4, 0.5)
    dataset_size: int = 16384  # TRL's training prompts: train indices 0..dataset_size-1
    tiny_model: bool = False
    threads: int = 1  # torch CPU threads per run; 0: torch's default (one per core)


SIZES: dict[str, RLSize] = {
    "tiny": RLSize(seeds=1, seconds=60.0, max_steps=3, eval_every_s=3600.0, eval_n=16, workers=2,
                   prompts_per_worker=2, group_size=4, targets=(0.3,), dataset_size=64, tiny_model=True),
    "default": RLSize(seeds=3, seconds=180.0, max_steps=None, eval_every_s=5.0, eval_n=500, workers=8,
                      prompts_per_worker=4, group_size=8),
    "full": RLSize(seeds=5, seconds=600.0, max_steps=None, eval_every_s=10.0, eval_n=500, workers=8,
                   prompts_per_worker=4, group_size=8),
}


def _busy_seconds() -> float | None:
    """CPU seconds all processes on this machine have been busy (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class RunClock:
    """Training wall and CPU time with evaluation paused, and the accuracy checkpoints."""

    def __init__(self, task, tokenizer, size: RLSize):
        self.task, self.tokenizer, self.size = task, tokenizer, size
        self.curve: list[list[float]] = []  # [step, train seconds, cpu seconds, accuracy]
        self._paused = self._paused_cpu = 0.0
        self._next_eval = size.eval_every_s
        self._t0 = self._cpu0 = 0.0
        self.seconds = self.cpu_seconds = 0.0

    def _accuracy(self, model) -> float:
        from krill.model.evaluate import evaluate

        return evaluate(model, self.task, n=self.size.eval_n, tokenizer=self.tokenizer).accuracy

    def start(self, model) -> None:
        """Evaluate the starting model, then start the clocks."""
        base = self._accuracy(model)
        self.load_start = os.getloadavg()[0]
        self._busy0 = _busy_seconds()
        self._t0, self._cpu0 = time.perf_counter(), time.process_time()
        self.curve.append([0, 0.0, 0.0, base])

    def after_step(self, model, step: int) -> bool:
        """Record the step; evaluate at a checkpoint or at the end. True when the run is over."""
        self.seconds = time.perf_counter() - self._t0 - self._paused
        self.cpu_seconds = time.process_time() - self._cpu0 - self._paused_cpu
        last = self.seconds >= self.size.seconds or (self.size.max_steps is not None and step >= self.size.max_steps)
        if last or self.seconds >= self._next_eval:
            t, c = time.perf_counter(), time.process_time()
            self.curve.append([step, round(self.seconds, 3), round(self.cpu_seconds, 3), self._accuracy(model)])
            self._paused += time.perf_counter() - t
            self._paused_cpu += time.process_time() - c
            while self._next_eval <= self.seconds:
                self._next_eval += self.size.eval_every_s
        return last

    def record(self, system: str, seed: int, steps: int, rewards: list[float], setup_seconds: float) -> dict:
        """One run's figures."""
        wall = time.perf_counter() - self._t0
        busy = _busy_seconds()
        own = time.process_time() - self._cpu0
        others = None if busy is None or self._busy0 is None else max(0.0, (busy - self._busy0 - own) / wall)
        tail = rewards[-max(1, len(rewards) // 4):] if rewards else [float("nan")]
        return {"system": system, "seed": seed, "steps": steps, "train_seconds": round(self.seconds, 3),
                "cpu_seconds": round(self.cpu_seconds, 3),
                "steps_per_min": 60 * steps / max(self.seconds, 1e-9),
                "steps_per_cpu_min": 60 * steps / max(self.cpu_seconds, 1e-9),
                "base_accuracy": self.curve[0][3], "final_accuracy": self.curve[-1][3],
                "reward_tail": sum(tail) / len(tail), "curve": self.curve, "setup_seconds": round(setup_seconds, 2),
                "load_start": round(self.load_start, 2), "load_end": round(os.getloadavg()[0], 2),
                "other_cores_busy": None if others is None else round(others, 2)}


def krill_config(size: RLSize, seed: int):
    """`krill train local`'s config at this size: its defaults except the matched settings."""
    from krill.rl.local_train import LocalTrainConfig
    from krill.rl.optimizer import AdamWConfig

    return LocalTrainConfig(task=size.task, seed=seed, workers=size.workers, prompts_per_worker=size.prompts_per_worker,
                            group_size=size.group_size, temperature=1.0, versions=None, minutes=None,
                            eval_n=size.eval_n, optimizer=AdamWConfig(lr=size.lr, max_grad_norm=1.0))


def run_krill(model_dir: Path, size: RLSize, seed: int) -> dict:
    """One Krill run (`LocalTrainer`, the loop of `krill train local`) on the shared clock."""
    from krill.rl.local_train import LocalTrainer

    started = time.perf_counter()
    trainer = LocalTrainer(model_dir, krill_config(size, seed))
    clock = RunClock(trainer.task, trainer.tokenizer, size)
    setup = time.perf_counter() - started
    clock.start(trainer.model)
    rewards = []
    while True:
        contributions, masks = trainer.next_batch()
        trainer.step(contributions, masks)
        rewards.append(float(torch.cat([x.rewards for x in contributions]).mean()))
        if clock.after_step(trainer.model, trainer.version):
            break
    return clock.record("krill", seed, trainer.version, rewards, setup)


def time_to(curve: list[list[float]], target: float) -> float | None:
    """Training seconds at the first checkpoint at or above `target` (None: never)."""
    return next((t for _, t, _, acc in curve if acc >= target), None)


def crossing_time(curve: list[list[float]], target: float) -> float | None:
    """Training seconds at which the accuracy reached `target`, read between evaluations: linear
    between the last evaluation below it and the first at or above it (that one's time where it is
    the first evaluation; None: never). `time_to` reads the first evaluation at or above, so it lags
    the crossing by up to one evaluation interval, and the two sides' intervals differ (TRL's every
    few seconds of training, a demo's every few versions); this estimate takes that lag out of both."""
    before = None
    for _, seconds, _, acc in curve:
        if acc >= target:
            if before is None:
                return seconds
            t0, a0 = before
            return t0 + (seconds - t0) * (target - a0) / (acc - a0)
        before = (seconds, acc)
    return None


def steps_to(curve: list[list[float]], target: float) -> int | None:
    """Optimizer steps at the first checkpoint at or above `target` (None: never)."""
    return next((int(step) for step, _, _, acc in curve if acc >= target), None)


def _median(values: list[float | None]) -> float | None:
    m = statistics.median([math.inf if v is None else v for v in values]) if values else None
    return None if m is None or math.isinf(m) else m


def _times_to(curves: list[list[list[float]]], targets: tuple[float, ...]) -> tuple[dict, dict]:
    """Over `curves`: the median time to each target (a curve that never got there counts as slower
    than any that did) and how many got there, keyed by `str(target)`."""
    times = {str(t): [time_to(curve, t) for curve in curves] for t in targets}
    return ({k: _median(v) for k, v in times.items()}, {k: sum(x is not None for x in v) for k, v in times.items()})


def _crossings(curves: list[list[list[float]]], targets: tuple[float, ...]) -> dict:
    """Over `curves`: the median `crossing_time` of each target, counted like `_times_to`'s medians."""
    return {str(t): _median([crossing_time(curve, t) for curve in curves]) for t in targets}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def summarise(runs: list[dict], targets: tuple[float, ...]) -> dict:
    """Medians per system and the Krill/TRL ratios of those medians."""
    out: dict = {}
    for system in ("krill", "trl"):
        rs = [r for r in runs if r["system"] == system]
        if not rs:
            continue
        medians, reached = _times_to([r["curve"] for r in rs], targets)
        out[system] = {
            "runs": len(rs),
            "steps_per_min": _median([r["steps_per_min"] for r in rs]),
            "steps_per_cpu_min": _median([r["steps_per_cpu_min"] for r in rs]),
            "final_accuracy": _median([r["final_accuracy"] for r in rs]),
            "base_accuracy": _median([r["base_accuracy"] for r in rs]),
            "time_to": medians,
            "crossing": _crossings([r["curve"] for r in rs], targets),
            "steps_to": {str(t): _median([steps_to(r["curve"], t) for r in rs]) for t in targets},
            "reached": reached,
        }
    if "krill" in out and "trl" in out:
        k, t = out["krill"], out["trl"]
        out["krill_over_trl"] = {
            "steps_per_min": _ratio(k["steps_per_min"], t["steps_per_min"]),
            "steps_per_cpu_min": _ratio(k["steps_per_cpu_min"], t["steps_per_cpu_min"]),
            "final_accuracy": _ratio(k["final_accuracy"], t["final_accuracy"]),
            "time_to": {str(x): _ratio(k["time_to"][str(x)], t["time_to"][str(x)]) for x in targets},
            "crossing": {str(x): _ratio(k["crossing"][str(x)], t["crossing"][str(x)]) for x in targets},
            "steps_to": {str(x): _ratio(k["steps_to"][str(x)], t["steps_to"][str(x)]) for x in targets},
        }
    return out


def protocol_times(db_path: Path, targets: tuple[float, ...]) -> dict:
    """Time to each target in a finished `krill demo`, from its database.

    Per version the coordinator records the seconds since the previous publication on its own clock
    (`clock_seconds` in the metrics row's extra; the whole block seconds of `wall_seconds` where it
    is missing), the seconds of that spent evaluating (`phases.eval`), and every `eval_every`
    versions its greedy accuracy (`evals`, version 0 being the base model). The protocol's time to
    a target is the sum of the versions' seconds less their evaluation, from version 2 up to the
    first evaluated version at or above the target. Version 1's seconds run from the run's creation
    and are mostly the workers' start-up (processes, imports, model load: 20-30 s against about a
    second of training), which TRL's clock leaves out too, so set-up ends at version 1's
    publication, and version 1's own training step is charged as an ordinary version (the median
    version's seconds), since TRL's first step is on its clock. Evaluation is off the clock, as in
    both in-process runs, but the coordinator evaluates version v after publishing it while the
    workers go on computing version v + 1, so the version after each evaluation came out short
    (0.22 s against 0.48 s, median, in the runs of 2026-12-07): it is charged at least an ordinary
    version's seconds, not the credit of work done during the evaluation.
    """
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from krill.db.models import Eval, Metric

    engine = create_engine(f"sqlite:///{Path(db_path).resolve()}")
    try:
        with Session(engine) as s:
            rows = s.execute(select(Metric.version, Metric.accepted, Metric.wall_seconds, Metric.extra)
                             .order_by(Metric.version)).all()
            evals = s.execute(select(Eval.version, Eval.accuracy).where(Eval.split == "eval")
                              .order_by(Eval.version)).all()
    finally:
        engine.dispose()
    folded = [accepted for version, accepted, _, _ in rows if version >= 2]
    net, evaluating, setup = {}, 0.0, 0.0  # version -> its seconds less its evaluation
    for version, _, wall, extra in rows:
        extra = extra or {}
        seconds = extra.get("clock_seconds", wall) or 0.0
        eval_s = min((extra.get("phases") or {}).get("eval", 0.0), seconds)
        if version <= 1:
            setup += seconds
        else:
            net[version], evaluating = seconds - eval_s, evaluating + eval_s
    evaluated = {version for version, _ in evals}
    ordinary = statistics.median([s for v, s in net.items() if v - 1 not in evaluated] or [0.0])
    elapsed, at = ordinary, {0: 0.0, 1: round(ordinary, 3)}  # version 1's own step, as an ordinary version
    for version in sorted(net):
        elapsed += max(net[version], ordinary) if version - 1 in evaluated else net[version]
        at[version] = round(elapsed, 3)
    curve = [[version, at[version], None, accuracy] for version, accuracy in evals if version in at]
    prompts, group, seed = _demo_spec_settings(Path(db_path).parent / "spec.toml")
    per_version = statistics.median(folded) if folded else None
    return {"db": str(db_path), "versions": rows[-1][0] if rows else 0, "seconds": round(elapsed, 3),
            "setup_seconds": round(setup, 3), "eval_seconds": round(evaluating, 3), "curve": curve,
            "contributions_per_version": per_version, "prompts_per_contribution": prompts, "group_size": group,
            "seed": seed, "workers": _demo_workers(Path(db_path).parent / "summary.json"),
            "time_to": {str(t): time_to(curve, t) for t in targets},
            "crossing": {str(t): crossing_time(curve, t) for t in targets}}


def _demo_spec_settings(spec_file: Path) -> tuple[int | None, int | None, int | None]:
    """(prompts per contribution, samples per prompt, run seed) of a demo's run, from the spec
    overrides it wrote beside its database and the spec's defaults; Nones where there is no such file."""
    import tomllib

    from krill.protocol.spec import RolloutSpec, RunSpec

    if not spec_file.is_file():
        return None, None, None
    overrides = tomllib.loads(spec_file.read_text())
    rollout = RolloutSpec(**overrides.get("rollout", {}))
    return rollout.prompts_per_contribution, rollout.group_size, int(overrides.get("seed", RunSpec.model_fields["seed"].default))


def _demo_workers(summary_file: Path) -> dict | None:
    """{"honest": n, "attacking": n} from a finished demo's summary.json (None where there is none)."""
    import json

    if not summary_file.is_file():
        return None
    workers = json.loads(summary_file.read_text()).get("workers") or []
    attacking = sum(w.get("behavior") != "honest" for w in workers)
    return {"honest": len(workers) - attacking, "attacking": attacking}


def protocol_summary(demos: list[dict], targets: tuple[float, ...]) -> dict:
    """The median over demos (`protocol_times` each) of the time to each target, with each demo's.

    One demo's time to a target moves by more than the targets' margins (its curve hovers near a
    target for tens of versions, and which evaluation first reads it decides the figure), so the
    comparison with TRL's median over seeds takes the median over demos, counted like `summarise`'s
    (a demo that never got there is slower than any that did)."""
    medians, reached = _times_to([d["curve"] for d in demos], targets)
    return {"demos": demos, "runs": len(demos), "time_to": medians, "reached": reached,
            "crossing": _crossings([d["curve"] for d in demos], targets)}


def trl_available() -> bool:
    return importlib.util.find_spec("trl") is not None


def _tiny_model(directory: Path) -> Path:
    from krill.model.build import TinyModelSpec, build_tiny_model

    build_tiny_model(seed=0, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=directory)
    return directory


def run_compare(size_name: str, echo: Callable[[str], None] = print, *, seeds: int | None = None,
                seconds: float | None = None, threads: int | None = None, skip_trl: bool = False,
                demo_dbs: tuple[Path, ...] = ()) -> dict:
    """Every figure of `krill bench rl` at `size_name`; seeds, seconds and threads override the size's."""
    from krill.bench_env import machine_facts
    from krill.rl.tasks import get_task

    size = SIZES[size_name]
    overrides = {"seeds": seeds, "seconds": seconds, "threads": threads}
    size = replace(size, **{k: v for k, v in overrides.items() if v is not None})
    threads = torch.get_num_threads()
    if size.threads:
        torch.set_num_threads(size.threads)
    use_trl = not skip_trl and trl_available()
    note = None if use_trl else ("skipped (--skip-trl)" if skip_trl else
                                 "skipped: TRL is not installed (pip install -e '.[bench]')")
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="krill-bench-rl-") as tmp:
            if size.tiny_model:
                model_dir, model_name = _tiny_model(Path(tmp) / "model"), "tiny random Llama (hidden 32, 2 layers)"
            else:
                from krill.model.base import ensure_base_model

                model_dir = ensure_base_model()
                model_name = f"default base model {model_dir.name}"
            from krill.model.build import load_model

            params = sum(p.numel() for p in load_model(model_dir)[0].parameters())
            task = get_task(size.task)
            echo(f"rl: {model_name}, {params:,} parameters, task {task.spec}; {size.seeds} seed(s) x "
                 f"{size.seconds:.0f} s per run, {size.workers * size.prompts_per_worker} prompts x {size.group_size} "
                 f"samples per step; TRL: {'yes' if use_trl else note}")
            runs = []
            for seed in range(size.seeds):
                systems = ["krill", "trl"] if use_trl else ["krill"]
                for system in systems:
                    if system == "krill":
                        run = run_krill(model_dir, size, seed)
                    else:
                        from krill.bench.rl_trl import run_trl

                        run = run_trl(model_dir, size, seed, RunClock)
                    runs.append(run)
                    echo(_run_line(run, size.targets))
    finally:
        torch.set_num_threads(threads)
    result = {"size": size_name, "machine": machine_facts(), "trl_version": _trl_version(),
              "settings": {**asdict(size), "model": model_name, "parameters": params, "task": task.spec,
                           "max_completion_tokens": task.max_new_tokens,
                           "torch_threads": size.threads or threads,
                           "krill_config": krill_config(size, 0).model_dump(mode="json")},
              "runs": runs, "summary": summarise(runs, size.targets), "trl_note": note,
              "seconds": round(time.perf_counter() - started, 1)}
    if demo_dbs:
        result["protocol"] = protocol_summary([protocol_times(db, size.targets) for db in demo_dbs], size.targets)
    return result


def _trl_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return None


def _run_line(run: dict, targets: tuple[float, ...]) -> str:
    reached = "  ".join(f"{round(100 * t)}%: " + (f"{s:.0f} s" if (s := time_to(run["curve"], t)) is not None else "-")
                        for t in targets)
    others = "" if run["other_cores_busy"] is None else f"  others {run['other_cores_busy']:.2f} cores"
    return (f"{run['system']:5s} seed {run['seed']}  {run['steps']:4d} steps in {run['train_seconds']:.0f} s  "
            f"{run['steps_per_min']:6.1f} steps/min  acc {run['base_accuracy']:.3f} -> {run['final_accuracy']:.3f}  "
            f"time to {reached}  load {run['load_start']:.1f}{others}")
