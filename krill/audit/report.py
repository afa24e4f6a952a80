"""What an audit found: named checks, each passed or failed with a one-line reason.

Design decisions:
- An audit never stops at the first problem: every check it can still run is run and listed, so
  one report says everything that is wrong with a version (a missing contribution does not hide a
  wrong manifest digest). Checks that cannot run because an input is missing say so and fail.
- The report is plain data (`to_dict`) for `--json` and for other tools; `ok` is the conjunction of
  every check, and `krill audit` exits 1 unless it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    trust: float
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
        return {"run_id": self.run_id, "version": self.version, "ok": self.ok,
                "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
                "contributions": [vars(e) for e in self.entries]}
