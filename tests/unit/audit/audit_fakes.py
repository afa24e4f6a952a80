"""A fake chain for audit tests: the views and events `krill.audit.AuditSource` reads, held in dicts.

The audit reads only public data; a test plays a dishonest coordinator by writing what it likes
into this chain and the store, then audits. `fork()` copies the chain so that each test can publish
its own next version on a shared history.
"""

from __future__ import annotations

import copy
import types

from web3 import Web3

from krill.chain.events import Committed
from krill.chain.types import ZERO32, CommitInfo, RunInfo, StakeInfo, VersionInfo, to_uint

CHAIN_ID = 31337
CONTRACT = "0x" + "ab" * 20
NO_COMMIT = CommitInfo(run_id=ZERO32, worker="0x" + "00" * 20, version=0, header_digest=ZERO32, nonce=0,
                       commit_block=0, pass_count=0, fail_count=0, slashed=False, randomness=ZERO32)


class FakeChain:
    """Versions, commits, staked keys and `Committed` events of one run, as the contract's views give them."""

    address = Web3.to_checksum_address(CONTRACT)

    def __init__(self, run_id: bytes):
        self.run_id = run_id
        self.w3 = types.SimpleNamespace(eth=types.SimpleNamespace(chain_id=CHAIN_ID))
        self.versions: dict[int, VersionInfo] = {}
        self.commits: dict[int, CommitInfo] = {}
        self.keys: dict[str, bytes] = {}

    def fork(self) -> FakeChain:
        return copy.deepcopy(self)

    # what a test writes
    def publish(self, version: int, manifest_digest: bytes, record_digest: bytes) -> None:
        self.versions[version] = VersionInfo(manifest_digest, record_digest, 100 + version, True)

    def commit(self, worker: str, version: int, nonce: int, header_digest: bytes) -> int:
        commit_id = len(self.commits) + 1
        self.commits[commit_id] = CommitInfo(run_id=self.run_id, worker=Web3.to_checksum_address(worker),
                                             version=version, header_digest=header_digest, nonce=nonce,
                                             commit_block=10 + commit_id, pass_count=0, fail_count=0, slashed=False,
                                             randomness=ZERO32)
        return commit_id

    # what the audit reads
    def version_of(self, run_id, version: int) -> VersionInfo:
        return self.versions.get(version, VersionInfo(ZERO32, ZERO32, 0, False))

    def run_of(self, run_id) -> RunInfo:
        return RunInfo(exists=True, params=None, latest_version=max(self.versions), reward_pool=0, created_block=1)

    def commit_of(self, commit_id: int) -> CommitInfo:
        return self.commits.get(to_uint(commit_id, "commit_id"), NO_COMMIT)  # ChainInputError past uint256, as web3's

    def stake_of(self, account: str) -> StakeInfo:
        return StakeInfo(role=1, jailed=False, ed25519_public_key=self.keys.get(account.lower(), ZERO32),
                         staked=1, unbonding=0, release_block=0)

    def events(self, from_block: int = 0, confirmations: int = 0, kinds=None):
        for commit_id, c in sorted(self.commits.items()):
            yield Committed(block_number=c.commit_block, transaction_hash="0x" + "00" * 32, log_index=0,
                            address=self.address, commit_id=commit_id, run_id=c.run_id, worker=c.worker,
                            version=c.version, nonce=c.nonce, header_digest=c.header_digest)
