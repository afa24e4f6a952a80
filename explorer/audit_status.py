"""Audit status of versions, from what `krill audit --json` (or `krill demo`'s summary) reported.

Design decisions:
- The explorer never holds a chain connection or recomputes a version: auditing is `krill audit`'s
  job, and anyone can run it. The explorer shows the verdict of a report file it is given
  (`--audit-report PATH`), and says "not audited" for versions the report does not cover.
- Three spellings are read: `krill audit --all|--last N --json` ({"ok", "versions": [reports]}),
  `krill audit --version V --json` (one report) and the demo's summary.json ({"audit": {"ok",
  "versions": [numbers], "failures": ["v3: check", ...]}}). Anything else is a clear error at start.
- The file is re-read when its modification time changes, so a long-running explorer picks up a
  new audit without a restart. Reports name their run; a report about another run is not applied.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from krill.errors import KrillError

MAX_REPORT_BYTES = 64 << 20


class AuditReportError(KrillError, ValueError):
    """An audit report file that cannot be read."""


def parse_report(data: Any) -> tuple[str | None, dict[int, dict[str, Any]]]:
    """(run id or None, {version: {"status": "passed"|"failed", "failed_checks": [...], "checks": n}})."""
    if not isinstance(data, dict):
        raise AuditReportError("an audit report is a JSON object")
    if isinstance(data.get("audit"), dict):  # krill demo's summary.json
        audit = data["audit"]
        for key in ("failures", "versions"):
            if not isinstance(audit.get(key, []), list):
                raise AuditReportError(f"not a demo summary: audit.{key} is {type(audit[key]).__name__}, expected a list")
        failures: dict[int, list[str]] = {}
        for text in audit.get("failures", []):
            head, _, name = str(text).partition(": ")
            if head.startswith("v") and head[1:].isdigit():
                failures.setdefault(int(head[1:]), []).append(name)
        versions = {int(v): {"status": "failed" if int(v) in failures else "passed",
                             "failed_checks": failures.get(int(v), []), "checks": None}
                    for v in audit.get("versions", []) if isinstance(v, int)}
        run_id = data.get("run_id")
        return (str(run_id).removeprefix("0x").lower() if run_id else None), versions
    reports = data.get("versions") if isinstance(data.get("versions"), list) else [data]
    out: dict[int, dict[str, Any]] = {}
    run_id = None
    for report in reports:
        if not isinstance(report, dict) or not isinstance(report.get("version"), int) \
                or not isinstance(report.get("checks"), list):
            raise AuditReportError("not an audit report: expected `krill audit --json` output or a demo summary")
        run_id = run_id or report.get("run_id")
        failed = [str(c.get("name")) for c in report["checks"] if isinstance(c, dict) and not c.get("ok")]
        ok = bool(report.get("ok")) and not failed
        out[report["version"]] = {"status": "passed" if ok else "failed", "failed_checks": failed,
                                  "checks": len(report["checks"])}
    return (str(run_id).removeprefix("0x").lower() if run_id else None), out


class AuditStatus:
    """Per-version audit outcome, re-read from `path` when the file changes (no path: nothing audited)."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._mtime: float | None = None
        self._run_id: str | None = None
        self._versions: dict[int, dict[str, Any]] = {}
        if self.path is not None:
            self._refresh()

    def _refresh(self) -> None:
        try:
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                return  # not written yet (the demo writes its summary at the end): nothing audited so far
            if stat.st_mtime == self._mtime:
                return
            if stat.st_size > MAX_REPORT_BYTES:
                raise AuditReportError(f"{self.path} is over {MAX_REPORT_BYTES} bytes")
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise AuditReportError(f"cannot read the audit report {self.path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise AuditReportError(f"the audit report {self.path} is not JSON: {exc}") from None
        self._run_id, self._versions = parse_report(data)
        self._mtime = stat.st_mtime

    def of(self, version: int, run_id: str | None = None) -> dict[str, Any]:
        """{"status": "passed" | "failed" | "not audited", "failed_checks": [...], "checks": n | None}."""
        if self.path is not None:
            with self._lock:
                try:
                    self._refresh()
                except AuditReportError:
                    pass  # keep the last good report; the start-up check already proved the path
                applies = run_id is None or self._run_id is None or self._run_id == run_id
                found = self._versions.get(int(version)) if applies else None
            if found is not None:
                return dict(found)
        return {"status": "not audited", "failed_checks": [], "checks": None}

    @property
    def source(self) -> str | None:
        return str(self.path) if self.path is not None else None

    @property
    def name(self) -> str | None:
        """The report's file name, as pages show it (not the operator's directory layout)."""
        return self.path.name if self.path is not None else None
