"""The audit a release runs first: is the version the honest fold of its lineage, 1..V?

Design decisions:
- `load_chain_version` only proves that the weights are the ones the chain names; a coordinator
  can name tampered weights. A version is sound only if it is the fold of its parent and record,
  and its parent likewise back to the base: one tampered ancestor taints every later version. So
  by default the release audits ALL of 1..V with `krill audit`'s own checks
  (`krill.audit.audit_version`), oldest first, through one `AuditSource` so parents, records and
  keys are read once.
- Cost: one recompute per version, as `krill audit --all` up to V (and the source keeps the
  states it read, as that command does): minutes for a few hundred versions on a small machine.
  `first` > 1 (`krill release --audit-last N`) audits only versions first..V, each against its
  published parent: that proves each of them is the fold of its parent, not that the parent
  itself is, so a tampered version before `first` goes through. The demo uses it (its devnet is
  its own, and it audits the same last versions with `krill audit`); the facts then name the
  versions left unchecked. The audit stops at the first version that fails (the release is
  refused anyway), and `--unaudited` skips it for a run someone has already audited or that
  cannot be audited; the release then says so in its metadata and card.
- The outcome is plain facts (`AuditFacts.to_dict`) that go into `krill-release.json` and the
  card: which versions were recomputed and passed with how many checks, and which versions were
  not audited at all. Nothing in the card claims an audit that did not run.
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
    """What the release knows of its lineage: versions first..last were recomputed and passed `checks`
    checks; versions 1..first-1 of `version`'s lineage were not audited. `audited` False means nobody
    checked any of it at release time (first = version + 1, last = 0)."""

    audited: bool
    version: int  # the version released
    first: int  # first version audited (1: the whole lineage)
    last: int  # last version audited (0: nothing audited, or nothing to audit)
    checks: int  # checks run over versions first..last, every one of them passed

    def to_dict(self) -> dict:
        """{"audited", "versions": [first, last] recomputed (or []), "checks", "not_audited": [1, n] versions of
        the lineage nobody checked (or [])}."""
        unchecked = min(self.first - 1, self.version)
        return {"audited": self.audited, "versions": [self.first, self.last] if self.last else [],
                "checks": self.checks, "not_audited": [1, unchecked] if unchecked > 0 else []}


def not_audited(version: int) -> AuditFacts:
    return AuditFacts(audited=False, version=version, first=version + 1, last=0, checks=0)


def first_audited(version: int, last_n: int | None) -> int:
    """The first version `--audit-last last_n` audits for a release of `version` (None: all, from 1)."""
    return 1 if last_n is None else max(1, version - last_n + 1)


def audit_lineage(chain, store, spec, version: int, progress: Callable | None = None, first: int = 1,
                  from_block: int = 0) -> AuditFacts:
    """Audit versions `first`..`version` in order; raise `ReleaseAuditError` at the first that fails.
    `progress(report, last)` sees each version's `AuditReport` as it is done; `from_block` is the protocol's
    deployment block (`AuditSource`)."""
    from krill.audit import AuditSource, audit_version

    if first < 1:
        raise ValueError(f"first={first}: versions start at 1")
    source = AuditSource(chain, store, spec, from_block=from_block)
    checks = 0
    for v in range(first, version + 1):
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
    return AuditFacts(audited=True, version=version, first=min(first, version + 1), last=version if first <= version else 0,
                      checks=checks)
