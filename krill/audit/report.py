"""What an audit found: named checks, each passed or failed with a one-line reason.

Design decisions:
- An audit never stops at the first problem: every check it can still run is run and listed, so
  one report says everything that is wrong with a version (a missing contribution does not hide a
  wrong manifest digest). Checks that cannot run because an input is missing say so and fail.
- The report is plain data (`to_dict`) for `--json` and for other tools; `ok` is the conjunction of
  every check, and `krill audit` exits 1 unless it holds. The plain data is strict JSON: a figure
  that is not a finite number (a trust the record spells "abc") becomes null, as in the explorer's
  JSON API; the check that read it says what the record held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every float that is not finite (NaN, infinity) replaced by None, in nested dicts and lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


@dataclass(frozen=True)
class AuditCheck:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class EntryFigures:
    """What the record claims about one accepted contribution, as the audit read it."""

    commit_id: int
    worker: str
    model_version: int
    behaviour_version: int
    staleness: int
    trust: float  # NaN where the record's text is not a finite number (null in `to_dict`)
    weight: float
    shards: list[int]


@dataclass
class AuditReport:
    run_id: str
    version: int
    checks: list[AuditCheck] = field(default_factory=list)
    entries: list[EntryFigures] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[AuditCheck]:
        return [c for c in self.checks if not c.ok]

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append(AuditCheck(name, bool(ok), detail))
        return bool(ok)

    def to_dict(self) -> dict:
        return finite({"run_id": self.run_id, "version": self.version, "ok": self.ok,
                       "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
                       "contributions": [dict(vars(e)) for e in self.entries]})
