"""Where a worker's model versions come from: the chain says which, the store holds them.

Design decisions:
- The chain is the only clock: `latest()` is the run's `latestVersion`; a version is fetched by
  the digests `publishVersion` put on-chain (`load_chain_version`), verified on fetch, and cached
  by version number (a published version never changes). The cache keeps the few newest
  versions, enough for a behaviour version and a learner version up to S_max apart.
- Two policies, two model instances: the behaviour policy (a rollout engine) samples with the
  weights it has while newer versions appear; the learner computes gradients at the newest
  version the worker holds. Each follows its own version and reloads weights only when that
  version changes, so asynchrony never mixes one policy's weights into the other. When the
  engine needs the version the learner holds (sampling ahead: every contribution samples where
  the previous one learned), the two trade models instead (`BehaviourPolicy.hand_over`): one
  weight load per contribution instead of two.
- The cache is shared with the version watcher's thread (`krill.worker.watcher`), which fetches
  new versions ahead. A version is fetched once: a second caller waits for the fetch in flight,
  while look-ups of other versions go on (a worker sampling at a cached version never waits for
  the watcher's fetch of the next one, which a single lock around fetches made it do). A fetch
  also reads the version's gradient masks, which the learner needs for every contribution at it.
  They are the blob the coordinator published with the version (one bit per coordinate: 136 kB
  and 2.5 ms on the demo model), no longer derived here from the optimizer states (8.5 MB
  fetched and 61 ms of top-k per version). They are read before the watcher announces the version,
  not after it while the learner runs its backward pass: in that order the two threads contended
  for the GIL and a demo worker's gradient phase took 268 ms instead of 124 ms.
- The tokenizer and task are fixed for the run (manifest tokenizer CID, spec task) and loaded once.
- A version that arrives whole but does not decode (`ModelError`, `PayloadError`, content over its
  cap) is broken for good: content-addressed bytes never change. It is remembered and logged once
  (`mark_broken`), and asking for it again raises `BrokenVersionError` at once, without another
  fetch; the worker works at the newest version before it that loads (`Contributor`). Content
  that cannot be had right now (missing, a timeout, a broken stream) raises the store's error,
  which the caller's `Backoff` retries.
- A version whose digests the chain read does not hold (zero: "not published") is not broken: the
  node that answered is behind the one that named the version newest (RPC providers balance reads
  over nodes), or a reorganisation took the publication back and it will come again. It raises
  `VersionNotPublishedError`, remembered nowhere: the contribution works at the version before it
  and the next look-up asks the chain again. Taken for broken, the version was refused for the
  rest of the process: every contribution of its window was made one version behind, and with
  S_max = 0 every one went stale. What the chain answered is read from the very call the loader
  made (`_Reading`), so a second read of another node cannot contradict it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from krill.protocol.spec import RunSpec
from krill.protocol.state import VersionState
from krill.worker.errors import BrokenVersionError, VersionNotPublishedError

_UNPUBLISHED = b"\x00" * 32  # the manifest digest the contract holds for a version it never published


def undecodable() -> tuple[type[Exception], ...]:
    """What a published version that arrived raises when its bytes are not a valid version."""
    from krill.errors import ModelError, PayloadError
    from krill.store.unixfs import ObjectTooLargeError

    return (ModelError, PayloadError, ObjectTooLargeError)


class RunSource:
    """Published versions of one run, from chain + store, cached by version."""

    def __init__(self, chain, store, spec: RunSpec, keep: int = 4, echo: Callable[[str], None] | None = None):
        self.chain = chain
        self.store = store
        self.spec = spec
        self.keep = max(2, int(keep))
        self.echo = echo
        self.broken: dict[int, str] = {}  # version -> why it does not decode
        self._states: OrderedDict[int, VersionState] = OrderedDict()
        self._lock = threading.Lock()
        self._fetching: dict[int, threading.Event] = {}  # versions being fetched, set when done
        self._tokenizer = None
        self._task = None

    def latest(self) -> int:
        return int(self.chain.run_of(self.spec.run_id).latest_version)

    def version(self, version: int) -> VersionState:
        """Version `version`, fetched and verified (shards and gradient masks included) on first use;
        `BrokenVersionError` if it does not decode (now or before)."""
        from krill.protocol.state import load_chain_version

        while True:
            with self._lock:  # guards the cache only: a fetch runs outside it
                if version in self.broken:
                    raise BrokenVersionError(f"version {version} is broken ({self.broken[version]})")
                state = self._states.get(version)
                if state is not None:
                    self._states.move_to_end(version)
                    return state
                fetching = self._fetching.get(version)
                mine = fetching is None
                if mine:
                    fetching = self._fetching[version] = threading.Event()
            if not mine:  # another thread is fetching this version: wait for it, then look again
                fetching.wait()
                continue
            try:
                reading = _Reading(self.chain)
                try:
                    state = load_chain_version(reading, self.store, self.spec, version)
                    state.all_tensors()  # fetch every shard now, while the caller handles outages
                    state.masks()
                except undecodable() as exc:
                    if reading.unpublished:
                        raise VersionNotPublishedError(f"version {version} is not published on the chain as read "
                                                       "(a node behind, or a reorganisation)") from exc
                    raise self.mark_broken(version, exc) from exc
                with self._lock:
                    self._states[version] = state
                    while len(self._states) > self.keep:
                        self._states.popitem(last=False)
                return state
            finally:  # on failure the waiters retry the fetch themselves (and meet the outage)
                with self._lock:
                    del self._fetching[version]
                fetching.set()

    def mark_broken(self, version: int, exc: Exception) -> BrokenVersionError:
        """Remember that `version` does not decode (logged the first time); returns the error to raise."""
        if isinstance(exc, BrokenVersionError):
            return exc
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        with self._lock:
            first = version not in self.broken
            reason = self.broken.setdefault(version, reason)
            self._states.pop(version, None)
        if first and self.echo is not None:
            self.echo(f"version {version} is broken and skipped ({reason}); the worker goes on at the newest "
                      "version before it that loads")
        return BrokenVersionError(f"version {version} is broken ({reason})")

    def is_broken(self, version: int) -> bool:
        return version in self.broken

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from krill.protocol.policy import load_tokenizer

            self._tokenizer = load_tokenizer(self.version(0))
        return self._tokenizer

    @property
    def task(self):
        if self._task is None:
            from krill.rl.tasks import get_task

            self._task = get_task(self.spec.task)
        return self._task

    def grad_lengths(self, version: int) -> dict[int, dict[str, int]]:
        """Per shard, tensor name -> number of values on version `version`'s public mask."""
        state = self.version(version)
        masks = state.masks()
        return {s: {n: int(masks[n].numel()) for n in state.manifest.shard_names(s)}
                for s in range(state.manifest.num_shards)}


