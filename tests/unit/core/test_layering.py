"""The core (`krill/`) never imports a role folder (STYLE.md): roles depend on the core, not the reverse."""

from __future__ import annotations

import re
from pathlib import Path

ROLES = ("worker", "verifier", "coordinator", "explorer")
IMPORT = re.compile(rf"^\s*(from|import)\s+krill\.({'|'.join(ROLES)})\b", re.MULTILINE)


def test_no_core_module_imports_a_role():
    core = Path(__file__).resolve().parents[3] / "krill"
    offenders = [f"{path.relative_to(core.parent)}: {m.group(0).strip()}"
                 for path in sorted(core.rglob("*.py")) for m in IMPORT.finditer(path.read_text(encoding="utf-8"))]
    assert not offenders, offenders
