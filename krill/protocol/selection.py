"""The check draw: whether a verifier is selected to check a commit, computed as the contract does.

Design decisions:
- One formula for every party: keccak256(abi.encode(randomness, commitId, verifierKey)) mod 10^6
  < checkProbabilityPpm, the contract's `isCheckSelected`. Verifiers use it to know what to check
  before sealing; the coordinator uses it to count towards trust only the verdicts of verifiers
  the draw selected (anyone may attest, so unselected verdicts, a worker's own sybil verifiers
  passing its commits included, would otherwise buy trust).
- The draw is a pure function of its four inputs and is memoised on them: the coordinator weighs
  the same verdicts at every close.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1 << 16)
def drawn(randomness: bytes, commit_id: int, verifier_key: bytes, probability_ppm: int) -> bool:
    """The contract's `isCheckSelected` draw on `randomness`: keccak256(abi.encode(randomness,
    commitId, verifierKey)) mod 10^6 < checkProbabilityPpm."""
    from eth_abi import encode
    from eth_utils import keccak

    digest = keccak(encode(["bytes32", "uint256", "bytes32"], [bytes(randomness), int(commit_id), bytes(verifier_key)]))
    return int.from_bytes(digest, "big") % 1_000_000 < probability_ppm
