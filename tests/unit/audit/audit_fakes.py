"""A fake chain for audit tests: the views and events `krill.audit.AuditSource` reads, held in dicts.

The audit reads only public data; a test plays a dishonest coordinator by writing what it likes
into this chain and the store, then audits. `fork()` copies the chain so that each test can publish
its own next version on a shared history. Blocks are whatever a test says: by default commit i lands
at block 10 + i, version v is published at block 100 + v, and the reward pool is funded at block 50.

`World` is a one-shard run in a local store on this chain, whose records a test writes by hand.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import types

import torch
from web3 import Web3

from krill.chain.events import (
    Attested,
    Committed,
    RewardCredited,
    RewardsFunded,
    Slashed,
    Staked,
    VersionSettled,
    WorkerJailed,
)
from krill.chain.types import ZERO32, CommitInfo, RunInfo, RunParams, StakeInfo, VersionInfo, to_uint
from krill.model.manifest import Manifest, ParameterEntry, ShardEntry
from krill.model.publish import bundle_files
from krill.model.shards import shard_to_bytes
from krill.payload.limits import PayloadLimits
from krill.protocol.record import AcceptedEntry, AggregationRecord, ShardOutcome, publish_record
from krill.protocol.spec import RunSpec
from krill.store.cid import digest_to_cid
from krill.store.local import LocalStore

CHAIN_ID = 31337
CONTRACT = "0x" + "ab" * 20
COORDINATOR = "0x" + "c0" * 20
NO_COMMIT = CommitInfo(run_id=ZERO32, worker="0x" + "00" * 20, version=0, header_digest=ZERO32, nonce=0,
                       commit_block=0, pass_count=0, fail_count=0, slashed=False, randomness=ZERO32)
TX = "0x" + "00" * 32


class FakeChain:
    """Versions, commits, verdicts, staked keys, the reward pool and the events of one run, as the contract gives them."""

    address = Web3.to_checksum_address(CONTRACT)

    def __init__(self, run_id: bytes):
        self.run_id = run_id
        self.w3 = types.SimpleNamespace(eth=types.SimpleNamespace(chain_id=CHAIN_ID))
        self.versions: dict[int, VersionInfo] = {}
        self.commits: dict[int, CommitInfo] = {}
        self.keys: dict[str, bytes] = {}
        self.params = RunParams(coordinator=Web3.to_checksum_address(COORDINATOR), max_staleness=2,
                                attestation_quorum=1, slash_fraction_bps=5_000, verifier_bounty_bps=2_000,
                                check_probability_ppm=100_000, challenge_window_blocks=40, reward_per_version=10**19)
        self.pool = 0
        self.log: list = []  # events other than `Committed` (those follow from `commits`)
        self.jailed: set[str] = set()
        self.seconds_per_block = 1
        self._log_index = itertools.count(1)

    def fork(self) -> FakeChain:
        return copy.deepcopy(self)

    def _emit(self, cls, block: int, **fields) -> None:
        self.log.append(cls(block_number=block, transaction_hash=TX, log_index=next(self._log_index),
                            address=self.address, **fields))

    # what a test writes
    def publish(self, version: int, manifest_digest: bytes, record_digest: bytes, block: int | None = None) -> None:
        self.versions[version] = VersionInfo(manifest_digest, record_digest, 100 + version if block is None else block,
                                             version == 0)

    def commit(self, worker: str, version: int, nonce: int, header_digest: bytes, block: int | None = None) -> int:
        commit_id = len(self.commits) + 1
        self.commits[commit_id] = CommitInfo(run_id=self.run_id, worker=Web3.to_checksum_address(worker),
                                             version=version, header_digest=header_digest, nonce=nonce,
                                             commit_block=10 + commit_id if block is None else block, pass_count=0,
                                             fail_count=0, slashed=False,
                                             randomness=hashlib.sha256(b"randomness %d" % commit_id).digest())
        return commit_id

    def stake(self, account: str, key: bytes, block: int) -> None:
        """`account` stakes with Ed25519 key `key` at `block` (its key is fixed from then on)."""
        self.keys.setdefault(account.lower(), key)
        self._emit(Staked, block, account=Web3.to_checksum_address(account), role=2, amount=1, staked=1,
                   ed25519_public_key=key)

    def selected_key(self, commit_id: int) -> bytes:
        """A verifier key the draw of `commit_id` selects at the run's check probability."""
        from krill.protocol.selection import drawn

        c = self.commits[commit_id]
        for i in itertools.count():
            key = hashlib.sha256(b"verifier key %d" % i).digest()
            if drawn(c.randomness, commit_id, key, self.params.check_probability_ppm):
                return key

    def fund(self, amount: int, block: int = 50) -> None:
        self.pool += amount
        self._emit(RewardsFunded, block, run_id=self.run_id, funder=self.params.coordinator, amount=amount,
                   reward_pool=self.pool)

    def settle(self, version: int, credits: list[tuple[str, int]], block: int | None = None) -> None:
        """Credit `credits` for `version` as the contract's `settle` would (no rule checked)."""
        block = self.versions[version].published_block if block is None else block
        total = sum(n for _, n in credits)
        self.pool -= total
        self.versions[version] = dataclasses.replace(self.versions[version], settled=True)
        for account, amount in credits:
            self._emit(RewardCredited, block, run_id=self.run_id, version=version,
                       account=Web3.to_checksum_address(account), amount=amount)
        self._emit(VersionSettled, block, run_id=self.run_id, version=version, accounts=len(credits), total=total)

    def attest(self, commit_id: int, ok: bool, verifier: str = "0x" + "ee" * 20) -> None:
        """A verdict of `verifier`; one with no key yet gets one the commit's draw selects (staked before the run),
        so that the verdict counts towards trust."""
        if verifier.lower() not in self.keys:
            self.keys[verifier.lower()] = self.selected_key(commit_id)
        c = self.commits[commit_id]
        c = dataclasses.replace(c, pass_count=c.pass_count + ok, fail_count=c.fail_count + (not ok))
        self.commits[commit_id] = c
        self._emit(Attested, c.commit_block + 1, commit_id=commit_id, verifier=Web3.to_checksum_address(verifier),
                   ok=ok, evidence_digest=b"\1" * 32, pass_count=c.pass_count, fail_count=c.fail_count)

    def slash(self, commit_id: int, block: int | None = None) -> None:
        c = self.commits[commit_id]
        self.commits[commit_id] = dataclasses.replace(c, slashed=True)
        block = c.commit_block + 2 if block is None else block
        self._emit(Slashed, block, commit_id=commit_id, worker=c.worker, amount=1, bounty=0, burned=1)
        if c.worker.lower() not in self.jailed:
            self.jailed.add(c.worker.lower())
            self._emit(WorkerJailed, block, worker=c.worker, commit_id=commit_id)

    # what the audit reads
    def version_of(self, run_id, version: int) -> VersionInfo:
        return self.versions.get(version, VersionInfo(ZERO32, ZERO32, 0, False))

    def block_time(self, number: int) -> int:
        return 1_700_000_000 + number * self.seconds_per_block

    def unbonding_blocks(self) -> int:
        return 50

    def run_of(self, run_id) -> RunInfo:
        return RunInfo(exists=True, params=self.params, latest_version=max(self.versions), reward_pool=self.pool,
                       created_block=1)

    def commit_of(self, commit_id: int) -> CommitInfo:
        return self.commits.get(to_uint(commit_id, "commit_id"), NO_COMMIT)  # ChainInputError past uint256, as web3's

    def stake_of(self, account: str) -> StakeInfo:
        return StakeInfo(role=1, jailed=account.lower() in self.jailed, ed25519_public_key=self.keys.get(account.lower(), ZERO32),
                         staked=1, unbonding=0, release_block=0)

    def events(self, from_block: int = 0, confirmations: int = 0, kinds=None):
        committed = [Committed(block_number=c.commit_block, transaction_hash=TX, log_index=0, address=self.address,
                               commit_id=commit_id, run_id=c.run_id, worker=c.worker, version=c.version, nonce=c.nonce,
                               header_digest=c.header_digest) for commit_id, c in self.commits.items()]
        for event in sorted([*committed, *self.log], key=lambda e: (e.block_number, e.log_index)):
            if event.block_number >= from_block and (kinds is None or isinstance(event, kinds)):
                yield event