class _Reading:
    """The chain as a version loader sees it, remembering whether its read of the version found it unpublished."""

    def __init__(self, chain):
        self.chain = chain
        self.unpublished = False

    def version_of(self, run_id, version: int):
        info = self.chain.version_of(run_id, version)
        self.unpublished = bytes(info.manifest_digest) == _UNPUBLISHED
        return info


class BehaviourPolicy:
    """The rollout engine, holding the weights of one version at a time; it takes over `learner`'s model
    (`hand_over`) when that already holds the version it is asked for."""

    def __init__(self, source: RunSource, learner: LearnerPolicy | None = None):
        self.source = source
        self.learner = learner
        self.engine = None

    def at(self, version: int):
        state = self.source.version(version)
        if self.engine is None:
            from krill.protocol.policy import build_model
            from krill.rl.engine.hf import HFEngine

            tok = self.source.tokenizer
            self.engine = HFEngine(build_model(state), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                                   version=version)
        elif self.engine.version != version and not self.hand_over(version):
            try:
                self.engine.load_state_dict(state.all_tensors(), version)
            except BaseException:
                self.engine = None  # its weights are half loaded: built afresh next time
                raise
        return self.engine

    def hand_over(self, version: int) -> bool:
        """Sample at `version` with the learner's model when the learner holds `version` and the engine
        does not: the two models trade places (both are `build_model`'s eval-mode models, and the
        gradient pass leaves no `.grad` behind) instead of the engine copying the weights in, and the
        learner loads its next version over the engine's old weights as it would have over its own.
        A worker sampling ahead samples each contribution at the version the previous one learned at,
        so this saves one weight load per contribution. Returns whether the models traded places."""
        learner, engine = self.learner, self.engine
        if engine is None or learner is None or learner.model is None or engine.version == version \
                or learner.version != version:
            return False
        learner.model, learner.version = engine.trade_model(learner.model, version)
        return True


class LearnerPolicy:
    """The model gradients are computed with, holding the weights of one version at a time."""

    def __init__(self, source: RunSource):
        self.source = source
        self.model = None
        self.version: int | None = None

    def at(self, version: int):
        from krill.protocol.policy import build_model, load_weights

        state = self.source.version(version)
        if self.model is None:
            self.model = build_model(state)
        elif self.version != version:
            self.version = None  # until the load completes, the weights are no version's
            load_weights(self.model, state)
        self.version = version
        return self.model, state
