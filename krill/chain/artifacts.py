"""Compiled contract artifacts (ABI + bytecode) shipped inside the package.

Design decisions:
- Artifacts are produced by `contracts/compile.mjs` (pinned solcjs, explicit evmVersion) and
  committed under `krill/chain/artifacts/`, so installing Krill needs no Solidity compiler; a test
  recompiles the sources and proves the committed files match.
- Loading is cached per name: the JSON is read once per process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from krill.errors import ChainError

ARTIFACTS_DIR = Path(__file__).resolve().parent / "artifacts"
CONTRACT_NAMES = ("KrillToken", "KrillProtocol")
TEST_CONTRACT_NAMES = ("ReentrantToken", "ReentrantReceiver")


@dataclass(frozen=True)
class Artifact:
    """One compiled contract."""

    name: str
    abi: tuple[dict, ...]
    bytecode: str
    deployed_bytecode: str
    compiler_version: str
    settings: dict
    source_sha256: dict[str, str]

    def errors(self) -> list[dict]:
        """The ABI entries of the contract's custom errors."""
        return [e for e in self.abi if e["type"] == "error"]

    def events(self) -> list[dict]:
        """The ABI entries of the contract's events."""
        return [e for e in self.abi if e["type"] == "event"]


@cache
def load_artifact(name: str, directory: Path | None = None) -> Artifact:
    """Load `<name>.json` from the artifacts folder (or `directory`)."""
    path = (directory or ARTIFACTS_DIR) / f"{name}.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ChainError(f"contract artifact {path} is missing: run `node contracts/compile.mjs`") from exc
    except json.JSONDecodeError as exc:
        raise ChainError(f"contract artifact {path} is not valid JSON: {exc}") from exc
    return Artifact(
        name=raw["contractName"],
        abi=tuple(raw["abi"]),
        bytecode=raw["bytecode"],
        deployed_bytecode=raw["deployedBytecode"],
        compiler_version=raw["compiler"]["version"],
        settings=raw["settings"],
        source_sha256=dict(raw["sources"]),
    )
