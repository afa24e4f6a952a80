"""Constants and helpers the chain tests share (a module of its own: `from conftest import ...` picked
up whichever conftest.py was imported first when these tests ran in one session with tests/integration/db)."""

from __future__ import annotations

import hashlib

from krill.chain.deploy import TOKEN

MIN_WORKER = 100 * TOKEN
MIN_VERIFIER = 50 * TOKEN
UNBONDING = 20
CHALLENGE_WINDOW = 10
ACCOUNTS = 10
FUNDED = 10_000 * TOKEN
POOL = 5_000 * TOKEN
RUN_ID = hashlib.sha256(b"krill-test-run").digest()
BASE_MANIFEST = hashlib.sha256(b"base manifest").digest()
CROWD = 33  # MAX_ATTESTATIONS + 1 extra verifiers: one more than a verdict cap admits
WIDE_RUN = hashlib.sha256(b"krill-test-wide-run").digest()  # its challenge window holds all their verdicts


def digest(label: str) -> bytes:
    """A deterministic 32-byte digest for test payloads."""
    return hashlib.sha256(label.encode()).digest()


def key_of(index: int) -> bytes:
    """A stand-in Ed25519 public key for participant `index` (32 non-zero bytes)."""
    return hashlib.sha256(f"ed25519-{index}".encode()).digest()
