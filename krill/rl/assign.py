"""Prompt assignment: which training prompts a worker must answer, fixed by public inputs.

Design decisions:
- Index j of the batch of worker W for run seed R, model version v and nonce n is

      sha256("krill/prompt-assignment/v1" || R || W || v || n || j)[:8]  (big-endian) >> 1

  with R the 32-byte run seed, W the 20-byte worker address, v and n unsigned 64-bit and j
  unsigned 32-bit big-endian integers. Fixed-width binary fields make the encoding
  unambiguous; the domain tag keeps these hashes apart from every other sha256 in Krill; the
  shift keeps indices below 2**63 (the task index range).
- A worker cannot choose its prompts: the indices follow from the run, its address, the version
  and the nonce it commits to. A different nonce gives a different batch; the verifier checks
  that the committed prompts are exactly `assign_prompts(...)` for the committed nonce. (Trying
  many nonces to pick an easy batch gains nothing measurable: batches are large and rewards
  are group-relative.)
- Indices are into the task's train split (`Task.prompt(index, "train")`).

Public API:
    assign_prompts(run_seed, worker, version, nonce, count) -> list[int]
    AssignmentError
"""

from __future__ import annotations

import hashlib
import re

from krill.errors import KrillError

DOMAIN = b"krill/prompt-assignment/v1"
MAX_COUNT = 1 << 16
_U64 = (1 << 64) - 1


class AssignmentError(KrillError, ValueError):
    """An input of the prompt assignment is malformed."""


def _seed_bytes(run_seed: bytes | str) -> bytes:
    if isinstance(run_seed, str):
        text = run_seed.removeprefix("0x")
        if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
            raise AssignmentError(f"run_seed: expected 32 bytes as 64 hex digits, got {run_seed!r:.80}")
        return bytes.fromhex(text)
    if isinstance(run_seed, bytes | bytearray) and len(run_seed) == 32:
        return bytes(run_seed)
    raise AssignmentError(f"run_seed: expected 32 bytes, got {type(run_seed).__name__}")


def _address_bytes(worker: str | bytes) -> bytes:
    if isinstance(worker, bytes | bytearray) and len(worker) == 20:
        return bytes(worker)
    if isinstance(worker, str) and re.fullmatch(r"0x[0-9a-fA-F]{40}", worker):
        return bytes.fromhex(worker[2:])
    raise AssignmentError(f"worker: expected a 20-byte address (0x + 40 hex digits), got {worker!r:.80}")


def _u64(name: str, value: int) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U64:
        raise AssignmentError(f"{name}: expected an unsigned 64-bit int, got {value!r}")
    return value.to_bytes(8, "big")


def assign_prompts(run_seed: bytes | str, worker: str | bytes, version: int, nonce: int, count: int) -> list[int]:
    """The `count` train-split prompt indices assigned to `worker` for (`version`, `nonce`)."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise AssignmentError(f"count: expected an int in [1, {MAX_COUNT}], got {count!r}")
    prefix = DOMAIN + _seed_bytes(run_seed) + _address_bytes(worker) + _u64("version", version) + _u64("nonce", nonce)
    return [int.from_bytes(hashlib.sha256(prefix + j.to_bytes(4, "big")).digest()[:8], "big") >> 1
            for j in range(count)]
