"""Read-only calls of KrillProtocol, typed (a mixin of `KrillChain`).

Design decisions:
- One method per contract view, same name in snake_case, returning the dataclasses of
  `krill.chain.types` instead of tuples; bytes32 arguments accept bytes or 0x-hex.
- Views are plain `eth_call`s against the latest block, retried like every RPC, encoded and
  decoded by `krill.chain.view_codec` (web3's contract-call path costs three times the CPU).
"""

from __future__ import annotations

from typing import Any

from krill.chain.types import (
    AttestationInfo,
    CommitInfo,
    Role,
    RunInfo,
    StakeInfo,
    VersionInfo,
    from_abi,
    to_bytes32,
    to_uint,
)
from krill.chain.view_codec import view_codecs


class ProtocolViews:
    """Typed views; the class using it provides `_contract` and `_tx` (a Transactor)."""

    _contract: Any
    _tx: Any

    def _view(self, name: str, *args: Any) -> Any:
        return self._tx.call_view(self.address, view_codecs("KrillProtocol")[name], args, name)

    def token_address(self) -> str:
        """Address of the stake and reward token."""
        return self._view("token")

    def unbonding_blocks(self) -> int:
        return self._view("unbondingBlocks")

    def max_challenge_window(self) -> int:
        return self._view("maxChallengeWindow")

    def minimum_stake(self, role: Role | int) -> int:
        return self._view("minimumStake", int(role))

    def stake_of(self, account: str) -> StakeInfo:
        return from_abi(StakeInfo, self._view("stakeOf", account))

    def is_eligible(self, account: str, role: Role | int) -> bool:
        return self._view("isEligible", account, int(role))

    def run_of(self, run_id: bytes | str) -> RunInfo:
        return from_abi(RunInfo, self._view("runOf", to_bytes32(run_id, "run_id")))

    def version_of(self, run_id: bytes | str, version: int) -> VersionInfo:
        return from_abi(VersionInfo, self._view("versionOf", to_bytes32(run_id, "run_id"),
                                                to_uint(version, "version", 64)))

    def commit_count(self) -> int:
        return self._view("commitCount")

    def commit_of(self, commit_id: int) -> CommitInfo:
        return from_abi(CommitInfo, self._view("commitOf", to_uint(commit_id, "commit_id")))

    def commit_id_of(self, run_id: bytes | str, worker: str, version: int, nonce: int) -> int:
        return self._view("commitIdOf", to_bytes32(run_id, "run_id"), worker, to_uint(version, "version", 64),
                          to_uint(nonce, "nonce", 64))

    def commit_id_by_digest(self, header_digest: bytes | str) -> int:
        return self._view("commitIdByDigest", to_bytes32(header_digest, "header_digest"))

    def randomness_of(self, commit_id: int) -> bytes:
        return bytes(self._view("randomnessOf", to_uint(commit_id, "commit_id")))

    def is_check_selected(self, commit_id: int, verifier_key: bytes | str) -> bool:
        return self._view("isCheckSelected", to_uint(commit_id, "commit_id"), to_bytes32(verifier_key, "verifier_key"))

    def attestation_of(self, commit_id: int, verifier: str) -> AttestationInfo:
        return from_abi(AttestationInfo, self._view("attestationOf", to_uint(commit_id, "commit_id"), verifier))

    def failing_verifiers_of(self, commit_id: int) -> list[str]:
        return list(self._view("failingVerifiersOf", to_uint(commit_id, "commit_id")))

    def window_end_of(self, account: str) -> int:
        """Last block of the challenge window of `account`'s latest-closing commit (0: it never committed)."""
        return self._view("windowEndOf", account)

    def claimable_of(self, account: str) -> int:
        return self._view("claimableOf", account)

    def total_staked(self) -> int:
        return self._view("totalStaked")

    def total_unbonding(self) -> int:
        return self._view("totalUnbonding")

    def total_reward_pools(self) -> int:
        return self._view("totalRewardPools")

    def total_claimable(self) -> int:
        return self._view("totalClaimable")

    def total_burned(self) -> int:
        return self._view("totalBurned")

    def has_role(self, role: bytes | str, account: str) -> bool:
        return self._view("hasRole", to_bytes32(role, "role"), account)

    def get_role_admin(self, role: bytes | str) -> bytes:
        return bytes(self._view("getRoleAdmin", to_bytes32(role, "role")))

    def supports_interface(self, interface_id: bytes) -> bool:
        return self._view("supportsInterface", interface_id)

    def run_admin_role(self) -> bytes:
        return bytes(self._view("RUN_ADMIN_ROLE"))

    def default_admin_role(self) -> bytes:
        return bytes(self._view("DEFAULT_ADMIN_ROLE"))

    def constants(self) -> dict[str, int]:
        """ROLE_WORKER, ROLE_VERIFIER, MAX_ATTESTATIONS, MAX_SETTLE_BATCH, BPS and PPM as the contract says."""
        names = ("ROLE_WORKER", "ROLE_VERIFIER", "MAX_ATTESTATIONS", "MAX_SETTLE_BATCH", "BPS", "PPM")
        return {n: self._view(n) for n in names}
