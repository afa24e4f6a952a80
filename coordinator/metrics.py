"""Per-version figures: a `metrics` row in the database and one dense status line for people.

Design decisions:
- Every figure derives from the version's journalled decision (the same entries as its record),
  so a restarted coordinator writes the same row; wall time is measured from the previous
  version's publication (block time) to this one's, which is what a person watching waits.
- The status line packs version, accepted/rejected, mean reward, eval accuracy when measured,
  mean staleness, sampled tokens/s, bytes in/out and seconds, in that order, on one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from krill.db.models import Metric


@dataclass(frozen=True)
class VersionFigures:
    version: int
    closed_by: str
    accepted: int
    rejected: int
    mean_reward: float | None
    mean_staleness: float | None
    tokens: int
    bytes_in: int
    bytes_out: int
    seconds: float
    fold_seconds: float
    accuracy: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def figures(row, bytes_in: int, bytes_out: int, seconds: float, fold_seconds: float) -> VersionFigures:
    accepted = row.accepted
    rewards = [float(e["mean_reward"]) for e in accepted]
    stale = [int(e["staleness"]) for e in accepted]
    return VersionFigures(version=row.version, closed_by=row.closed_by, accepted=len(accepted),
                          rejected=len(row.rejected), mean_reward=sum(rewards) / len(rewards) if rewards else None,
                          mean_staleness=sum(stale) / len(stale) if stale else None,
                          tokens=sum(int(e["tokens"]) for e in accepted), bytes_in=bytes_in, bytes_out=bytes_out,
                          seconds=seconds, fold_seconds=fold_seconds)


def record_metrics(ctx, f: VersionFigures, extra: dict | None = None) -> None:
    with ctx.db.write() as s:
        row = s.get(Metric, (ctx.run_hex, f.version))
        if row is None:
            row = Metric(run_id=ctx.run_hex, version=f.version)
            s.add(row)
        row.accepted, row.rejected, row.mean_reward = f.accepted, f.rejected, f.mean_reward
        row.sampled_tokens, row.bytes_received, row.bytes_published = f.tokens, f.bytes_in, f.bytes_out
        row.mean_staleness, row.aggregation_rule = f.mean_staleness, ctx.spec.rule.type
        row.wall_seconds = f.seconds
        row.extra = {"closed_by": f.closed_by, "fold_seconds": round(f.fold_seconds, 4),
                     "tokens_per_s": round(f.tokens_per_s, 2), "accuracy": f.accuracy, **(extra or {})}


def _bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def status_line(f: VersionFigures) -> str:
    reward = "-" if f.mean_reward is None else f"{f.mean_reward:.3f}"
    stale = "-" if f.mean_staleness is None else f"{f.mean_staleness:.2f}"
    acc = "" if f.accuracy is None else f" | eval acc {f.accuracy:.3f}"
    return (f"v{f.version:<4} {f.closed_by:8} accepted {f.accepted:3} rejected {f.rejected:3} | reward {reward}{acc} | "
            f"staleness {stale} | {f.tokens_per_s:7.1f} tok/s | in {_bytes(f.bytes_in)} out {_bytes(f.bytes_out)} | "
            f"{f.seconds:6.1f} s (fold {f.fold_seconds:.2f} s)")
