"""The audit a release runs first: is the version the honest fold of its lineage, 1..V?

Design decisions:
- `load_chain_version` only proves that the weights are the ones the chain names; a coordinator
  can name tampered weights. A version is sound only if it is the fold of its parent and record,
  and its parent likewise back to the base: one tampered ancestor taints every later version. So
  the release audits ALL of 1..V with `krill audit`'s own checks (`krill.audit.audit_version`),
  oldest first, through one `AuditSource` so parents, records and keys are read once.
- Cost: one recompute per version, as `krill audit --all` up to V (and the source keeps the
  states it read, as that command does). We chose this over auditing only the last few versions,
  which would let a tampered early version through. The audit stops at the first version that
  fails (the release is refused anyway), and `--unaudited` skips it for a run someone has
  already audited or that cannot be audited; the release then says so in its metadata and card.
- The outcome is plain facts (`AuditFacts.to_dict`) that go into `krill-release.json` and the
  card: which versions passed and how many checks, or that none were audited. Nothing in the card
  claims an audit that did not run.
- A refusal is one line naming the first failing version and its failed checks, and what to run
  next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from krill.errors import KrillError


class ReleaseAuditError(KrillError):
    """A version the release depends on fails `krill audit`; `version` and `failed` (check names) say which."""

    def __init__(self, message: str, version: int, failed: tuple[str, ...]):
        super().__init__(message)
        self.version, self.failed = version, failed


@dataclass(frozen=True)
class AuditFacts:
    """What the release knows of its lineage: `audited` False means nobody checked it at release time."""

    audited: bool
    last: int  # versions 1..last were audited (0: nothing to audit, or not audited)
    checks: int  # checks run over those versions, every one of them passed

    def to_dict(self) -> dict:
        return {"audited": self.audited, "versions": [1, self.last] if self.last else [], "checks": self.checks}


def not_audited() -> AuditFacts:
    return AuditFacts(audited=False, last=0, checks=0)


def audit_lineage(chain, store, spec, version: int, progress: Callable | None = None) -> AuditFacts:
    """Audit versions 1..`version` in order; raise `ReleaseAuditError` at the first that fails.
    `progress(report, last)` sees each version's `AuditReport` as it is done."""
    from krill.audit import AuditSource, audit_version

    source = AuditSource(chain, store, spec)
    checks = 0
    for v in range(1, version + 1):
        report = audit_version(source, v)
        if progress is not None:
            progress(report, version)
        if not report.ok:
            failed = tuple(c.name for c in report.failures)
            which = f"version {v}" if v == version else f"version {v}, an ancestor of version {version},"
            raise ReleaseAuditError(
                f"{which} fails `krill audit` ({len(failed)} of {len(report.checks)} checks: {', '.join(failed)}); "
                f"version {version} is not released: run `krill audit --version {v}` for the details "
                "(--unaudited releases it anyway, marked as not audited)", v, failed)
        checks += len(report.checks)
    return AuditFacts(audited=True, last=version, checks=checks)
