"""The coordinator's loop: index -> finish journalled work -> slash -> ingest -> close -> publish -> settle -> eval.

Design decisions:
- One pass (`Coordinator.step`) is a sequence of idempotent steps over database + chain; the loop
  repeats it as soon as the node announces a block (`krill.chain.heads`: a commit landed), at the
  latest every `poll_interval_s`, and at once after a pass that published a version (the
  workers' contributions for the next one arrive while it publishes; a fixed wait there was
  0.5 s of every version's wall time). Polling every 0.1 s, the demo noticed a version's last
  commit 50 ms late on average. Restarting after `kill -9` is the same as the next
  pass: journalled versions are completed first (`publish.complete_version`), then work resumes.
- Faults of the two shared channels (chain unreachable, store unreachable) end the pass and are
  retried with exponential back-off capped at `max_backoff_s`; nothing is decided while a
  channel is down, so an outage never turns into rejections. So are a transaction whose receipt
  did not come in time (`ReceiptTimeout`: the node answered, blocks are slow) and a write of ours
  the next pass finds pending (`WritePending`: the pending block holds its effect, the latest one
  does not; see `krill.coordinator.publish`): the write lands once blocks come, and the pass after
  that finds it on chain. The receipt timeout stopped the coordinator, and with it a run whose
  publication landed a moment later. So is a write that ran out of gas twice
  (`TransactionOutOfGas`: the transactor already sent it once more on a new estimate): it changed
  nothing but its fee, and the next pass estimates it again. A slash loops over the commit's
  failing verifiers and any staked account may attest failing while the window is open, so
  verdicts sent ahead of it (a higher tip) outgrow its estimate; twice stopped the coordinator. The
  contract's cap on failing verdicts per commit bounds how often that can be done to one slash.
  Anything else is a bug and stops the process with its traceback (the journal makes the restart
  safe).
- Slashing runs before ingest and the index is re-synced after a slash, so a worker jailed in
  this pass has its remaining contributions rejected as `jailed` in the same pass.
- The index's content (commit headers, version manifests: what the explorer shows) is fetched in
  passes that wait for contributions, not in the index passes on a version's critical path
  (`Indexer(content_in_sync=False)`; none of the coordinator's decisions read those rows).
- The run's latest version is read from the chain once; after that the coordinator knows it,
  since only the run's coordinator publishes (the contract refuses anyone else), and
  `complete_version` reads the chain before every publication anyway, stopping with an error if
  another process published in between. Reading it every pass was about 5% of the coordinator's
  CPU on the demo (2026-12-06).
- `run(stop)`: once `stop` is set (`krill coordinator run` sets it on SIGTERM or SIGINT), the pass
  under way decides no new version, but publishes and settles one it has journalled, and the loop
  ends after it. So a stop leaves no version journalled and unpublished unless a channel fault
  cut that pass (then the restart publishes it, as after a crash).
- On its first pass the coordinator adopts the published versions its journal lacks within the
  staleness window (`krill.coordinator.adopt`): a coordinator on a new database folded their
  contributions a second time.
- `max_versions` ends the loop once that version is published and settled and no slash is due
  (`krill.coordinator.slash.pending`: a commit at the failing quorum that was neither slashed nor
  refuted). The verifiers fail the last version's contributions while it is folded and published;
  a loop that ended right after publishing left those slashes undone, and the cheater kept its stake
  (a restart slashed them only if someone restarted it). A verdict that lands after the loop ended
  is slashed by the next `krill coordinator run`, whose first pass slashes before anything else.
- Version 0 is evaluated at start; version t when t is a multiple of `eval_every` (and the last
  version when `max_versions` stops the loop), so the demo always has a final figure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from krill.chain.tx import ReceiptTimeout, TransactionOutOfGas
from krill.coordinator.adopt import adopt_published
from krill.coordinator.close import decide, published_at
from krill.coordinator.evals import evaluate_version
from krill.coordinator.faults import halt_point
from krill.coordinator.ingest import ingest
from krill.coordinator.journal import DecisionState, ensure_tables, mark_settled, unfinished
from krill.coordinator.metrics import VersionFigures, figures, record_metrics, status_line
from krill.coordinator.publish import WritePending, complete_version
from krill.coordinator.settle import settle_version
from krill.coordinator.slash import pending as slashes_pending
from krill.coordinator.slash import slash_due
from krill.errors import ChainUnavailableError, StoreUnavailableError
from krill.phases import phase, recording

log = logging.getLogger(__name__)
FAULTS = (ChainUnavailableError, StoreUnavailableError, ReceiptTimeout, WritePending, TransactionOutOfGas)


@dataclass(frozen=True)
class LoopOptions:
    poll_interval_s: float = 0.5
    max_backoff_s: float = 30.0
    eval_every: int = 5
    max_versions: int | None = None


class Coordinator:
    """Drives one run; `echo` receives each human-readable line."""

    def __init__(self, ctx, indexer, options: LoopOptions, echo: Callable[[str], None] = print):
        self.ctx, self.indexer, self.options, self.echo = ctx, indexer, options, echo
        # Wall time per phase since the last published version (`run` records it; krill.phases); each
        # version's metrics row carries it, and the seconds since the previous version on this
        # process's clock (`clock_seconds`), for `krill bench protocol`.
        self.phases: dict[str, float] = {}
        self._last_report: float | None = None  # monotonic time of the last version reported
        # The run's latest version as this process last read or published it: only this coordinator
        # publishes the run, so `done` need not read it again after every pass.
        self._latest: int | None = None
        self._stop: threading.Event | None = None  # `run`'s: once set, no new version is decided
        self._adopted = False  # whether the published versions the journal lacks were adopted
        self._announced: list[int] = []  # the slashes `done` last said it waits for
        ensure_tables(ctx.db)

    # ------------------------------------------------------------------ one pass

    def latest_version(self) -> int:
        """The run's latest version: read from the chain once, then the versions this process
        publishes (the run's only publisher; see the module docstring)."""
        if self._latest is None:
            self._latest = self.ctx.chain.run_of(self.ctx.run_id).latest_version
        return self._latest

    def done(self) -> bool:
        """True once `max_versions` is published and settled and no slash is due (by the index, synced
        here first: the last version's verdicts land while it is folded, settled and evaluated)."""
        limit = self.options.max_versions
        if limit is None:
            return False
        if self.latest_version() < limit:
            return False
        with self.ctx.db.session() as s:
            if unfinished(s, self.ctx.run_hex):
                return False
        with phase("index"):
            self.indexer.sync()
        due = slashes_pending(self.ctx)
        if due and due != self._announced:
            self.echo(f"version {limit} is the last; waiting to slash or refute commit(s) "
                      f"{', '.join(map(str, due[:16]))}{' ...' if len(due) > 16 else ''} before stopping")
        self._announced = due
        return not due

    def step(self) -> list[VersionFigures]:
        """One pass; returns the figures of the versions it published."""
        ctx = self.ctx
        with phase("index"):
            self.indexer.sync()
        out = self._finish_journalled()
        if self.options.eval_every > 0:
            with phase("eval"):
                evaluate_version(ctx, 0)
        with phase("slash"):
            slashed = slash_due(ctx)
        if slash_lines := [self._slash_line(s) for s in slashed]:
            for line in slash_lines:
                self.echo(line)
            with phase("index"):
                self.indexer.sync()
        latest = self.latest_version()
        if self.options.max_versions is not None and latest >= self.options.max_versions or self._stopping():
            return out
        if not self._adopted:
            with phase("adopt"):
                adopted = adopt_published(ctx, latest)
            if adopted:
                self.echo(f"version(s) {', '.join(map(str, adopted))} are published but not in the journal "
                          "(a new database?): their records' contributions are marked as folded")
            self._adopted = True
        version = latest + 1
        with phase("ingest"):
            report = ingest(ctx, version)
        for code, n in sorted(report.reasons.items()):
            self.echo(f"rejected {n} contribution{'s' * (n != 1)}: {code}")
        if self._stopping():
            return out
        with phase("close"):
            decision = decide(ctx, version)
        if decision is not None:
            halt_point("decided")
            out += self._finish_journalled()
        else:
            with phase("prepare"):
                self._prepare(latest)
            with phase("index_content"):  # headers and manifests for the index, off the critical path
                self.indexer.fetch_due_content()
        return out

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _prepare(self, latest: int) -> None:
        """While the pass waits for contributions: have the public gradient masks of the newest
        version ready, which ingest needs for the first contribution computed at it and the fold for
        all of them. A version this process published holds the masks it derived to publish them;
        after a restart they are read from the store here, off the version's critical path. A
        version's state is cached, so this runs once per version."""
        self.ctx.grad_lengths(latest)

    def _finish_journalled(self) -> list[VersionFigures]:
        ctx, out = self.ctx, []
        with ctx.db.session() as s:
            rows = unfinished(s, ctx.run_hex)
        for row in rows:
            fold_seconds, sent = 0.0, row.bytes_published or 0
            fresh = False  # published by this call: the chain cannot have settled it yet
            if row.state in (DecisionState.DECIDED, DecisionState.STORED):
                with phase("publish"):
                    published = complete_version(ctx, row.version)
                fold_seconds, sent = published.fold_seconds, published.bytes_published
                fresh = not published.recovered
                self._latest = max(self._latest or 0, row.version)
                with phase("index"):
                    self.indexer.sync()
            with phase("settle"):
                settle_version(ctx, row.version, unsettled=fresh)
            halt_point("settled")
            out.append(self._report(row, sent, fold_seconds))
            mark_settled(ctx, row.version)  # after the report: a crash in between reports it again
        return out

    def _received_bytes(self, accepted: list[dict]) -> int:
        """Bytes the version's accepted contributions took on the wire: header + every file it names.
        A contribution no longer cached (after a restart) is counted from its signed header alone, so
        reporting never refetches gradients; a header the store cannot give counts 0 (and says so)."""
        from krill.coordinator.ingest import contribution_bytes
        from krill.errors import PayloadError, StoreError
        from krill.payload.header import decode_header
        from krill.store.cid import digest_to_cid

        total = 0
        for entry in accepted:
            cached = self.ctx.recall(int(entry["commit_id"]))
            if cached is not None:
                total += contribution_bytes(cached)
                continue
            try:
                data = self.ctx.store.get(digest_to_cid(bytes.fromhex(entry["header_digest"])),
                                          max_bytes=self.ctx.spec.limits.max_header_bytes)
                total += len(data) + sum(ref.size for ref in decode_header(data, self.ctx.spec.limits,
                                                                          verify=False).files.values())
            except (StoreError, PayloadError) as exc:
                log.warning("commit %s: its header is not readable to count its bytes (%s)", entry["commit_id"], exc)
        return total

    def _report(self, row, sent: int, fold_seconds: float) -> VersionFigures:
        ctx = self.ctx
        received = self._received_bytes(row.accepted)
        previous, now = published_at(ctx, row.version - 1), published_at(ctx, row.version)
        seconds = (now - previous) if previous is not None and now is not None else row.window_s
        f = figures(row, received, sent, float(seconds), fold_seconds)
        every, last = self.options.eval_every, self.options.max_versions
        if every > 0 and (row.version % every == 0 or row.version == last):
            with phase("eval"):
                f = VersionFigures(**{**f.__dict__, "accuracy": evaluate_version(ctx, row.version)})
        phases = {k: round(v, 4) for k, v in self.phases.items()}
        self.phases.clear()
        extra: dict = {"phases": phases} if phases else {}
        now = time.monotonic()
        if self._last_report is not None:  # this process's clock: block times count whole seconds
            extra["clock_seconds"] = round(now - self._last_report, 4)
        self._last_report = now
        record_metrics(ctx, f, extra or None)
        for e in row.accepted:
            ctx.forget(int(e["commit_id"]))
        self.echo(status_line(f))
        return f

    @staticmethod
    def _slash_line(outcome) -> str:
        if outcome.amount is None:
            return f"slash of commit {outcome.commit_id} skipped: {outcome.note}"
        return f"slashed commit {outcome.commit_id}: worker {outcome.worker} lost {outcome.amount / 1e18:g} tokens, jailed"

    # ------------------------------------------------------------------ loop

    def run(self, stop: threading.Event | None = None) -> None:
        """Repeat `step` until `stop` is set or `max_versions` is done; back off on channel faults."""
        from krill.chain.heads import HeadWaiter

        stop = self._stop = stop or threading.Event()
        heads = HeadWaiter.for_chain(self.ctx.chain)
        try:
            self._loop(stop, heads)
        finally:
            heads.close()

    def _loop(self, stop: threading.Event, heads) -> None:
        from krill.runtime import freeze_heap

        delay = self.options.poll_interval_s
        while not stop.is_set():
            try:
                with recording(self.phases):
                    published = self.step()
                if self.done():
                    self.indexer.fetch_due_content()  # the last versions' headers and manifests
                    return
                delay = self.options.poll_interval_s
                if published:
                    freeze_heap()  # once per process: models, clients and caches are loaded by the first publish
                    continue  # contributions for the next version came in while this one was published
            except FAULTS as exc:
                delay = min(max(delay, self.options.poll_interval_s) * 2, self.options.max_backoff_s)
                self.echo(f"waiting {delay:.1f} s: {type(exc).__name__}: {exc}")
                stop.wait(delay)
                continue
            heads.wait(self.options.poll_interval_s, stop)  # the next block (a commit), else the interval

