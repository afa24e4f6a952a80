"""Public inputs of an audit, read from chain + store once and cached.

Design decisions:
- Everything an audit uses comes from the chain (version digests, commits, staked keys, chain id,
  contract address) or from the store by a CID that follows from an on-chain digest, and is
  checked on fetch by the core loaders (`load_chain_version`, `load_record`). Nothing comes from
  a database or from the coordinator's word, except what the record itself claims: that is what
  the audit checks. The gradient masks of the learner versions are derived from the momentum, not
  read from the blobs the coordinator published (`masks_from_momentum`).
- Versions, records and keys are cached per audit run, since consecutive versions share parents
  and learner versions (`--all` touches each only once or twice).
- The source is the `FoldReplay` of its versions: an optimizer state the coordinator did not store
  (it stores them every few versions) is replayed from the record's accepted contributions,
  fetched and validated as the audit does, with the record's weights. The replayed state must
  hash to the record's sha256, so a replay cannot vouch for what the record did not commit to.
- `DATA_ERRORS` are what the core's loaders raise on public data that is missing, malformed or
  inconsistent (the loaders turn a blob that is not safetensors into ModelError / OptimizerError;
  safetensors' own `SafetensorError` stays listed for any decoder that does not). The audit turns each into a failed
  check of the version that read it; anything else is an error of the audit itself (see
  `krill.audit.recompute`).
- The run's events are read once (`krill.audit.history.RunHistory`): its `Committed` events, so the
  audit can apply the coordinator's nonce rule (a worker's nonce counts once in a run: its first
  commit) from public data alone, and the verdicts, fundings and settlements the ledger checks read.
  On a live run the chain moves on during an audit; where a view read later names what the scan
  cannot have seen (a version settled since), the ledger reads the events again (`refresh_history`).
- A verifier's key counts as on-chain by a commit's block when its first `Staked` event is in that block
  or earlier (`counts_towards_trust`, as `coordinator/standing.py` reads it from an index kept since the
  protocol's deployment). The run's scan sees only the `Staked` events since the run's creation, and the
  contract emits one for every top-up and every re-stake: the first of them is not the key's first when
  the account staked before the run. So where the run's scan would refuse a verdict for a key staked
  after the commit, the `Staked` events before the run are read (once, from `from_block`, the protocol's
  deployment block) and an account staked there counts. (Taking the run's first `Staked` as the key's
  failed an honest record: a verifier staked before the run that topped up its stake during it had
  its earlier verdicts uncounted, so a worker's trust from them read as unreachable.)
- The unbonding period's history (`unbonding_periods`) comes from the contract's `UnbondingBlocksSet`
  events from `from_block` (the constructor emits one at deployment, the admin's setter one per change),
  read once per audit (again only after `refresh_history`, whose newer slashes may follow newer changes).
  The view `unbondingBlocks()` gives only the period in force now, and the contract fixes a release
  block with the period in force when it is computed: a slash's deadline needs the periods in force
  since its commit. Where no event is found, the period read just before the scan held all along.
"""

from __future__ import annotations

from safetensors import SafetensorError

from krill.audit.history import Point, RunHistory
from krill.chain.errors import ChainInputError
from krill.chain.types import ZERO32, CommitInfo
from krill.errors import ModelError, PayloadError, StoreError
from krill.protocol.record import AggregationRecord, load_record
from krill.protocol.spec import RunSpec
from krill.protocol.state import VersionState, load_chain_version
from krill.rl.aggregate import AggregationError
from krill.rl.optimizer import OptimizerError
from krill.rl.staleness import StalenessError

DATA_ERRORS: tuple[type[Exception], ...] = (StoreError, PayloadError, ModelError, OptimizerError, AggregationError,
                                            StalenessError, ChainInputError, SafetensorError)


def data_fault(exc: Exception) -> str:
    """One line for a `DATA_ERRORS` fault: missing content is "not available", the rest names its type."""
    if isinstance(exc, StoreError):
        return f"not available: {exc}"
    return f"{type(exc).__name__}: {exc}"