class World:
    """Version 0 of a one-shard run, and `publish` for records written by hand."""

    def __init__(self, root, **spec_fields):
        self.store = LocalStore(root)
        data = shard_to_bytes({"w": torch.arange(64, dtype=torch.float32).reshape(8, 8) / 10})
        self.shard = ShardEntry(index=0, cid=self.store.add(data, pin=True), sha256=hashlib.sha256(data).hexdigest(),
                                size=len(data), parameters=[ParameterEntry(name="w", shape=[8, 8], dtype="F32")])
        self.tokenizer = self.store.add(bundle_files({}), pin=True)
        m0, c0, d0 = self.manifest(0, None)
        self.spec = RunSpec(name="t", base_manifest_cid=c0, num_shards=1, limits=PayloadLimits(vocab_size=100),
                            **spec_fields)
        self.chain = FakeChain(self.spec.run_id)
        self.chain.publish(0, d0, b"\0" * 32)
        self.cids, self.records = {0: c0}, {}

    def manifest(self, version, parent):
        m = Manifest(version=version, parent=parent, architecture={}, tokenizer=self.tokenizer, shards=[self.shard])
        return m, self.store.add(m.canonical_bytes(), pin=True), hashlib.sha256(m.canonical_bytes()).digest()

    def publish(self, version, outcome=None, accepted=(), rejected=(), block=None):
        _, cid, digest = self.manifest(version, self.cids[version - 1])
        parent = self.records.get(version - 1)
        record = AggregationRecord(
            version=version, run_id=self.spec.run_id.hex(), rule=self.spec.rule.model_dump(mode="json"),
            parent_manifest_cid=self.cids[version - 1], manifest_cid=cid,
            parent_record_cid=None if parent is None else digest_to_cid(parent.digest),
            accepted=list(accepted), rejected=list(rejected), masks_cid=self.store.add(b"x", pin=True),
            masks_sha256="00" * 32, closed_by="count",
            shards=[outcome or ShardOutcome(shard=0, submissions=0, optimizer_state_cid=None)])
        publish_record(self.store, record)
        self.chain.publish(version, digest, record.digest, block)
        self.cids[version], self.records[version] = cid, record
        return record

    def source(self):
        from krill.audit import AuditSource

        return AuditSource(self.chain, self.store, self.spec)


def entry(commit_id=1, trust="0.25", weight="0.25", worker="0x" + "01" * 20):
    """An accepted entry written by hand (its commit need not exist, nor its payload validate)."""
    return AcceptedEntry(commit_id=commit_id, worker=worker, header_digest="cd" * 32, model_version=0,
                         behaviour_version=0, staleness=0, trust=trust, weight=weight, shards=[0], mean_reward="0.0",
                         tokens=1)
