"""Detection through the real protocol: every attack of the worker fault enum against verifiers.

Design decisions:
- Detection is a protocol question, so it is measured on the protocol: each batch is a `krill
  demo` run (Anvil, the local store, a coordinator, one honest worker, one worker per attack in
  the batch, two verifiers, all separate processes) at the run spec's default check
  probability, with no release at the end. Figures are read back from the coordinator's index.
- Per attack: commits that landed; commits checked by at least one verifier; commits failed;
  the per-check detection rate d = failed / checked; contributions the coordinator rejected
  before folding (and why); versions from the attacker's first commit to its first slash (the
  latest published version at the slash block minus the version of its first commit), and
  whether it ended jailed. Strategies the contract refuses commit nothing: shown as such.
- The median versions to slash is taken over the runs in which the attacker committed, a run that
  ended without its slash counting as slower than any that had one (as `krill bench rl` counts a
  run that never reached a target): "-" when half of them or more ended unslashed. Leaving those
  runs out made one slash in two repeats read as the attack's typical delay.
- P(caught within k) for a single verifier checking with probability p is 1 - (1 - p d)^k; the
  table gives it for p in {0.05, 0.1, 0.2}, k in {1, 2, 5, 10, 20}, from each measured d.
- Sizes: `tiny` (CI smoke: two attacks, the tiny model, well under a minute of training; an
  untrained model has zero gradients, so gradient attacks need the base model),
  `default` (every attack, in three batches, on the default base model: about 13 minutes on 2 cores),
  `full` (longer batches, repeated with a second seed, for medians over more than one slash).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

PROBABILITIES = (0.05, 0.1, 0.2)
KS = (1, 2, 5, 10, 20)

# Batches of attacks run together (one honest worker alongside); each attack runs in exactly one.
BATCHES = (
    ("forge-rewards", "cherry-pick", "copycat", "fabricate-rollouts", "lazy", "stale-behaviour"),
    ("sign-flip", "scale", "noise", "alie", "ipm", "mimic"),
    ("foreign-signature", "forged-signature", "withhold", "future-version", "too-stale-version"),
)
SIZES = {
    "tiny": {"batches": (("forge-rewards", "cherry-pick"),), "minutes": 1.0, "repeats": 1, "model": "tiny",
             "version": {"contributions": 2, "deadline_s": 5.0}},
    "default": {"batches": BATCHES, "minutes": 3.0, "repeats": 1, "model": "base"},
    "full": {"batches": BATCHES, "minutes": 10.0, "repeats": 2, "model": "base"},
}


def attacker_figures(db_url: str, run_id: str, address: str) -> dict:
    """What the index says about one attacker's commits, verdicts, rejections and slashes."""
    from sqlalchemy import func, select

    from krill.db.models import Commit, Contribution, ContributionStatus, Participant, Slash, Verdict, Version
    from krill.db.session import open_database

    with open_database(db_url) as db, db.session() as s:
        commits = list(s.scalars(select(Commit).where(Commit.run_id == run_id, Commit.worker == address)
                                 .order_by(Commit.commit_id)))
        ids = [c.commit_id for c in commits]
        verdicts = list(s.scalars(select(Verdict).where(Verdict.commit_id.in_(ids)))) if ids else []
        checked = {v.commit_id for v in verdicts}
        failed = {v.commit_id for v in verdicts if not v.ok}
        rejected: dict[str, int] = {}
        for code, n in s.execute(select(Contribution.reason_code, func.count()).where(
                Contribution.run_id == run_id, Contribution.worker == address,
                Contribution.status == ContributionStatus.REJECTED).group_by(Contribution.reason_code)):
            rejected[code.value if code is not None else "?"] = int(n)
        folded = s.scalar(select(func.count()).select_from(Contribution).where(
            Contribution.run_id == run_id, Contribution.worker == address,
            Contribution.status == ContributionStatus.ACCEPTED, Contribution.aggregated_version.is_not(None))) or 0
        slash = s.scalars(select(Slash).where(Slash.worker == address).order_by(Slash.block_number)).first()
        versions_to_slash = None
        if slash is not None and commits:
            at_slash = s.scalar(select(func.max(Version.version)).where(
                Version.run_id == run_id, Version.published_block <= slash.block_number)) or 0
            versions_to_slash = int(at_slash) - int(commits[0].version)
        participant = s.get(Participant, address)
    return {"commits": len(commits), "checked": len(checked), "failed": len(failed),
            "detection_rate": (len(failed) / len(checked)) if checked else None,
            "rejected_by_coordinator": rejected, "folded": int(folded),
            "versions_to_slash": versions_to_slash, "jailed": bool(participant.jailed) if participant else False}


def median_versions_to_slash(items: list[dict]) -> float | None:
    """The median versions to slash over the runs whose attacker committed (`attacker_figures` each); a run
    without a slash counts as slower than any with one, so None when half of them or more had none."""
    values = [math.inf if i["versions_to_slash"] is None else i["versions_to_slash"] for i in items if i["commits"]]
    median = statistics.median(values) if values else math.inf
    return None if math.isinf(median) else median


def caught_within(p: float, d: float | None, k: int) -> float | None:
    """P(at least one of k cheated commits is checked and fails) for one verifier checking with p."""
    return None if d is None else 1.0 - (1.0 - p * d) ** k