class AuditSource:
    """Chain + store access for auditing one run."""

    def __init__(self, chain, store, spec: RunSpec, from_block: int = 0):
        self.chain, self.store, self.spec = chain, store, spec
        self.from_block = int(from_block)  # the protocol's deployment block: where its `Staked` events start
        self._staked_before_run: set[str] | None = None
        self._unbonding: tuple[RunHistory, list[tuple[Point, int]]] | None = None
        self._versions: dict[int, VersionState] = {}
        self._records: dict[int, AggregationRecord] = {}
        self._keys: dict[str, bytes] = {}
        self._commits: dict[int, CommitInfo] = {}
        self._history: RunHistory | None = None
        self._run = None
        self._task = self._tokenizer = None
        self._chain_id: int | None = None
        self._block_times: dict[int, int] = {}
        self._published: dict = {}

    @property
    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(self.chain.w3.eth.chain_id)
        return self._chain_id

    @property
    def contract(self) -> str:
        return self.chain.address.lower()

    def latest_version(self) -> int:
        return int(self.chain.run_of(self.spec.run_id).latest_version)

    def version_info(self, version: int, fresh: bool = False):
        """The chain's record of `version`, or None when it is not published. A published one is kept
        (only its `settled` flag can change): `fresh` reads it again."""
        if version in self._published and not fresh:
            return self._published[version]
        info = self.chain.version_of(self.spec.run_id, version)
        if info.manifest_digest == ZERO32:
            return None
        self._published[version] = info
        return info

    def state(self, version: int) -> VersionState:
        """The public state of `version` (manifest, record, lazily its shards and masks)."""
        if version not in self._versions:
            self._versions[version] = load_chain_version(self.chain, self.store, self.spec, version,
                                                         masks_from_momentum=True, replay=self)
        return self._versions[version]

    def fold_inputs(self, version: int, record: AggregationRecord) -> tuple[list, dict[int, VersionState]]:
        """The submissions `record` (of `version`) accepted, and their learner states (`FoldReplay`)."""
        from krill.audit.entries import _float, entry_submission, fetch_contribution

        submissions = []
        for entry in record.accepted:
            try:
                contribution = fetch_contribution(self, entry)
            except DATA_ERRORS as exc:
                raise ModelError(f"replaying version {version}: commit {entry.commit_id} cannot be used: "
                                 f"{data_fault(exc)}") from None
            weight = _float(entry.weight)
            if weight is None or weight <= 0.0:
                raise ModelError(f"replaying version {version}: commit {entry.commit_id} has weight {entry.weight!r}")
            submissions.append(entry_submission(entry, contribution))
        return submissions, {v: self.state(v) for v in sorted({s.model_version for s in submissions})}

    def record(self, version: int) -> AggregationRecord:
        """The aggregation record of published version `version` >= 1 (verified against its digest)."""
        if version not in self._records:
            info = self.version_info(version)
            if info is None:
                raise ModelError(f"version {version} is not published")
            self._records[version] = load_record(self.store, info.record_digest)
        return self._records[version]

    def block_time(self, number: int) -> int:
        """The timestamp of block `number` (unix seconds)."""
        if number not in self._block_times:
            self._block_times[number] = int(self.chain.block_time(number))
        return self._block_times[number]

    def commit(self, commit_id: int) -> CommitInfo:
        """The chain's record of commit `commit_id` (worker = zero address: no such commit);
        ChainInputError for an id that is no uint256."""
        if commit_id not in self._commits:
            self._commits[commit_id] = self.chain.commit_of(commit_id)
        return self._commits[commit_id]

    def first_commit(self, worker: str, nonce: int) -> int | None:
        """The run's first commit by `worker` with `nonce`, from the chain's `Committed` events (None: none)."""
        return self.history.first_commits.get((worker.lower(), int(nonce)))

    @property
    def run(self):
        """The chain's record of the run (its parameters: quorum, challenge window, reward per version)."""
        if self._run is None:
            self._run = self.chain.run_of(self.spec.run_id)
        return self._run

    @property
    def history(self) -> RunHistory:
        """The run's events the audit reads, from its creation block (one scan per audit run)."""
        if self._history is None:
            self._history = RunHistory.read(self.chain, self.spec.run_id, int(self.run.created_block))
        return self._history

    def refresh_history(self) -> RunHistory:
        """The run's events read again: a view read after the scan (a version settled since) may need them."""
        self._history = None
        return self.history

    @property
    def task(self):
        """The run's task (its reward function and prompts), for the cheap replay."""
        if self._task is None:
            from krill.rl.tasks import get_task

            self._task = get_task(self.spec.task)
        return self._task

    @property
    def tokenizer(self):
        """The run's tokenizer: the base manifest's bundle, checked against its CID (as the coordinator's)."""
        if self._tokenizer is None:
            from krill.protocol.policy import load_tokenizer

            self._tokenizer = load_tokenizer(self.state(0))
        return self._tokenizer

    def staked_key(self, worker: str) -> bytes:
        """The Ed25519 key `worker` registered with its stake (fixed on-chain once set)."""
        worker = worker.lower()
        if worker not in self._keys:
            from web3 import Web3

            self._keys[worker] = bytes(self.chain.stake_of(Web3.to_checksum_address(worker)).ed25519_public_key)
        return self._keys[worker]

    def counts_towards_trust(self, commit_id: int, verifier: str) -> bool:
        """Whether a verdict of `verifier` on `commit_id` is one the coordinator counts towards trust
        (`coordinator/standing.py`): the commit's sealed randomness selected the verifier's key (the
        contract's draw, `krill.protocol.selection.drawn`, at the run spec's check probability), and that
        key was on-chain by the commit's block (its first `Staked` event then or earlier, or before the
        run: `staked_before_run`). Anyone staked may attest: without this rule a worker's own sybil
        verifiers passing its commits bounded the trust a record may claim from above, not the draw."""
        from krill.protocol.selection import drawn

        commit = self.commit(commit_id)
        if bytes(commit.randomness) == ZERO32:
            return False  # never sealed: nobody was selected
        first = self.history.staked.get(verifier.lower())
        if first is not None and first > int(commit.commit_block) and not self.staked_before_run(verifier):
            return False
        key = self.staked_key(verifier)
        return key != ZERO32 and drawn(bytes(commit.randomness), int(commit_id), key,
                                       int(self.spec.chain.check_probability_ppm))

    def staked_before_run(self, account: str) -> bool:
        """Whether `account` has a `Staked` event from `from_block` to before the run's creation block (its
        key was on-chain before any of the run's commits). Read once per audit, and only when a verdict
        needs it (see the module docstring)."""
        if self._staked_before_run is None:
            from krill.chain.events import Staked

            created, found = int(self.run.created_block), set()
            for event in self.chain.events(from_block=self.from_block, kinds=(Staked,)):
                if event.block_number >= created:
                    break  # oldest first: the rest are the run's own (`RunHistory.staked`)
                found.add(event.account.lower())
            self._staked_before_run = found
        return account.lower() in self._staked_before_run

    def unbonding_periods(self) -> list[tuple[Point, int]]:
        """(where it was set, blocks) of each unbonding period from `from_block` on, oldest first: the
        `UnbondingBlocksSet` events, or where there are none, the period in force now placed at
        (`from_block`, -1) (it held all along). Read once per run history (see the module docstring)."""
        history = self.history
        if self._unbonding is None or self._unbonding[0] is not history:
            from krill.chain.events import UnbondingBlocksSet

            now = int(self.chain.unbonding_blocks())  # before the scan: any later change is among its events
            sets = sorted(((e.block_number, e.log_index), int(e.blocks))
                          for e in self.chain.events(from_block=self.from_block, kinds=(UnbondingBlocksSet,)))
            self._unbonding = (history, sets or [((self.from_block, -1), now)])
        return self._unbonding[1]

    def unbonding_in_force(self, start: Point, end: Point) -> list[tuple[int, int]] | None:
        """(first block, blocks) of each unbonding period in force at some point from `start` up to just before
        `end`: the one in force at `start` (its first block taken as `start`'s) and each one set since. None
        when the events from `from_block` do not tell the one in force at `start` (none was set before it)."""
        periods = self.unbonding_periods()
        before = [blocks for where, blocks in periods if where < start]
        if not before:
            return None
        return [(start[0], before[-1])] + [(where[0], blocks) for where, blocks in periods if start <= where < end]

    def verdict_counts(self, worker: str, before_block: int) -> tuple[int, int]:
        """(passing, failing) verdicts that count towards `worker`'s trust (`counts_towards_trust`), on its
        commits of the run in blocks before `before_block`."""
        return self.history.verdict_counts(worker, before_block, self.counts_towards_trust)

    def jailed_now(self, worker: str) -> bool:
        """Whether the chain holds `worker`'s stake jailed now (a jail is never lifted)."""
        from web3 import Web3

        return bool(self.chain.stake_of(Web3.to_checksum_address(worker)).jailed)

    def grad_lengths(self, version: int) -> dict[int, dict[str, int]]:
        """Per shard, tensor name -> length of the public mask gradients at `version` travel on."""
        state = self.state(version)
        masks = state.masks()
        return {s: {n: int(masks[n].numel()) for n in state.manifest.shard_names(s)}
                for s in range(state.manifest.num_shards)}
