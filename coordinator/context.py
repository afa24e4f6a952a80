"""What every coordinator step works on: the run, the chain, the store, the database, and caches.

Design decisions:
- One small object (`RunContext`) carries the live connections and the run spec, so the steps
  (ingest, close, publish, settle, slash) are plain functions of it and easy to test one by one.
- Version states are cached per version: their tensors, optimizer states and masks are immutable
  once published, and the masks of a learner version are needed for every contribution at it.
  Caching a version, loaded or just published (`adopt`), drops those more than `max_staleness` + 2
  behind it: a version holds about 13 MB of the demo model's tensors and optimizer states, and
  published versions were once kept without that limit (the demo coordinator grew to 5.9 GB in
  400 versions, and its versions slowed by a fifth in the second half).
- The context is the `FoldReplay` of the versions it loads: where the store lacks a version's
  optimizer states (stored every `optimizer_state_every` versions), the fold is run again from the
  record's accepted contributions, fetched and validated as at ingest, with the record's weights.
- Validated contributions are cached in memory by commit id (their gradients are what the fold
  consumes); after a restart the cache is empty and they are fetched and validated again, which
  gives the same values because everything is content-addressed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from krill.config import CoordinatorConfig
from krill.store.fetcher import Fetcher

MAX_CACHED_CONTRIBUTIONS = 512


@dataclass
class RunContext:
    chain: object                 # KrillChain acting as the run's coordinator
    store: object                 # ContentStore
    db: object                    # krill.db.Database
    spec: object                  # RunSpec
    chain_id: int
    shards: list[int] | None = None
    # store the optimizer states at every this many versions (the config's default where none is given)
    optimizer_state_every: int = CoordinatorConfig.model_fields["optimizer_state_every"].default
    _states: dict[int, object] = field(default_factory=dict, repr=False)
    _contributions: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)
    # commit id -> (monotonic time of the next fetch, current delay): content missing at the last try
    content_retry: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False)
    # fetches of commits' content, off the coordinator's thread (one lane per worker)
    fetcher: Fetcher = field(default_factory=Fetcher, repr=False)

    @property
    def run_id(self) -> bytes:
        return self.spec.run_id

    @property
    def run_hex(self) -> str:
        return self.spec.run_id.hex()

    @property
    def contract(self) -> str:
        return self.chain.address.lower()

    def state(self, version: int):
        """The public state of published `version` (cached)."""
        from krill.protocol.state import load_chain_version

        if version not in self._states:
            self._cache_state(load_chain_version(self.chain, self.store, self.spec, version, replay=self))
        return self._states[version]

    def fold_inputs(self, version: int, record) -> tuple[list, dict[int, object]]:
        """The submissions published `version`'s record accepted, and their learner states (`FoldReplay`)."""
        from krill.coordinator.publish import submissions

        return submissions(self, [entry.model_dump(mode="json") for entry in record.accepted])

    def served_shards(self) -> list[int]:
        """The shards this coordinator folds and publishes (`--shards`; default all)."""
        return list(self.shards) if self.shards is not None else list(range(self.spec.num_shards))

    def keeps_states(self, version: int) -> bool:
        """Whether `version`'s optimizer states are stored (else named by sha256 and replayed)."""
        return version % self.optimizer_state_every == 0

    def adopt(self, state) -> None:
        """Cache `state`, a version this process just published (its chain digests are the state's)."""
        self._cache_state(state)

    def _cache_state(self, state) -> None:
        """Cache `state` and drop the versions no contribution can be computed at any more (older
        than `max_staleness` behind it, with a margin of two)."""
        self._states[state.version] = state
        for old in [v for v in self._states if v < state.version - self.spec.chain.max_staleness - 2]:
            del self._states[old]

    def cached_versions(self) -> list[int]:
        """The versions whose state is held in memory, oldest first."""
        return sorted(self._states)

    @property
    def tokenizer(self):
        """The run's tokenizer (the base manifest's; fixed for the run)."""
        if "tokenizer" not in self._cache:
            from krill.protocol.policy import load_tokenizer

            self._cache["tokenizer"] = load_tokenizer(self.state(0))
        return self._cache["tokenizer"]

    @property
    def task(self):
        if "task" not in self._cache:
            from krill.rl.tasks import get_task

            self._cache["task"] = get_task(self.spec.task)
        return self._cache["task"]

    def grad_lengths(self, version: int) -> dict[int, dict[str, int]]:
        """Per shard, the mask length of each tensor of a gradient computed at `version`."""
        state = self.state(version)
        masks = state.masks()
        return {s: {n: int(masks[n].numel()) for n in state.manifest.shard_names(s)}
                for s in range(state.manifest.num_shards)}

    def remember(self, commit_id: int, contribution) -> None:
        self._contributions[commit_id] = contribution
        while len(self._contributions) > MAX_CACHED_CONTRIBUTIONS:
            self._contributions.popitem(last=False)

    def recall(self, commit_id: int):
        return self._contributions.get(commit_id)

    def forget(self, commit_id: int) -> None:
        self._contributions.pop(commit_id, None)


def open_run_context(config, stack, shards: list[int] | None = None) -> RunContext:
    """Connect to chain, store and database as configured and load the run (coordinator identity)."""
    from krill.coordinator.create_run import saved_run_id
    from krill.errors import ConfigError
    from krill.protocol.state import load_run
    from krill.runtime import connect_chain, open_configured_database, open_configured_store, unlock_identity

    identity = unlock_identity(config)
    chain = connect_chain(config, identity.account)
    run_hex = config.run.id or saved_run_id()
    if run_hex is None:
        raise ConfigError("run.id is not set and no run was created here: run `krill coordinator create-run` "
                          "or pass --set run.id=<64 hex digits>")
    run_id = bytes.fromhex(run_hex.removeprefix("0x"))
    store = stack.enter_context(open_configured_store(config))
    db = stack.enter_context(open_configured_database(config))
    spec = load_run(chain, store, run_id)
    coordinator = chain.run_of(run_id).params.coordinator.lower()
    if coordinator != chain.sender.lower():
        raise ConfigError(f"run {run_hex[:16]}… is coordinated by {coordinator}, this keystore is "
                          f"{chain.sender.lower()}: use the coordinator's keystore")
    served = shards if shards is not None else config.coordinator.shards
    if served is not None and any(not 0 <= s < spec.num_shards for s in served):
        raise ConfigError(f"--shards {served}: the run has shards 0..{spec.num_shards - 1}")
    return RunContext(chain=chain, store=store, db=db, spec=spec, chain_id=int(chain.w3.eth.chain_id),
                      shards=sorted(set(served)) if served is not None else None,
                      optimizer_state_every=config.coordinator.optimizer_state_every)
