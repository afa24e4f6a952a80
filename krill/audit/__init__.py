"""`krill audit`: recompute published versions from chain + store alone and compare bit for bit.

Design decisions:
- Anyone can audit: the inputs are the chain (version digests, commits, staked keys) and the
  content store; no database, no role process, no trust in the coordinator beyond reporting the
  trust values it claims. The core never imports a role, and neither does the audit.
- Layout follows the data: `source` reads public inputs (`history`: the run's events, read once),
  `entries` checks each accepted contribution and turns it into a `Submission`, `recompute` folds
  and compares, `ledger` checks what the chain paid and took (settlement, slashing) against the
  rules, `report` holds the named checks.

Public API:
    AuditSource(chain, store, spec)
    audit_version(source, version) -> AuditReport      (report.ok, report.checks, report.to_dict())
    audit_versions(source, versions) -> list[AuditReport]
"""

from __future__ import annotations

from krill.audit.recompute import audit_version
from krill.audit.report import AuditCheck, AuditReport, EntryFigures
from krill.audit.source import AuditSource

__all__ = ["AuditCheck", "AuditReport", "AuditSource", "EntryFigures", "audit_version", "audit_versions"]


def audit_versions(source: AuditSource, versions) -> list[AuditReport]:
    """Audit each of `versions` in order (sharing the source's caches). A fault in one version's
    data, or in the audit itself, ends up in that version's report (`audit_version`), so every
    version gets its report."""
    return [audit_version(source, v) for v in versions]
