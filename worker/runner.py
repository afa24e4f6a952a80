"""`krill worker run`: start up from the configuration, then contribute until told to stop.

Design decisions:
- Start-up checks everything a commit would need and says what to do when it is missing: the
  keystore (runtime.unlock_identity), the chain and the run (load_run checks the spec against the
  contract), and the stake: staked as a worker, with the keystore's Ed25519 key, above the
  minimum, not jailed. Each failure is a `WorkerError` naming the command that fixes it.
- Unreachable chain or store never stops the worker, at start-up or later (`Backoff`); nor does
  published content the store does not deliver yet, a failed upload, a published version that does
  not decode (skipped), or a contribution the chain will never take (another account committed its
  digest first, or its nonce was reused): each is logged and the worker goes on
  (`krill.worker.contribute`).
- The nonce sequence lives in the state directory; until that state records a recovery (first
  start, a state directory lost, or a start stopped during the recovery), the next nonce is
  recovered from this worker's `Committed` events before anything else, so a wiped disk cannot
  make the worker reuse a nonce.
- The stake is looked at again whenever a new version is published (not before every
  contribution: those chain reads were a fifth of the per-contribution overhead): by the version
  watcher once it has fetched the version (off every contribution's path; the loop raises what it
  found before submitting more), or, without a watcher, in the background thread just before the
  next commit. A worker slashed and jailed meanwhile stops with a clear message instead of sending
  commits the contract refuses, and a commit the contract refuses for the stake in between stops
  it the same way.
- The newest version a contribution read after sampling (its learner version) is the next
  contribution's behaviour version when it is under `REUSE_LATEST_S` old, instead of a second read
  moments later: chain reads were a fifth of the critical path.
- The newest version comes from a background `VersionWatcher` (every `worker.watch_interval_s`,
  fetching a new version's shards ahead) while its reading is fresh, else from the chain.
- Contribution n + 1 is made while contribution n is saved, uploaded and committed in a
  background thread (`SubmitPipeline`, one in flight); its outcome is reported when it is known. The
  per-version cap counts the commit in flight, and the commits that landed before this start (a
  resumed one included), read at start-up from this worker's `Committed` events since the oldest
  version it may still commit at was published; `max_contributions` stops making new work once
  the landed commits plus the one in flight reach it, and goes on if that one fails.
- Sample ahead (`worker.sample_ahead`): a worker that has its share of the newest version draws
  the next contribution's rollouts at it while the coordinator folds, then waits for the next
  version and takes the gradient there (rollouts one version behind, which the loss's truncated
  importance weights correct; the gradient fresh). Sampling leaves the version's critical path.
- `max_contributions` counts commits that landed (a resumed one included); dropped stale work
  does not count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from krill.config import KrillConfig
from krill.phases import phase, recording
from krill.worker.backoff import Backoff
from krill.worker.contribute import COMMITTED, Contributor, Outcome, jailed_message
from krill.worker.errors import JailedError, KeyMismatchError, NotStakedError
from krill.worker.nonce_state import WorkerState
from krill.worker.pipeline import SubmitPipeline
from krill.worker.watcher import VersionWatcher

REUSE_LATEST_S = 0.25  # how old the last contribution's read of the newest version may be to start the next


def check_eligible(chain, address: str, ed25519_key: bytes) -> None:
    """Raise a `WorkerError` unless `address` may commit as a worker with `ed25519_key`."""
    from krill.chain.types import Role

    info = chain.stake_of(address)
    if info.jailed:
        raise JailedError(jailed_message(address))
    if info.role == 0:
        raise NotStakedError(f"worker {address} has no stake: run `krill worker stake` first")
    if info.role != Role.WORKER:
        raise NotStakedError(f"account {address} is staked as {Role(info.role).name.lower()}, not as a worker: "
                             "use another keystore for the worker")
    if info.ed25519_public_key != ed25519_key:
        raise KeyMismatchError(f"account {address} is staked with Ed25519 key {info.ed25519_public_key.hex()[:16]}…, "
                               f"the keystore holds {ed25519_key.hex()[:16]}…: use the keystore you staked with")
    if not chain.is_eligible(address, Role.WORKER):
        from krill.staking import tokens

        minimum = chain.minimum_stake(Role.WORKER)
        raise NotStakedError(f"worker {address} has {tokens(info.staked)} KRILL staked, below the worker minimum of "
                             f"{tokens(minimum)} KRILL: top up with `krill worker stake --amount "
                             f"{tokens(minimum - info.staked)}`")


def recover_next_nonce(chain, run_id: bytes, worker: str, from_block: int) -> int:
    """One past the highest nonce this worker committed in the run (0 if none), from chain events."""
    from krill.chain.events import Committed

    highest = -1
    for ev in chain.events(from_block, kinds=(Committed,)):
        if ev.run_id == run_id and ev.worker.lower() == worker.lower():
            highest = max(highest, ev.nonce)
    return highest + 1


def recover_nonces(state: WorkerState, chain, run_id: bytes, worker: str, from_block: int, backoff: Backoff) -> None:
    """Move `state` past every nonce `worker` committed in the run, unless a recovery was already recorded."""
    if not state.recovered:
        state.recovered_to(backoff.call(lambda: recover_next_nonce(chain, run_id, worker, from_block),
                                        "chain (events)"))


def committed_per_version(chain, run_id: bytes, worker: str) -> dict[int, int]:
    """This worker's commits per version at the versions it may still commit at (the newest and the S_max
    before it), from its `Committed` events since the oldest of those was published (a few blocks' scan)."""
    from krill.chain.events import Committed

    run = chain.run_of(run_id)
    lowest = max(0, run.latest_version - run.params.max_staleness)
    from_block = chain.version_of(run_id, lowest).published_block or run.created_block
    counts: dict[int, int] = {}
    for ev in chain.events(from_block, kinds=(Committed,)):
        if ev.run_id == run_id and ev.worker.lower() == worker.lower() and ev.version >= lowest:
            counts[ev.version] = counts.get(ev.version, 0) + 1
    return counts


@dataclass
class WorkerSession:
    """Everything a running worker holds."""

    config: KrillConfig
    identity: object
    chain: object
    store: object
    spec: object
    state: WorkerState
    contributor: Contributor
    backoff: Backoff


def resolve_shards(wanted: list[int] | None, num_shards: int) -> list[int]:
    from krill.errors import ConfigError

    if wanted is None:
        return list(range(num_shards))
    bad = [s for s in wanted if not 0 <= s < num_shards]
    if bad or not wanted:
        raise ConfigError(f"worker.shards: {wanted} must be a non-empty list of shards in 0..{num_shards - 1}")
    return sorted(set(wanted))


def open_session(config: KrillConfig, behavior_name: str, echo: Callable[[str], None],
                 prompt: Callable[[], str] | None = None) -> WorkerSession:
    from krill.protocol.state import load_run
    from krill.protocol.work import Identity
    from krill.runtime import (
        connect_chain,
        open_configured_store,
        role_state_dir,
        run_id_of,
        unlock_identity,
    )
    from krill.worker.behaviors import get_behavior
    from krill.worker.source import RunSource

    behavior = get_behavior(behavior_name)
    run_id = run_id_of(config)
    identity = unlock_identity(config, prompt)
    backoff = Backoff(config.worker.poll_interval_s, config.worker.max_backoff_s, echo)
    # A store not reachable yet (a Kubo daemon still starting; an embedded repo whose node another process
    # holds for a while, as `krill worker status` does) is waited for, as the verifier's start does.
    store = backoff.call(lambda: open_configured_store(config), "store (open)")
    chain = backoff.call(lambda: connect_chain(config, identity.account), "chain (connect)")
    spec = backoff.fetch(lambda: load_run(chain, store, run_id), "chain/store (run spec)")
    backoff.call(lambda: check_eligible(chain, identity.address, identity.ed25519_public_key), "chain (stake)")
    state = WorkerState.open(role_state_dir(config, "worker", identity.address), run_id, identity.address)
    recover_nonces(state, chain, run_id, identity.address, config.chain.deploy_block, backoff)
    chain_id = backoff.call(lambda: chain.w3.eth.chain_id, "chain (chain id)")
    who = Identity(chain_id, chain.address, identity.address, identity.signing_key)
    shards = resolve_shards(config.worker.shards, spec.num_shards)
    source = RunSource(chain, store, spec, keep=spec.staleness.max_staleness + 2, echo=echo)
    contributor = Contributor(chain, store, spec, source, who, behavior, shards, state, backoff, echo)
    return WorkerSession(config, identity, chain, store, spec, state, contributor, backoff)


def run_worker(config: KrillConfig, behavior: str | None = None, max_contributions: int | None = None,
               echo: Callable[[str], None] = print, on_outcome: Callable[[Outcome], None] | None = None,
               prompt: Callable[[], str] | None = None) -> list[Outcome]:
    """Contribute until `max_contributions` commits landed (None: forever); returns the outcomes.

    `on_outcome` sees each outcome after its status line (the CLI's progress bar); `prompt` asks for the
    keystore password when the configuration has none."""
    from krill.runtime import apply_cpu_settings

    apply_cpu_settings(config.worker)
    behavior = behavior or config.worker.behavior
    limit = max_contributions if max_contributions is not None else config.worker.max_contributions
    session = open_session(config, behavior, echo, prompt)
    s = session
    echo(f"worker {s.identity.address} | run {s.spec.run_id.hex()[:16]}… ({s.spec.name}) | behaviour {behavior} | "
         f"shards {s.contributor.shards} | next nonce {s.state.next_nonce}"
         + (f" | resuming nonce {s.state.pending.nonce}" if s.state.pending else ""))
    tally = _Tally(echo, on_outcome)
    tally.report(s.contributor.resume())
    # The cap counts what landed before this start too (a resumed commit included): read from the chain,
    # after the resume, so nothing is counted twice.
    tally.per_version = s.backoff.call(lambda: committed_per_version(s.chain, s.spec.run_id, s.identity.address),
                                       "chain (events)")

    def eligible() -> None:
        check_eligible(s.chain, s.identity.address, s.identity.ed25519_public_key)

    def check_stake() -> None:
        s.backoff.call(eligible, "chain (stake)")

    pipeline = SubmitPipeline(s.contributor)
    if config.worker.watch_interval_s > 0:
        from krill.chain.heads import HeadWaiter, publications_of

        heads = HeadWaiter.for_chain(s.chain, publications_of(s.chain.address, s.spec.run_id))
        s.contributor.watcher = VersionWatcher(s.contributor.source, config.worker.watch_interval_s,
                                               on_new_version=lambda _: eligible(), heads=heads,
                                               max_staleness=s.spec.staleness.max_staleness).start()
    try:
        _contribute_loop(s, config, pipeline, tally, limit, check_stake)
    finally:
        if s.contributor.watcher is not None:
            s.contributor.watcher.stop()
        if not pipeline.in_flight:  # one still in flight (an exception stopped the loop) stays a daemon
            pipeline.close()
    return tally.outcomes


class _Tally:
    """The outcomes of one `run_worker`: each echoed and handed to `on_outcome`, commits counted (per version too)."""

    def __init__(self, echo: Callable[[str], None], on_outcome: Callable[[Outcome], None] | None):
        self.echo, self.on_outcome = echo, on_outcome
        self.outcomes: list[Outcome] = []
        self.committed = 0
        self.per_version: dict[int, int] = {}  # commits that landed, per version

    def report(self, outcome: Outcome | None) -> None:
        if outcome is None:
            return
        self.echo(outcome.line())
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        self.outcomes.append(outcome)
        self.committed += outcome.status == COMMITTED
        if outcome.status == COMMITTED and outcome.model_version is not None:  # a resumed one that landed too
            self.per_version[outcome.model_version] = self.per_version.get(outcome.model_version, 0) + 1


def _contribute_loop(s: WorkerSession, config: KrillConfig, pipeline: SubmitPipeline, tally: _Tally,
                     limit: int | None, check_stake: Callable[[], None]) -> None:
    """Make contributions and hand them to `pipeline` until `limit` commits landed (None: forever)."""
    from krill.runtime import freeze_heap

    report, per_version = tally.report, tally.per_version
    cap = config.worker.max_per_version
    checked_at: int | None = None  # the newest version seen when a submission last took the stake check
    watcher = s.contributor.watcher

    def interrupt() -> None:
        """Raise what stops this worker: its watcher's finding (jailed, stake too low), or the
        exception its submission in flight ended with."""
        if watcher is not None and watcher.problem is not None:
            raise watcher.problem
        if pipeline.failed():
            pipeline.wait()

    while True:
        interrupt()
        if pipeline.done():
            report(pipeline.wait())
        if limit is not None and tally.committed + pipeline.in_flight >= limit:
            if not pipeline.in_flight:
                break
            report(pipeline.wait())  # the last one may still fail (stale): then the loop goes on
            continue
        with recording() as phases:  # this contribution's phases, its chain reads included
            started = time.perf_counter()
            latest = s.contributor.newest(REUSE_LATEST_S)
            at_latest = per_version.get(latest, 0) + (pipeline.model_version == latest)
            learn_after = None
            if cap is not None and at_latest >= cap:
                # This version has our share; a gradient taken at it now would only go stale.
                if config.worker.sample_ahead:
                    learn_after = latest  # sample now, take the gradient at the next version
                elif pipeline.in_flight:
                    report(pipeline.wait())
                    continue
                else:
                    s.contributor.wait_newer(latest, config.worker.poll_interval_s)
                    continue
            made = s.contributor.make(latest, started, learn_after, config.worker.poll_interval_s, interrupt)
            if isinstance(made, Outcome):
                report(made)
                continue
            with phase("wait_submit"):
                previous = pipeline.wait()
        report(previous)
        freeze_heap()  # once per process: the models are loaded by the first contribution
        interrupt()  # what the watcher found while this one was made
        # The stake is checked once per new version: by the watcher where one runs, else before the commit.
        pipeline.start(made, phases, before=check_stake if watcher is None and latest != checked_at else None)
        checked_at = latest