def run_detection(size: str = "default", echo: Callable[[str], None] = print, workdir: Path | None = None) -> dict:
    """Run every batch of `size`; returns per-attack figures and the P(caught within k) table."""
    from krill.bench.demo_probe import temporary_workdir
    from krill.protocol.spec import ChainSpec

    plan = SIZES[size]
    p_default = ChainSpec().check_probability_ppm / 1e6
    # A fresh work directory is removed afterwards (each batch's demo leaves its store and chain data:
    # up to 0.6 GB per study); one given as `workdir` is kept.
    with temporary_workdir(Path(workdir) if workdir is not None else None, "krill-detection-") as tmp:
        runs, wall = _run_batches(plan, p_default, Path(tmp), echo)
    attacks = {}
    for name, items in runs.items():
        checked = sum(i["checked"] for i in items)
        failed = sum(i["failed"] for i in items)
        slashes = [i["versions_to_slash"] for i in items if i["versions_to_slash"] is not None]
        d = failed / checked if checked else None
        attacks[name] = {
            "runs": len(items), "commits": sum(i["commits"] for i in items), "checked": checked, "failed": failed,
            "detection_rate": d, "folded": sum(i["folded"] for i in items),
            "rejected_by_coordinator": _merge([i["rejected_by_coordinator"] for i in items]),
            "median_versions_to_slash": median_versions_to_slash(items),
            "slashed_runs": len(slashes), "jailed_runs": sum(i["jailed"] for i in items),
            "caught_within": {str(p): {str(k): caught_within(p, d, k) for k in KS} for p in PROBABILITIES},
        }
    return {"size": size, "check_probability": p_default, "verifiers": 2, "minutes_per_batch": plan["minutes"],
            "wall_seconds": wall, "attacks": attacks}


def _run_batches(plan: dict, p_default: float, root: Path,
                 echo: Callable[[str], None]) -> tuple[dict[str, list[dict]], float]:
    """Every demo batch of `plan` under `root`, verifiers checking with probability `p_default`: per
    strategy, its figures per run; and the wall seconds."""
    from krill.bench.demo_probe import model_dir as tiny_or_base_model
    from krill.demo.orchestrate import DemoConfig, run_demo

    model_dir = tiny_or_base_model(plan["model"], root)
    runs: dict[str, list[dict]] = {}
    started = time.monotonic()
    for repeat in range(plan["repeats"]):
        for b, batch in enumerate(plan["batches"]):
            echo(f"detection batch {b + 1}/{len(plan['batches'])} (repeat {repeat + 1}): {', '.join(batch)}")
            # Pipelined (two commits per worker and version): attackers' commits do not wait on the honest one's.
            config = DemoConfig(workers=1 + len(batch), adversaries=len(batch), attacks=list(batch), verifiers=2,
                                minutes=plan["minutes"], versions=10_000, shards=2, eval_every=10_000,
                                model_dir=model_dir, release=False, audit_last=0, fresh_gradients=False,
                                verifier_nice=0,
                                spec_overrides={"seed": 1000 * repeat + b, "version": plan.get("version", {}),
                                                "chain": {"check_probability_ppm": int(p_default * 1e6)}})
            summary = run_demo(config, root / f"run-{repeat}-{b}", echo=lambda line: None)
            db_url = f"sqlite:///{root / f'run-{repeat}-{b}' / 'krill.db'}"
            for w in summary["workers"]:
                if w["behavior"] == "honest":
                    figures = attacker_figures(db_url, summary["run_id"].removeprefix("0x"), w["address"])
                    runs.setdefault("honest", []).append(figures | {"versions": summary["versions"]})
                    continue
                figures = attacker_figures(db_url, summary["run_id"].removeprefix("0x"), w["address"])
                runs.setdefault(w["behavior"], []).append(figures | {"versions": summary["versions"]})
                echo(f"  {w['behavior']:>18}: {figures['commits']} commits, {figures['checked']} checked, "
                     f"{figures['failed']} failed, rejected {figures['rejected_by_coordinator']}, "
                     f"slash after {figures['versions_to_slash']} versions")
    return runs, round(time.monotonic() - started, 1)


def _merge(dicts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _fmt(x, digits: int = 2) -> str:
    return "-" if x is None else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))


def markdown(result: dict) -> str:
    """The detection table and the P(caught within k) table."""
    lines = [f"Detection through the protocol (check probability {result['check_probability']:g} per verifier, "
             f"{result['verifiers']} verifiers, {result['minutes_per_batch']:g} min per batch; the median versions "
             "to slash counts a run that ended without a slash as slowest, '-' when half of the runs or more did):",
             "",
             "| strategy | commits | checked | failed | per-check detection | folded | rejected by coordinator | "
             "median versions to slash | jailed |", "|---|---|---|---|---|---|---|---|---|"]
    for name, a in sorted(result["attacks"].items()):
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(a["rejected_by_coordinator"].items())) or "-"
        lines.append(f"| {name} | {a['commits']} | {a['checked']} | {a['failed']} | {_fmt(a['detection_rate'])} | "
                     f"{a['folded']} | {rejected} | {_fmt(a['median_versions_to_slash'])} | "
                     f"{a['jailed_runs']}/{a['runs']} |")
    lines += ["", "P(caught within k cheated commits) = 1 - (1 - p d)^k, one verifier, measured d:", "",
              "| strategy | p | " + " | ".join(f"k={k}" for k in KS) + " |",
              "|---|---|" + "---|" * len(KS)]
    for name, a in sorted(result["attacks"].items()):
        if name == "honest" or a["detection_rate"] is None:
            continue
        for p in PROBABILITIES:
            row = a["caught_within"][str(p)]
            lines.append(f"| {name} | {p:g} | " + " | ".join(_fmt(row[str(k)]) for k in KS) + " |")
    return "\n".join(lines) + "\n"
