"""The committed ABI and bytecode are exactly what the pinned compiler makes of the sources."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from krill.chain.artifacts import ARTIFACTS_DIR, CONTRACT_NAMES, TEST_CONTRACT_NAMES

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def recompiled(tmp_path_factory) -> Path:
    node = shutil.which("node")
    if node is None or not (ROOT / "node_modules" / "solc").exists():
        pytest.fail("node and the pinned npm solc are required: run `make setup`")
    out = tmp_path_factory.mktemp("artifacts")
    subprocess.run([node, str(ROOT / "contracts" / "compile.mjs"), str(out)], check=True, cwd=ROOT,
                   capture_output=True, timeout=300)
    return out


@pytest.mark.parametrize("name", CONTRACT_NAMES + TEST_CONTRACT_NAMES)
def test_committed_artifact_matches_sources(recompiled, name):
    committed = json.loads((ARTIFACTS_DIR / f"{name}.json").read_text())
    fresh = json.loads((recompiled / f"{name}.json").read_text())
    assert fresh["compiler"] == committed["compiler"]
    assert fresh["settings"]["evmVersion"] in ("prague", "cancun")
    assert fresh["sources"] == committed["sources"], "a source changed: run `node contracts/compile.mjs`"
    assert fresh["abi"] == committed["abi"]
    assert fresh["bytecode"] == committed["bytecode"]
    assert fresh["deployedBytecode"] == committed["deployedBytecode"]
