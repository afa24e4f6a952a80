"""The verifier's loop: see commits on-chain, decide which to check, replay, attest; survive everything.

Design decisions:
- Two persisted things drive it (`state.VerifierState`): the block cursor over Committed events
  and the set of pending commits. Each pass handles pending commits oldest first, which is also
  nearest deadline first, and re-reads the chain head after each replay, since replays are the
  slow part and windows are counted in blocks. Commits that end at the draw share one head and
  one read of each randomness block per pass (`PassReads`).
- Per commit: window still open (if not: missed, unless the draw passes over it, which makes it
  `skipped` as in time: a verifier down for a while, or starting on a run under way, used to report
  every commit of the gap as missed; or unless this account's attestation is on-chain, which makes
  it attested: a verifier stopped while its attestation was on its way, a Ctrl-C during the receipt
  wait or a crash right after it was mined, and restarted after the window closed reported it
  missed, since only a fault this process saw had the chain asked)? drawn for this verifier's key, by the hash of the block after
  the commit (`select.drawn`)? If so: randomness sealed (seal it now) and selected on-chain by the
  sealed value? already attested by this account on-chain (a crash right after attesting)? Only
  then replay and attest. Every way out is recorded exactly once, and a commit this verifier had to
  check and missed says so in a line: one resumed from a suspension (a laptop's lid closed) past
  the windows of commits it was drawn for recorded them as missed without a word.
- The randomness block is waited for, not mined: on a live chain (and in the demo) other
  transactions make blocks. On a devnet (Anvil's chain id) with no traffic the loop mines it
  after `devnet_mine_after_s`, so a quiet local run does not stall.
- Faults: an unreachable chain or store aborts the pass and the loop backs off exponentially up
  to `max_backoff_s`; a worker payload that cannot be fetched is retried per commit with its own
  back-off until the last quarter of the window, then attested as unavailable (one whose fetch is
  still running, halfway through that quarter: `select.still_fetching_until`); run data that
  cannot be loaded is retried and, if the window closes, recorded as missed (never the
  worker's fault). A passing fault while handling a commit (`transient_faults`: a transaction
  whose receipt never came, from a seal or the attestation; an attestation whose fate the chain
  does not show yet, `attest.AttestationUnsettled`; any store error, such as Kubo timing
  out on the evidence upload, which it reports as `ContentNotFoundError`, or an HTTP 5xx) is
  retried for that commit with the same back-off while its window lasts, then recorded as
  missed with the fault as the reason. The replay's verdict is kept meanwhile, so a retry does
  not replay again (except a verdict of "unavailable": the payload may be there by the retry), and an attestation whose transaction landed after all is found on-chain by
  the check before attesting (or, the window closed meanwhile, by one before recording it as
  missed) and recorded as attested. An outage that cuts off the handling of a commit counts as its
  fault too: the pass aborts as above, and if the window closes before the chain is back, the
  attestation it may have sent is looked for before the commit is recorded as missed (as it is
  for every commit this verifier had to check whose window closed: one read per such commit). Any other error while handling one commit is a bug, recorded
  as `error` for that commit, and the loop goes on, as it does past a Committed event the state
  cannot record (`state.unrecordable`: recorded as `error` and logged, the rest of its batch saved);
  losing eligibility to attest stops the loop with the contract's reason, and a state file that
  refuses writes (a full disk: `state.VerifierStateError`) stops it naming the file, rather than
  recording the commit as `error` should that second write get through.
- Back-off against block deadlines: windows are counted in blocks, back-off in seconds. Every wait
  (a commit's retry, the pass-level back-off after an outage) is capped at half the time the head is
  expected to take to reach the block the commit is waiting for (the point where a missing payload
  is attested unavailable, or the last block a transaction sent still lands from), floored at the
  first retry's delay (`payload_retry_s`; `poll_interval_s` for an outage) and at a quarter of a
  block (a slow chain is not polled many times a block near the deadline). The pace is measured by
  the loop itself (`HeadPace`: each new head timed by the reads around it, over the last 32 moves,
  erring towards a faster chain; a head seen standing still stretches it), so it needs no extra
  reads and no configured block time. Uncapped, the doubling delays (up to `max_backoff_s`, 30 s)
  slept through the whole last quarter of a window at a 1 s or 2 s block time (windows of 8 to 30
  blocks, or 60 at 0.25 s), and a withheld payload ended `missed` instead of attested unavailable.
  On a slow chain the cap is above the back-off and changes nothing; on a devnet whose blocks come
  only with transactions the head stands still, the pace stretches, and the verifier does not poll
  faster either. Until the head has been seen to move there is no estimate and no cap.
- Corroboration: the loop also reads `Attested` events (same stream, same persisted cursor), and
  another verifier's failing verdict on a commit of the run, whose window is still open, makes
  this verifier replay that commit whatever its own draw (`state.add_events`): it seals the
  randomness if nobody did, replays with the same Replayer and attests its own honest verdict,
  pass or fail, with evidence, as for a selected commit. Without it a slash at attestation quorum
  Q >= 2 needed Q verifiers drawn independently on the same commit (1% per commit for 2 verifiers
  at p = 10%, against 19% for one failing verdict); `attest` does not require selection, so the
  contract counts these verdicts. A commit already decided (attested, missed, error) is not
  replayed again, one still pending is not added twice, and a commit that is both drawn and
  failed by another is recorded as `selected`. A corroborating replay recomputes the gradient
  shard the failing evidence names (a forgery of one shard out of two is otherwise confirmed half
  of the time), and always its own draw's too (first the named one, stopping at a failure): the
  named shard never replaces the draw, or a verifier colluding with the worker could steer every
  check to the honest shard by failing the commit first; the shards it recomputed are in its own
  evidence. The failing verdict itself is never trusted: the verdict is
  this verifier's replay. The price: anyone staked as a verifier can make every verifier replay a
  commit for the gas of one failing attestation (once per commit: the mark is set once), and the
  passing verdicts that provoke stand on-chain against its false one.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from krill.chain import errors as E
from krill.errors import ChainUnavailableError, StoreError, StoreUnavailableError
from krill.store.fetcher import Fetcher
from krill.verifier import select
from krill.verifier.attest import AttestationUnsettled, Who, attest
from krill.verifier.replay import (
    PayloadStillFetching,
    PayloadUnavailable,
    Replayer,
    ReplayResult,
    RunDataUnavailable,
    unavailable_result,
)
from krill.verifier.state import (
    ATTESTED,
    CORROBORATING,
    ERROR,
    MISSED,
    SELECTED,
    SKIPPED,
    FailingVerdict,
    Job,
    VerifierState,
    VerifierStateError,
)

UNREACHABLE = (ChainUnavailableError, StoreUnavailableError, OSError)
EVIDENCE_FETCHING = object()  # `_named_shard`: the failing evidence is still being fetched


def transient_faults() -> tuple[type[BaseException], ...]:
    """Faults that pass: retried for the commit while its window lasts, never recorded as `error`."""
    from web3.exceptions import TimeExhausted

    return (TimeExhausted, StoreError, AttestationUnsettled)


@dataclass(frozen=True)
class LoopSettings:
    poll_interval_s: float = 0.5
    max_backoff_s: float = 30.0
    confirmations: int = 0
    payload_retry_s: float = 0.5
    # Devnets only (Anvil's chain id): blocks appear only with transactions, so after this long
    # without the block after a commit, mine it (`seal_randomness_now`). None: always wait.
    devnet_mine_after_s: float | None = None




class VerifierLoop:
    """One verifier on one run."""

    def __init__(self, chain, store, spec, state: VerifierState, who: Who, settings: LoopSettings = LoopSettings(),
                 echo: Callable[[str], None] = print, start_block: int | None = None,
                 calibration: Path | None = None):
        self.chain, self.store, self.spec, self.state, self.who = chain, store, spec, state, who
        self.settings = settings
        self.echo = echo
        self.replayer = Replayer(chain, store, spec, who.key, who.chain_id, calibration)
        self.window = spec.chain.challenge_window_blocks
        self.attested = 0
        self._retry_at: dict[int, tuple[float, float]] = {}  # commit id -> (next try, current delay)
        self._waiting_since: dict[int, float] = {}  # commit id -> when it first waited for randomness
        self._faults: dict[int, str] = {}  # commit id -> the last passing fault met while handling it
        self._verdicts: dict[int, tuple[bytes, ReplayResult]] = {}  # commit id -> (randomness, its replay)
        self._origins: dict[int, str] = {}  # commit id -> why it is replayed (`selected` / `corroborating`)
        self._named_shards: dict[int, int | None] = {}  # commit id -> the shard the failing evidence names
        self._evidence = Fetcher(threads=2)  # failing evidence documents, one lane per verifier that attested
        self._pace = HeadPace()
        cursor = state.cursor()
        if cursor is None:
            created = chain.run_of(spec.run_id).created_block
            cursor = max(created, start_block or 0)
        self._stream = chain.event_stream(from_block=cursor, confirmations=settings.confirmations)

    # ------------------------------------------------------------------ events

    def poll_events(self) -> int:
        """Record newly committed contributions of this run as pending, and mark the commits of the run
        another verifier failed for corroboration (the module docstring); returns how many commits were new."""
        from krill.chain.events import Attested, Committed

        cursor = self._stream.next_block
        events = self._stream.poll((Committed, Attested))
        try:
            return self._record_events(events)
        except BaseException:
            # The poll moved the stream's cursor past events not yet saved: read them again next pass.
            self._stream.next_block = cursor
            raise

    def _record_events(self, events: list) -> int:
        """Save one poll's events with the stream's cursor (`poll_events`); returns how many commits were new."""
        from krill.chain.events import Attested, Committed

        jobs = [Job(e.commit_id, e.worker, e.version, e.nonce, e.header_digest, e.block_number)
                for e in events if isinstance(e, Committed) and e.run_id == self.spec.run_id]
        me = self.who.address.lower()
        # An Attested event names no run: the state knows only this run's commits, so others match nothing.
        failing = [FailingVerdict(e.commit_id, e.verifier, e.evidence_digest) for e in events
                   if isinstance(e, Attested) and not e.ok and e.verifier.lower() != me]
        # Commits whose window is still open: a transaction sent now, mined at head + 1, lands by commit + window.
        open_from = self._head() + 1 - self.window if failing else 0
        new, marked, rejected = self.state.add_events(jobs, failing, self._stream.next_block,
                                                      open_from_block=open_from)
        for job, problem in rejected:  # recorded as `error` where its commit id allows; never dropped unsaid
            self.echo(f"commit {job.commit_id}  worker {_short(str(job.worker))}  ERROR (event not recorded, "
                      f"not attested): {problem}")
        for commit_id in marked:
            failer = next(f.verifier for f in failing if f.commit_id == commit_id)
            self.echo(f"commit {commit_id}  verifier {_short(failer)} attested FAIL: replaying it to corroborate")
        return new

    # ------------------------------------------------------------------ one pass

    def step(self) -> int:
        """Poll events and handle every pending commit that is due; returns attestations sent."""
        self.poll_events()
        before = self.attested
        reads = PassReads(self.chain, self._head)
        for job in self.state.pending():
            due = self._retry_at.get(job.commit_id)
            if due is not None and time.monotonic() < due[0]:
                continue
            try:
                self._handle(job, reads)
            except UNREACHABLE as exc:
                # The outage may have cut off an attestation already sent: the window-closed check asks.
                self._faults[job.commit_id] = f"{type(exc).__name__}: {exc}"[:300]
                raise
            except (E.StakeNotEligible, VerifierStateError):  # the state file refusing writes is no commit's bug
                raise
            except transient_faults() as exc:
                fault = f"{type(exc).__name__}: {exc}"[:300]
                self._faults[job.commit_id] = fault
                self._retry_later(job, fault, announce=True)  # by the window's last block but one
            except Exception as exc:  # noqa: BLE001 - one commit's bug must not stop the verifier; recorded
                self._finish(job, ERROR, reason=f"{type(exc).__name__}: {exc}"[:500])
                self.echo(f"commit {job.commit_id}  worker {_short(job.worker)}  ERROR (not attested): "
                          f"{type(exc).__name__}: {exc}")
        return self.attested - before

    def _finish(self, job: Job, status: str, **decision) -> None:
        """Record the final decision on `job` and forget what was kept for its retries."""
        origin = self._origins.get(job.commit_id)
        self.state.finish(job.commit_id, status, origin=origin if status != SKIPPED else None, **decision)
        for kept in (self._retry_at, self._waiting_since, self._faults, self._verdicts, self._origins,
                     self._named_shards):
            kept.pop(job.commit_id, None)
        self._evidence.forget(job.commit_id)
        self.replayer.forget_fetches(job.commit_id)  # a payload still being fetched is not needed any more

    def _found_on_chain(self, job: Job, why: str) -> bool:
        """Record `job` as attested if this verifier's attestation of it is on-chain."""
        earlier = self.chain.attestation_of(job.commit_id, self.who.address)
        if not earlier.exists:
            return False
        self._finish(job, ATTESTED, ok=bool(earlier.ok), reason=why)
        self.echo(f"commit {job.commit_id}  worker {_short(job.worker)}  already attested "
                  f"{'PASS' if earlier.ok else 'FAIL'} on-chain; recorded")
        return True

    def _handle(self, job: Job, reads: PassReads) -> None:
        head = reads.head()
        if not select.can_still_attest(head, job.commit_block, self.window):
            fault = self._faults.get(job.commit_id)
            # Missed only if this verifier had to check it: one its draw passes over was not selected, whenever
            # it looked (a first start on a run under way, a restart after downtime).
            hashed = reads.block_randomness(job.commit_block)
            if (hashed is not None and job.corroborates is None and job.commit_id not in self._origins
                    and not select.drawn(hashed, job.commit_id, self.who.key, self.spec.chain.check_probability_ppm)):
                self._finish(job, SKIPPED, reason=f"not selected (drawn on the hash of block {job.commit_block + 1}, "
                                                  "not sealed; its window had closed)")
                return
            # An attestation sent before a passing fault (its receipt never came), or by an earlier run stopped
            # while it was on its way, may have landed in the window after all: asked whether this process saw a
            # fault or not (the earlier run's fault died with it).
            if self._found_on_chain(job, "found on chain (sent before a passing fault)" if fault is not None
                                    else "found on chain (earlier run)"):
                return
            reason = "challenge window closed before a verdict" + (f" (last fault: {fault})" if fault is not None
                                                                    else "")
            self._finish(job, MISSED, reason=reason)
            self.echo(f"commit {job.commit_id}  worker {_short(job.worker)}  MISSED (not attested): {reason}, at block "
                      f"{select.last_block(job.commit_block, self.window)} (head now {head})")
            return
        hashed = reads.block_randomness(job.commit_block)
        if hashed is None:
            hashed = self._devnet_randomness(job)
            if hashed is not None:
                reads.moved()  # the randomness block was mined just now
        if hashed is None:
            return  # the block after the commit does not exist yet
        corroborating = job.corroborates is not None
        drawn = select.drawn(hashed, job.commit_id, self.who.key, self.spec.chain.check_probability_ppm)
        if not drawn and not corroborating:
            self._finish(job, SKIPPED, reason=f"not selected (drawn on the hash of block {job.commit_block + 1}, "
                                              "not sealed)")
            return
        reads.moved()  # what follows sends transactions or replays: the next commit reads the head again
        try:
            randomness = select.ensure_randomness(self.chain, job.commit_id, job.commit_block, head)
        except E.RandomnessExpired:
            self._finish(job, MISSED, reason="randomness block expired before it was sealed")
            self.echo(f"commit {job.commit_id}  worker {_short(job.worker)}  MISSED (not attested): the hash of "
                      f"block {job.commit_block + 1} expired before its randomness was sealed (head now {head})")
            return
        if randomness is None:
            randomness = self._devnet_randomness(job)
        if randomness is None:
            return  # a seal needs one more block
        self._waiting_since.pop(job.commit_id, None)
        if job.commit_id not in self._origins:
            selected = drawn and select.is_selected(self.chain, job.commit_id, self.who.key)
            if not selected and not corroborating:
                self._finish(job, SKIPPED, reason="not selected by the sealed randomness")
                return
            self._origins[job.commit_id] = SELECTED if selected else CORROBORATING
        if self._found_on_chain(job, "found on chain (earlier run)" if job.commit_id not in self._faults
                                else "found on chain (sent before a passing fault)"):
            return
        started = time.perf_counter()
        kept = self._verdicts.get(job.commit_id)
        if kept is not None and kept[0] == randomness:  # replayed before a passing fault stopped its attestation
            result = kept[1]
        else:
            named = self._named_shard(job)
            if named is EVIDENCE_FETCHING:
                self._retry_later(job, "the failing evidence it corroborates is still being fetched",
                                  until=select.unavailable_after(job.commit_block, self.window))
                return
            try:
                result = self.replayer.replay(job, randomness, shard=named, wait_s=self._fetch_wait(job))
            except PayloadUnavailable as exc:
                head = self._head()
                # A fetch still running is slow, not known missing: it gets longer (`select` explains).
                until = (select.still_fetching_until if isinstance(exc, PayloadStillFetching)
                         else select.unavailable_after)(job.commit_block, self.window)
                if head < until:
                    self._retry_later(job, f"payload not available yet ({exc})", until=until)
                    return
                result = unavailable_result(f"unavailable until block {head}: {exc}", time.perf_counter() - started)
            except RunDataUnavailable as exc:
                self._retry_later(job, f"run data not available ({exc}); retrying")
                return
            if result.reason != "unavailable":  # a payload missing now may be fetched on the retry after a fault
                self._verdicts[job.commit_id] = (randomness, result)
            self._retry_at.pop(job.commit_id, None)  # replayed: the payload's back-off is over
        head = self._head()
        if not select.can_still_attest(head, job.commit_block, self.window):
            self._finish(job, MISSED, ok=result.ok, reason="replay finished after the window closed")
            self.echo(_line(job, result, time.perf_counter() - started, "missed the window, not attested"))
            return
        outcome = attest(self.chain, self.store, self.spec, self.who, job, randomness, result)
        if outcome.status in ("window_closed", "limit_reached"):
            why = ("window closed while attesting" if outcome.status == "window_closed"
                   else "the contract already holds its cap of attestations with this outcome")
            self._finish(job, MISSED, ok=result.ok, reason=why, evidence_cid=outcome.evidence_cid)
            self.echo(_line(job, result, time.perf_counter() - started, f"not attested: {why}"))
            return
        note = "found on chain (earlier run)" if outcome.status == "duplicate" else result.reason
        tail = f"evidence {outcome.evidence_cid}" if outcome.evidence_cid else "attested earlier"
        if job.corroborates is not None:
            tail += f"  ({self._origins[job.commit_id]}; {_short(job.corroborates)} attested FAIL)"
        self._finish(job, ATTESTED, ok=outcome.ok, reason=note, evidence_cid=outcome.evidence_cid,
                     tx_hash=outcome.tx_hash)
        if outcome.status == "attested":
            self.attested += 1
        self.echo(_line(job, result, time.perf_counter() - started, tail))

    def _named_shard(self, job: Job) -> int | None | object:
        """The gradient shard the failing evidence `job` corroborates names (None: not corroborating, or
        the document cannot be read or names none, and the replay recomputes only its own draw's shard);
        `EVIDENCE_FETCHING` while the document is still being fetched and the window leaves time to wait.

        The document is fetched on the loop's own fetch threads, in the lane of the verifier that attested
        it, and a pass waits at most `PASS_WAIT_S`: a failing verdict whose evidence nobody has costs
        the store's timeout (60 s on Kubo), and it used to hold the loop that long on every retry."""
        if job.failing_evidence is None:
            return None
        if job.commit_id in self._named_shards:
            return self._named_shards[job.commit_id]
        from krill.protocol.evidence import load_evidence
        from krill.store.cid import digest_to_cid
        from krill.store.fetcher import PASS_WAIT_S

        cid, store, key = digest_to_cid(job.failing_evidence), self.store, job.commit_id
        if self._evidence.submit((job.corroborates or "").lower(), key, lambda: load_evidence(store, cid)):
            deadline = select.unavailable_after(job.commit_block, self.window)
            self._evidence.wait([key], self._capped(PASS_WAIT_S, deadline, 0.0))
        fetched = self._evidence.take(key)
        evidence, why, final = None, "", True
        if fetched is None:
            if self._head() < select.unavailable_after(job.commit_block, self.window):
                return EVIDENCE_FETCHING
            why = "still being fetched late in the window"
        else:
            try:
                evidence = fetched.result()
            except StoreUnavailableError:
                raise  # this verifier's own store: the loop backs off, and the document is fetched again
            except (StoreError, ValueError) as exc:
                why = f"cannot be read ({type(exc).__name__}: {str(exc)[:160]})"
                final = not isinstance(exc, StoreError)  # missing (maybe still on its way): a later try asks again
        if why:
            self.echo(f"commit {job.commit_id}  the failing evidence of {_short(job.corroborates or '')} {why}; "
                      "recomputing only this verifier's own shard")
        if not final:
            return None
        same = evidence is not None and (evidence.commit_id, evidence.header_digest) == (job.commit_id,
                                                                                        job.header_digest.hex())
        self._named_shards[job.commit_id] = evidence.gradient_shard if same else None
        return self._named_shards[job.commit_id]

    def _devnet_randomness(self, job: Job) -> bytes | None:
        after = self.settings.devnet_mine_after_s
        if after is None:
            return None
        since = self._waiting_since.setdefault(job.commit_id, time.monotonic())
        if time.monotonic() - since < after:
            return None
        return self.chain.seal_randomness_now(job.commit_id)

    def _head(self) -> int:
        """The chain's head, read now (and timed, for `HeadPace`)."""
        head = self.chain.block_number()
        self._pace.observe(head, time.monotonic())
        return head

    def _capped(self, delay: float, block: int, floor: float) -> float:
        """`delay`, or half the time the head is expected to take to reach `block` if that is shorter (never
        under `floor` nor a quarter of a block: the module docstring, on back-off against block deadlines)."""
        left = self._pace.seconds_until(block, time.monotonic())
        if left is None:
            return delay
        return min(delay, max(floor, self._pace.block_seconds() / 4, left / 2))

    def _fetch_wait(self, job: Job) -> float:
        """How long a replay of `job` may wait for its payload fetches: `PASS_WAIT_S`, capped like every other
        wait by the block the commit waits for (the point where a fetch still running is given up on, or once
        the head is there, the window's last block but one). At 0.5 s a block `PASS_WAIT_S` is four blocks: a
        replay begun a block before `still_fetching_until` on a window of 8 ended past the window's close."""
        from krill.store.fetcher import PASS_WAIT_S

        until, head = select.still_fetching_until(job.commit_block, self.window), self._pace.head()
        if head is not None and head >= until:
            until = select.last_send_head(job.commit_block, self.window)
        return self._capped(PASS_WAIT_S, until, 0.0)

    def _retry_later(self, job: Job, why: str, announce: bool = False, until: int | None = None) -> None:
        """Try `job` again after a doubling delay, waking before the head reaches `until` (default: the window's
        last block but one, the last head a transaction sent still lands from); say why the first time
        (every time if `announce`)."""
        _, delay = self._retry_at.get(job.commit_id, (0.0, 0.0))
        first = delay == 0.0
        delay = min(self.settings.max_backoff_s, max(self.settings.payload_retry_s, delay * 2))
        if until is None:
            until = select.last_send_head(job.commit_block, self.window)
        wait = self._capped(delay, until, self.settings.payload_retry_s)
        if first or announce:
            self.echo(f"commit {job.commit_id}  worker {_short(job.worker)}  waiting: {why}"
                      + (f"; retrying in {wait:.1f}s" if announce else ""))
        self._retry_at[job.commit_id] = (time.monotonic() + wait, delay)

    def _outage_wait(self, delay: float) -> float:
        """How long to back off after an outage: `delay`, capped by the nearest window of a pending commit (the
        last head a transaction sent still lands from) that even the slow estimate does not put behind."""
        now, pace = time.monotonic(), self._pace
        ends = sorted({select.last_send_head(job.commit_block, self.window) for job in self.state.pending()})
        ahead = [end for end in ends if (left := pace.seconds_until(end, now, slow=True)) is None or left > 0]
        if not ahead:
            return delay
        return self._capped(delay, ahead[0], self.settings.poll_interval_s)

    # ------------------------------------------------------------------ the loop

    def run(self, max_attestations: int | None = None, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Step until stopped (or `max_attestations` were sent), backing off while chain or store are down."""
        from krill.runtime import freeze_heap

        delay = self.settings.poll_interval_s
        while not should_stop():
            try:
                self.step()
                delay = self.settings.poll_interval_s
                if self.attested:  # models and clients are loaded by the first attestation (frozen once)
                    freeze_heap()
            except UNREACHABLE as exc:
                wait = self._outage_wait(delay)
                self.echo(f"unreachable ({type(exc).__name__}: {exc}); retrying in {wait:.2f}s")
                time.sleep(wait)
                delay = min(self.settings.max_backoff_s, delay * 2)
                continue
            if max_attestations is not None and self.attested >= max_attestations:
                return
            time.sleep(self.settings.poll_interval_s)


class PassReads:
    """The chain reads the commits of one pass share.

    Most pending commits end at the draw (`check_probability_ppm` is 10% in the demo): reading the
    head and the randomness block for each of them was about a fifth of a verifier's Python CPU. A
    pass reads the head once, and again only after a commit that went further (a seal or an
    attestation mines a block, a replay takes blocks' time), and each randomness block's hash once:
    the commits of one block share it."""

    def __init__(self, chain, read_head: Callable[[], int] | None = None):
        self.chain = chain
        self._read_head = read_head or chain.block_number
        self._head: int | None = None
        self._hashes: dict[int, bytes] = {}

    def head(self) -> int:
        if self._head is None:
            self._head = self._read_head()
        return self._head

    def moved(self) -> None:
        """The chain may have moved since the head was read: read it again when next asked."""
        self._head = None

    def block_randomness(self, commit_block: int) -> bytes | None:
        """`select.block_randomness` of the commit, with each block's hash read once per pass."""
        number = commit_block + 1
        if number not in self._hashes:
            hashed = select.block_randomness(self.chain, commit_block, self.head())
            if hashed is None:
                return None
            self._hashes[number] = hashed
        return self._hashes[number]


class HeadPace:
    """How fast the chain's head moves, as the loop's own reads see it, and when it should reach a block.

    A head read for the first time appeared after the read before it (which saw a lower one) and
    at or before this one: every estimate takes the end of that span that makes the chain look
    faster (the block time over the last `SPAN` moves from the first read of the oldest head to
    the read before the newest; the newest head's arrival at that read before), since one that
    errs slow makes a capped wait oversleep a deadline, and one that errs fast only wakes the
    loop sooner. A head seen standing still for longer than that block time (a devnet between
    transactions, a stalled chain) stretches it to that long. Whether a deadline has passed unseen (an
    outage) is the one question where erring fast is the risk: `slow` answers it from the newest head's
    first read with twice that block time, or with the slowest block time the reads allow if that is
    more (the blocks after the oldest head but one appeared after the read before the first move and
    by the newest head's first read). Twice the fast estimate alone was no bound: a head that moved
    once, several blocks between two reads (a first replay of 3 s, say), gives a fast estimate of 0,
    every window looked closed, the back-off after an outage went uncapped and slept past the window.
    None where the reads set no such bound yet (the head has not moved two blocks): not known passed.

    A stall (a sequencer outage of minutes) is one move among the last `SPAN` and weighed the span's
    mean for the next `SPAN` moves: after 120 s without a block at 1 s blocks the estimate read 6.7 s,
    a back-off of 30 s went uncapped and slept past a window of 40 (a withheld payload ended
    `missed`). Once `TYPICAL_MOVES` moves are seen, the estimate is at most the median of the moves'
    own block times (each head's arrival taken as the middle of the span it appeared in), which one
    stall does not move. A verifier started during a stall has seen no move before it and still
    misjudges the pace until the stall leaves the span."""

    SPAN = 32
    TYPICAL_MOVES = 3

    def __init__(self):
        self._moves: deque[tuple[float, float, int]] = deque(maxlen=self.SPAN)  # (read before, first read, head)
        self._read_at: float | None = None  # the last read

    def observe(self, head: int, now: float) -> None:
        if not self._moves or head > self._moves[-1][2]:
            self._moves.append((now if self._read_at is None else self._read_at, now, head))
        self._read_at = now

    def head(self) -> int | None:
        """The highest head read so far; None before the first read."""
        return self._moves[-1][2] if self._moves else None

    def block_seconds(self) -> float | None:
        """The estimated block time; None until the head was seen to move."""
        if len(self._moves) < 2 or self._read_at is None:
            return None
        (_, first_at, first), (before, last_at, last) = self._moves[0], self._moves[-1]
        seconds = max(0.0, before - first_at) / (last - first)
        if len(self._moves) > self.TYPICAL_MOVES:
            seconds = min(seconds, self._typical_move_seconds())
        return max(seconds, self._read_at - last_at)

    def _typical_move_seconds(self) -> float:
        """The median over the moves seen of a move's block time, each head's arrival taken as the middle of
        the span it appeared in (after the read before its first read, by that read)."""
        arrivals = [((before + first_read) / 2, head) for before, first_read, head in self._moves]
        return statistics.median((t1 - t0) / (h1 - h0) for (t0, h0), (t1, h1) in zip(arrivals, arrivals[1:],
                                                                                         strict=False))

    def seconds_until(self, block: int, now: float, slow: bool = False) -> float | None:
        """Estimated seconds from `now` until the head reaches `block` (0 or less: already there, by the
        estimate; `slow`: by the slow one); None until the head was seen to move."""
        seconds = self.block_seconds()
        if seconds is None:
            return None
        before, first_read, last = self._moves[-1]
        if slow:
            first, after = self._moves[0][2], self._moves[1][0]  # the oldest head; the read before the first move
            upper = (first_read - after) / (last - first - 1) if last - first >= 2 else 0.0
            seconds = max(2 * seconds, upper)
            return None if seconds <= 0 else first_read + (block - last) * seconds - now
        return before + (block - last) * seconds - now


def _short(address: str) -> str:
    return f"{address[:6]}…{address[-4:]}"


def _line(job: Job, result, seconds: float, tail: str) -> str:
    stages = " ".join(f"{c.name} {c.ms / 1000:.3f}s" for c in result.checks)
    if result.ok:
        verdict = "PASS"
    else:
        last = result.checks[-1] if result.checks else None
        detail = f" ({last.detail[:120]})" if last is not None else ""
        verdict = f"FAIL at {result.reason}{detail}"
    behaviour = "" if result.behaviour_version is None else f" b{result.behaviour_version}"
    return (f"commit {job.commit_id}  worker {_short(job.worker)}  v{job.version}{behaviour}  {verdict}  "
            f"[{stages}]  total {seconds:.2f}s  {tail}")
