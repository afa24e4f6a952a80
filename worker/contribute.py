"""One contribution: sample -> learn -> package -> save -> upload -> commit, and resuming one.

Design decisions:
- The behaviour version b is the newest published version when sampling starts; after sampling
  the worker looks again and learns at the newest version v it can reach (v - b <= S_max), so
  rollouts are never thrown away just because the coordinator moved on while they were sampled.
  If even that gap exceeds S_max the rollouts are dropped (and recorded). A reading after sampling
  that is below b (a reorganisation took the publication of b back, or an RPC node behind the one
  read before answered) learns at b: the learner version is never below the behaviour version (the
  search for a loadable learner version ran from v down to b, found none, and stopped the worker
  with "each is broken"); if b is really gone, the commit's estimate says so and the work is logged
  stale.
- The work itself is `krill.protocol.work` (sample / learn / package), the code verifiers replay;
  the strategy (`behaviors`) hooks in at each stage (sampling, rewards, gradients, signing, the
  committed version, the upload); the honest strategy's hooks are exactly the core functions.
- Crash safety comes from `WorkerState`: the nonce is handed out before sampling and made durable
  with the signed bytes, which are saved and named as pending before anything is uploaded or
  committed; the pending entry is cleared only once the outcome is logged. `submit` is
  idempotent: resuming, it first asks the chain whether the digest is already committed (a
  restart after the commit landed), and it treats a duplicate revert the same way (a retry after
  a receipt was lost). A fresh contribution skips the look-up: its nonce was never saved before,
  so its digest cannot be on-chain, and the duplicate-revert path covers the impossible case.
- Making (`make`: sample, learn), packaging (`package`: compress, serialise, hash, sign) and saving
  (`save`) are separate steps so that the worker's loop can make the next contribution while the
  previous one is packaged, saved, uploaded and committed in the background
  (`krill.worker.pipeline`); `contribute` runs all of it in this thread.
- A contribution that does not encode under the run's rules (`PayloadError` from packaging: a
  gradient that is not finite or overflows the run's fp16 codec, a payload over the run's limits)
  is logged `unencodable` and dropped, its nonce made durable as used, and the worker goes on.
  Sampling and learning are deterministic in (worker, version, nonce): raised, it stopped the
  worker, and every restart made the same contribution again (its nonce was never saved) and
  stopped on it again, for as long as that version was the newest. A published version whose
  finite but huge weights blow the gradient up does that (`fetch_shard` checks only that weights
  are finite).
- Such weights can overflow the logits already, while sampling: the engine raises
  `NonFiniteLogitsError`, and the version is marked broken (`RunSource.mark_broken`) and the
  rollouts sampled again, under the same nonce, at the newest version before it that loads, as for
  a version that does not decode. Uncaught, the sampler's error stopped the worker on every
  restart for as long as that version was the newest. The learner never takes the gradient at a
  version marked broken (`_loadable` skips it).
- Staleness at commit time is the contract's call alone: if the coordinator moved past v + S_max
  meanwhile, `commit` reverts with `CommitVersionTooStale` during gas estimation (no gas spent);
  the work is dropped, recorded, and the loop goes on. A local pre-check would only duplicate the
  rule and race the chain anyway.
- Unreachable chain or store: every network call goes through `Backoff`, which waits and retries;
  fetching a published version also waits for content the store does not deliver yet, and an
  upload retries a store that fails it (a timeout, an HTTP 5xx).
- A published version that does not decode is skipped (`RunSource.mark_broken` logs it once): the
  contribution samples or learns at the newest version before it that loads, no further back than
  the staleness bound allows, and if none does, the worker waits for a newer version.
- A contribution the chain will never take under its digest is logged and dropped, and the worker
  goes on with its next nonce (the saved one was made durable as used): `front-run` when another
  account committed the same header digest first (it is public in the mempool; the header names
  this worker, so verifiers fail that commit), `nonce-reused` when this worker already committed
  this (version, nonce) under another digest (a state that lost its nonce sequence). Stopping on
  either left the contribution pending, and every restart stopped on it again.
- Those verdicts are read at the latest block, never guessed from the pending one: the commit's
  estimate runs against the pending block, where our own earlier transaction of the same digest may
  still sit (a receipt that timed out and was retried). So the id a duplicate revert names may be
  only the id that pending transaction would get, and at the latest block that id may hold anyone's
  commit (ours landed under another id, or has not landed yet). After a duplicate revert the digest's
  commit is looked up first (ours: committed; another's: front-run); `nonce-reused` is decided only when the commit the
  revert names is mined and is this worker's commit of this run, version and nonce under another
  digest; anything else waits for the next block and commits again (the estimate refuses while ours
  is pending). A contribution whose own transaction may still land is never logged as lost nor its
  bytes deleted.
- A commit that passed its estimate can still fail once mined (status 0): what beat it landed in
  the same block, ahead of it (a front-runner's copy of the digest, a `publishVersion` that made
  it stale). `krill.chain.tx` names that revert where a replay recovers it, and the cases above
  handle it; a failure no replay explains (`TransactionFailed`) is classified from the chain as a
  resumed submit is: the digest's commit (ours: committed; another's: front-run), else the latest
  version (stale), else the stake (jailed, not staked), else the commit is sent once more and a
  second such failure stops the worker. Those stake reads go through `Backoff` like every other
  chain read: an RPC blip while classifying a failure that retrying the commit would have cured
  stopped the worker with `ChainUnavailableError`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from krill.phases import current, phase, recording
from krill.protocol.spec import RunSpec
from krill.worker.backoff import Backoff
from krill.worker.behaviors import Behavior
from krill.worker.errors import (
    BrokenVersionError,
    JailedError,
    NotStakedError,
    VersionNotPublishedError,
    WorkerStateError,
)
from krill.worker.nonce_state import Pending, WorkerState
from krill.worker.source import BehaviourPolicy, LearnerPolicy, RunSource, undecodable

COMMITTED, STALE, ROLLOUTS_STALE = "committed", "stale", "rollouts-stale"
FRONT_RUN, NONCE_REUSED = "front-run", "nonce-reused"  # contributions the chain will never take (see above)
UNENCODABLE = "unencodable"  # a contribution that does not encode under the run's rules (see above)
T = TypeVar("T")


@dataclass
class Outcome:
    """What became of one nonce."""

    status: str
    nonce: int
    behaviour_version: int
    model_version: int | None = None
    commit_id: int | None = None
    digest: str | None = None
    mean_reward: float | None = None
    true_mean_reward: float | None = None
    tokens: int = 0
    bytes_uploaded: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    resumed: bool = False
    detail: str = ""
    # Finer phases inside `seconds` (rollout, reward, gradient, compress, hash, sign, save, chain_*,
    # fetch_version, wait_submit; `krill.phases`), for `krill bench protocol`; empty for a resumed
    # commit. A pipelined contribution (`krill.worker.pipeline`) also has seconds["foreground"]: the
    # part of `total` on the worker's critical path, before its save, upload and commit went to the
    # background.
    phases: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict:
        return asdict(self) | {"time": round(time.time(), 3)}

    def line(self) -> str:
        """The one-line status of this contribution."""
        s = self.seconds
        rate = self.tokens / s["sample"] if s.get("sample") else 0.0
        parts = [f"nonce {self.nonce}",
                 f"b{self.behaviour_version}->v{self.model_version if self.model_version is not None else '-'}"]
        if self.mean_reward is not None:
            forged = (self.true_mean_reward is not None and abs(self.true_mean_reward - self.mean_reward) > 1e-9)
            parts.append(f"reward {self.mean_reward:.3f}" + (f" (true {self.true_mean_reward:.3f})" if forged else ""))
        parts += [f"{self.tokens} tok", f"{rate:,.0f} tok/s", f"up {self.bytes_uploaded / 1024:.1f} KiB"]
        if self.status == COMMITTED:
            parts.append(f"commit #{self.commit_id}" + (" (resumed)" if self.resumed else ""))
        else:
            parts.append(f"{self.status.upper()}: {self.detail}")
        phases = " ".join(f"{k} {v:.2f}" for k, v in s.items() if k != "total")
        parts.append(f"{phases} total {s.get('total', 0.0):.2f}s")
        return " | ".join(parts)


@dataclass
class Made:
    """A contribution sampled and learned, not yet packaged (`Contributor.package` compresses and signs it)."""

    work: object  # the `behaviors.Work` it was made with
    sampled: object  # `protocol.work.Sampled` (rewards as reported)
    learned: object  # `protocol.work.Learned` (gradients as the behaviour submits them)
    nonce: int
    behaviour_version: int
    model_version: int  # the version it is committed under
    summary: dict
    seconds: dict
    started: float  # `perf_counter` when the caller began it


class Contributor:
    """Makes and submits contributions for one worker in one run."""

    def __init__(self, chain, store, spec: RunSpec, source: RunSource, who, behavior: Behavior,
                 shards: list[int], state: WorkerState, backoff: Backoff, echo: Callable[[str], None] = print):
        self.chain, self.store, self.spec, self.source = chain, store, spec, source
        self.who, self.behavior, self.shards, self.state = who, behavior, list(shards), state
        self.backoff, self.echo = backoff, echo
        self.learner = LearnerPolicy(source)
        self.behaviour = BehaviourPolicy(source, self.learner)
        self._seen_latest: tuple[int, float] | None = None  # (newest version, monotonic time) `make` last read
        self.watcher = None  # a started `VersionWatcher`, when the worker runs one

    def newest(self, reuse_s: float = 0.0) -> int:
        """The newest published version: the watcher's reading while it is fresh, else the one the last
        `make` read after sampling if under `reuse_s` old (used once), else a chain read."""
        seen, self._seen_latest = self._seen_latest, None
        v = self.watcher.latest() if self.watcher is not None else None
        if v is None and seen is not None and time.monotonic() - seen[1] <= reuse_s:
            v = seen[0]
        if v is None:
            with phase("chain_read"):
                v = self.backoff.call(self.source.latest, "chain (latest version)")
        return v

    def wait_newer(self, than: int, timeout_s: float) -> None:
        """Return once a version newer than `than` is seen, or after `timeout_s` (the watcher's wake-up
        where one runs, a plain sleep otherwise)."""
        if self.watcher is not None:
            self.watcher.wait_newer(than, timeout_s)
        else:
            time.sleep(timeout_s)

    # ------------------------------------------------------------------ produce
    def contribute(self) -> Outcome:
        """Make one contribution at the newest versions and submit it (in this thread)."""
        with recording():
            prepared = self.prepare()
            if isinstance(prepared, Outcome):
                return prepared
            return self.submit(*prepared, resumed=False)

    def prepare(self):
        """`make`, `package`, then `save`: the arguments of `submit`, or the Outcome of rollouts that went
        stale."""
        made = self.make()
        if isinstance(made, Outcome):
            return made
        packaged = self.package(made)
        if isinstance(packaged, Outcome):
            return packaged
        self.save(packaged)
        return packaged

    def make(self, behaviour_version: int | None = None, started: float | None = None,
             learn_after: int | None = None, poll_s: float = 0.5, interrupt: Callable[[], None] | None = None):
        """Sample and learn a contribution, nothing signed or saved yet: a `Made` for `package`, or the
        Outcome of rollouts that went stale while they were sampled.

        `behaviour_version`: the newest version as the caller just read it (saves a chain read);
        `started`: when the caller began this contribution (`perf_counter`; default now);
        `learn_after`: sample ahead: once the rollouts are drawn, wait (phase `wait_version`, checking
        every `poll_s` or on the watcher's news) for a version newer than this one and take the
        gradient there; `interrupt` is called on every round of that wait and may raise to end it
        (the worker's loop raises what its watcher or its submission in flight found wrong: a worker
        jailed meanwhile must not wait for a version it can never commit at)."""
        from krill.protocol.work import learn
        from krill.rl.engine.base import NonFiniteLogitsError
        from krill.worker.behaviors import Work

        started = time.perf_counter() if started is None else started
        newest = behaviour_version
        if newest is None:
            newest = self.newest()
        nonce = None
        waited_at = None  # the newest version while none within S_max of it loads (said once per version)
        while True:  # until the rollouts are sampled at a version that loads and samples
            with phase("fetch_version"):
                while True:
                    try:
                        b, engine = self._loadable(newest, self.behaviour.at, "behaviour",
                                                   max(0, newest - self.spec.staleness.max_staleness))
                        break
                    except BrokenVersionError as exc:
                        if waited_at != newest:
                            self.echo(f"{exc}; waiting for a newer version")
                            waited_at = newest
                        if interrupt is not None:
                            interrupt()
                        self.wait_newer(newest, poll_s)
                        newest = self.newest()
                tok = self.backoff.fetch(lambda: self.source.tokenizer, "tokenizer (version 0)")
            task = self.source.task
            if nonce is None:  # a sampling that failed used nothing of its nonce: the retry keeps it
                nonce = self.state.reserve_nonce()
            work = Work(self.spec, task, tok, self.who, nonce, chain=self.chain, store=self.store,
                        source=self.source, engine=engine, shards=self.shards)
            try:
                sampled = self.behavior.sample(work)
                break
            except NonFiniteLogitsError as exc:  # its weights overflow: the version is broken (module notes)
                self.source.mark_broken(b, exc)
        true_rewards = sampled.rewards
        sampled.rewards = self.behavior.reported_rewards(true_rewards)
        seconds = {"sample": sampled.seconds}
        summary = {"mean_reward": float(sampled.rewards.mean()), "true_mean_reward": float(true_rewards.mean()),
                   "tokens": int(sampled.rollouts.num_completion_tokens)}
        v = self.newest()
        if learn_after is not None and v <= learn_after:
            with phase("wait_version"):
                while v <= learn_after:
                    if interrupt is not None:
                        interrupt()
                    self.wait_newer(learn_after, poll_s)
                    v = self.newest()
        self._seen_latest = (v, time.monotonic())
        v = max(v, b)  # a reading below b (see the module docstring) learns at b: the contract judges the commit
        if v - b > self.spec.staleness.max_staleness:
            outcome = Outcome(ROLLOUTS_STALE, nonce, b, v, seconds=seconds | {"total": time.perf_counter() - started},
                              detail=f"rollouts of version {b} are more than S_max={self.spec.staleness.max_staleness} "
                                     f"behind version {v}", phases=current(), **summary)
            self.state.drop(nonce, outcome.record())
            return outcome
        with phase("fetch_version"):  # b loaded: at worst the learner takes the gradient there
            v, (model, learner_state) = self._loadable(v, self.learner.at, "learner", b)
        learned = learn(self.spec, model, learner_state, sampled, self.shards, tok.pad_token_id)
        work.learner, work.learner_state = model, learner_state
        learned.values = self.behavior.gradients(work, sampled, learned.values)
        seconds["learn"] = learned.seconds
        return Made(work, sampled, learned, nonce, b, self.behavior.commit_version(work, v, v), summary, seconds,
                    started)

    def _loadable(self, version: int, load: Callable[[int], T], role: str, lowest: int) -> tuple[int, T]:
        """(v, `load(v)`) at the newest v in `lowest..version` that is not broken, fetched through the back-off
        (content the store does not deliver yet is waited for); `BrokenVersionError` if every one is broken."""
        from krill.rl.engine.base import EngineError

        for v in range(version, lowest - 1, -1):
            if self.source.is_broken(v):
                continue
            try:
                return v, self.backoff.fetch(lambda v=v: load(v), f"version {v} ({role})")
            except VersionNotPublishedError as exc:  # not there yet as the chain was read: asked again next time
                self.echo(f"{exc}; working at the version before it")
            except (*undecodable(), EngineError) as exc:  # its weights do not fit the model: broken too
                self.source.mark_broken(v, exc)
        raise BrokenVersionError(f"no version in {lowest}..{version} can be loaded (each is broken or not published)")

    def package(self, made: Made):
        """Compress, serialise, hash and sign a `Made` contribution: the arguments of `submit` (save them
        first), or the Outcome of one that does not encode (logged and dropped; see the module docstring).
        A pipelined worker runs this in its submission thread (`krill.worker.pipeline`)."""
        from krill.errors import PayloadError

        t = time.perf_counter()
        try:
            header, files = self.behavior.sign(made.work, made.sampled, made.learned)
        except PayloadError as exc:
            seconds = dict(made.seconds) | {"package": time.perf_counter() - t}
            outcome = Outcome(UNENCODABLE, made.nonce, made.behaviour_version, made.model_version,
                              seconds=seconds | {"total": time.perf_counter() - made.started},
                              detail=f"the contribution does not encode under the run's rules ({exc}); it is "
                                     "dropped and the worker goes on with its next nonce",
                              phases=current(), **made.summary)
            self.state.drop(made.nonce, outcome.record())
            return outcome
        header_bytes = header.encode()
        pending = Pending(model_version=made.model_version, behaviour_version=made.behaviour_version,
                          nonce=made.nonce, digest=header.digest.hex(), files=sorted(files), summary=made.summary)
        seconds = dict(made.seconds) | {"package": time.perf_counter() - t}
        return pending, header_bytes, files, seconds, made.started

    def save(self, made) -> None:
        """Make a contribution from `make` durable and name it as pending (before any upload or commit)."""
        pending, header_bytes, files, seconds, _ = made
        t = time.perf_counter()
        with phase("save"):
            self.state.save_pending(pending, header_bytes, files)
        seconds["save"] = time.perf_counter() - t

    def resume(self) -> Outcome | None:
        """Finish the pending commit a previous run left, if any."""
        pending = self.state.pending
        if pending is None:
            return None
        header, files = self.state.pending_payload()
        return self.submit(pending, header, files, {}, time.perf_counter(), resumed=True)

    # ------------------------------------------------------------------ submit
    def _outcome(self, status: str, pending: Pending, seconds: dict, started: float, resumed: bool, **kw) -> Outcome:
        seconds = dict(seconds) | {"total": time.perf_counter() - started}
        s = pending.summary
        return Outcome(status, pending.nonce, pending.behaviour_version, pending.model_version, digest=pending.digest,
                       mean_reward=s.get("mean_reward"), true_mean_reward=s.get("true_mean_reward"),
                       tokens=int(s.get("tokens", 0)), seconds=seconds, resumed=resumed, phases=current(), **kw)

    def _finish(self, outcome: Outcome) -> Outcome:
        self.state.finish(outcome.record())
        return outcome

    def _commit_of_digest(self, digest: bytes) -> tuple[int, str]:
        """(id, committer) of the commit of `digest`; (0, "") if there is none."""
        commit_id = self.backoff.call(lambda: self.chain.commit_id_by_digest(digest), "chain (commit lookup)")
        if commit_id == 0:
            return 0, ""
        info = self.backoff.call(lambda: self.chain.commit_of(commit_id), "chain (commit lookup)")
        return commit_id, info.worker

    def _mine(self, committer: str) -> bool:
        return committer.lower() == self.who.worker.lower()

    def _front_run(self, pending: Pending, seconds: dict, started: float, resumed: bool, commit_id: int,
                   committer: str, uploaded: int) -> Outcome:
        """Log and drop a contribution whose digest another account committed first."""
        detail = (f"header digest {pending.digest} was committed first by {committer} (commit #{commit_id}), "
                  "not by this worker; the contribution is lost and the worker goes on with its next nonce")
        return self._finish(self._outcome(FRONT_RUN, pending, seconds, started, resumed, bytes_uploaded=uploaded,
                                          detail=detail))

    def submit(self, pending: Pending, header: bytes, files: dict[str, bytes], seconds: dict, started: float,
               resumed: bool) -> Outcome:
        """Upload and commit a saved contribution (idempotent; see the module docstring)."""
        from krill.chain import errors as E
        from krill.chain.events import Committed
        from krill.chain.tx import TransactionFailed

        digest = bytes.fromhex(pending.digest)
        if resumed:  # a fresh contribution's digest cannot be on-chain yet (its nonce was just reserved)
            with phase("chain_read"):
                existing, committer = self._commit_of_digest(digest)
            if existing and self._mine(committer):
                return self._finish(self._outcome(COMMITTED, pending, seconds, started, resumed, commit_id=existing))
            if existing:
                return self._front_run(pending, seconds, started, resumed, existing, committer, 0)
        t = time.perf_counter()
        uploaded = self._upload(header, files) if self.behavior.uploads else 0
        seconds = dict(seconds) | {"upload": time.perf_counter() - t}
        t = time.perf_counter()
        retried_failure = False
        waited = False
        while True:
            try:
                receipt = self.backoff.call(lambda: self.chain.commit(self.spec.run_id, pending.model_version,
                                                                      pending.nonce, digest), "chain (commit)")
                commit_id = receipt.event(Committed).commit_id
                break
            except (E.CommitVersionTooStale, E.CommitVersionFromFuture) as exc:
                seconds["commit"] = time.perf_counter() - t
                return self._finish(self._outcome(STALE, pending, seconds, started, resumed, bytes_uploaded=uploaded,
                                                  detail=f"contract: {exc}"))
            except (E.CommitDuplicate, E.CommitDigestTaken) as exc:
                # Ours already (a retry after a lost receipt), ours still in the pool (a receipt that timed
                # out), someone else's copy of our digest, or our (version, nonce) taken by another digest.
                taken = self._taken(exc, pending, digest)
                if taken is None:
                    waited = self._wait_block(pending, exc, waited)
                    continue
                seconds["commit"] = time.perf_counter() - t
                commit_id, committer = taken
                if not commit_id:
                    detail = (f"nonce {pending.nonce} at version {pending.model_version} is already committed by "
                              f"this worker under another digest ({exc}): its nonce sequence was reused; the "
                              "contribution is lost and the worker goes on with its next nonce")
                    return self._finish(self._outcome(NONCE_REUSED, pending, seconds, started, resumed,
                                                      bytes_uploaded=uploaded, detail=detail))
                if not self._mine(committer):
                    return self._front_run(pending, seconds, started, resumed, commit_id, committer, uploaded)
                break
            except TransactionFailed as exc:
                # Mined and failed, and no replay said why: classified from the chain as a resumed submit is.
                seconds["commit"] = time.perf_counter() - t
                commit_id, committer = self._commit_of_digest(digest)
                if commit_id and not self._mine(committer):
                    return self._front_run(pending, seconds, started, resumed, commit_id, committer, uploaded)
                if commit_id:
                    break
                run = self.backoff.call(lambda: self.chain.run_of(self.spec.run_id), "chain (run)")
                if pending.model_version + run.params.max_staleness < run.latest_version:
                    detail = (f"contract: version {pending.model_version} is more than S_max="
                              f"{run.params.max_staleness} behind version {run.latest_version} ({exc})")
                    return self._finish(self._outcome(STALE, pending, seconds, started, resumed,
                                                      bytes_uploaded=uploaded, detail=detail))
                self._check_stake(exc, refused=False)
                if retried_failure:
                    raise
                retried_failure = True  # its estimate now names what refuses it, if anything still does
                self.echo(f"{exc}; the digest is not committed and version {pending.model_version} is not stale: "
                          "committing again")
            except (E.StakeJailed, E.StakeNotEligible) as exc:
                self._check_stake(exc, refused=True)
        seconds["commit"] = time.perf_counter() - t
        return self._finish(self._outcome(COMMITTED, pending, seconds, started, resumed, commit_id=commit_id,
                                          bytes_uploaded=uploaded))

    def _taken(self, exc, pending: Pending, digest: bytes) -> tuple[int, str] | None:
        """What a duplicate revert found, at the latest block: (id, committer) of the commit of `digest`, or
        (0, "") when this worker's commit of our (run, version, nonce) is mined under another digest; None
        otherwise: what took our key or digest is only in the pending block the estimate ran against (most
        likely our own earlier transaction), and the id a `CommitDuplicate` names is then only the id it would
        get, which at the latest block may be anyone's commit or none."""
        from krill.chain import errors as E
        from krill.chain.types import to_bytes32

        commit_id, committer = self._commit_of_digest(digest)
        if commit_id:
            return commit_id, committer
        if isinstance(exc, E.CommitDuplicate):
            named = int(exc.revert_args[-1])
            info = self.backoff.call(lambda: self.chain.commit_of(named), "chain (commit lookup)")
            if (self._mine(info.worker) and bytes(info.run_id) == to_bytes32(self.spec.run_id, "run_id")
                    and (info.version, info.nonce) == (pending.model_version, pending.nonce)
                    and bytes(info.header_digest) != digest):
                return 0, ""
        return None

    def _wait_block(self, pending: Pending, exc: Exception, said: bool) -> bool:
        """Wait for the next block (what took our key or digest in the pending block lands or leaves the pool
        by then); says why once per contribution. Returns True (said)."""
        if not said:
            self.echo(f"nonce {pending.nonce}: the contract refuses its commit at the pending block ({exc}), but "
                      "no commit of it is mined yet (our own transaction still in the pool?); waiting for the "
                      "next block to decide")
        first = self.backoff.call(self.chain.block_number, "chain (block number)")
        while self.backoff.call(self.chain.block_number, "chain (block number)") <= first:
            self.backoff.sleep(self.backoff.initial_s)
        return True

    def _check_stake(self, exc: Exception, refused: bool) -> None:
        """Raise `JailedError` or `NotStakedError` if the stake is why the contract refused a commit (`refused`:
        the contract said so; otherwise the stake is read and judged here)."""
        from krill.chain.types import Role

        info = self.backoff.call(lambda: self.chain.stake_of(self.who.worker), "chain (stake)")
        if info.jailed:
            raise JailedError(jailed_message(self.who.worker)) from exc
        if refused or not self.backoff.call(lambda: self.chain.is_eligible(self.who.worker, Role.WORKER),
                                            "chain (stake)"):
            raise NotStakedError(f"the contract refuses commits of {self.who.worker} ({exc}): "
                                 "run `krill worker stake`") from exc

    def _upload(self, header: bytes, files: dict[str, bytes]) -> int:
        """Store every file and the header block; check the store names them as the header does."""
        from krill.store.cid import normalize_cid, raw_block_cid

        refs = json.loads(header)["files"]
        total = 0
        for name, data in sorted(files.items()):
            cid = self.backoff.upload(lambda data=data: self.store.add(data, pin=True), f"store (upload {name})")
            if normalize_cid(cid) != normalize_cid(refs[name]["cid"]):
                raise WorkerStateError(f"store named {name} {cid}, the header says {refs[name]['cid']}")
            total += len(data)
        cid = self.backoff.upload(lambda: self.store.put_block(header, pin=True), "store (upload header)")
        if normalize_cid(cid) != raw_block_cid(header):
            raise WorkerStateError(f"store named the header {cid}, expected {raw_block_cid(header)}")
        return total + len(header)


def jailed_message(worker: str) -> str:
    return (f"worker {worker} is jailed: a commit of it was slashed after failing verification, and the "
            "contract refuses its commits from now on. Stop this worker; a new account "
            "(`krill worker init --keystore NEW_NAME`, then `krill worker stake`) is needed to contribute again")
