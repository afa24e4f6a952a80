"""Every Python package in the source tree is listed for the wheel (setuptools maps them explicitly)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ROLES = {"worker", "verifier", "coordinator", "explorer"}


def test_every_package_is_declared():
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "krill").rglob("__init__.py")}
    for role in ROLES:
        for p in (ROOT / role).rglob("__init__.py"):
            found.add(".".join(("krill",) + p.parent.relative_to(ROOT).parts))
    assert found <= declared, f"not declared in pyproject: {sorted(found - declared)}"
