"""`Indexer`: contract events (and the headers and manifests they name) into the index tables.

Design decisions:
- The cursor (next block to read) lives in the database (`index_meta`), in the same transaction as
  the rows of the blocks it covers: a crash between batches loses nothing and repeats nothing, and
  a restarted indexer resumes where the last committed batch ended.
- Only blocks at least `confirmations` deep are read, in batches of at most `batch_blocks`. A node
  that refuses a batch's `eth_getLogs` (public endpoints cap the block range or the logs per answer)
  is asked for half of it, down to one block, whose refusal is raised, and the smaller batch is kept
  (`krill.chain.events.read_within_cap`, the event stream's own): with a fixed batch such a node
  refused every catch-up longer than its cap, on every pass, and the index never moved. Logs are fetched
  outside any transaction; the batch is then applied under the write lock (SQLite BEGIN
  IMMEDIATE; PostgreSQL SELECT ... FOR UPDATE of the cursor row) and only if the cursor still
  points at the batch's first block. Several processes may run indexers on one database: each
  batch is applied exactly once, whoever gets there first.
- Every event is also keyed by (tx hash, log index) in `chain_events`, so applying anything twice
  is a no-op even if the cursor were moved back by hand.
- Content (headers by commit digest, manifests by version digest) is fetched after the events,
  outside transactions, and written back in short ones. Store faults are recorded on the row and
  retried on later passes (up to `max_fetch_attempts`); they never stop event ingest.
- An index belongs to one chain id and contract; pointing it at another raises
  `IndexMismatchError` rather than mixing two deployments' rows. The hash of its start block
  is kept too (`IndexAnchor`) and checked on a process's first pass that finds it: a restarted devnet has
  the same chain id and contract address, and an index of the old chain used to keep its rows,
  with its cursor past the new chain's head, so the new chain's first blocks were never read.
- The last indexed block's hash is kept too (`IndexAnchor` row 2, written with the cursor) and
  checked before any later block is applied: a reorg deeper than `confirmations`, or a devnet
  restarted while a long-running indexer follows it, would otherwise mix two chains' rows. A
  chain that no longer has that hash raises `IndexMismatchError` (run `krill index rebuild`);
  one that has not reached that block yet (a node behind the others, or a restarted devnet still
  short of it) raises `ChainUnavailableError`, which roles wait out, so nothing is applied until
  it can be told apart. The check is free where the logs of the next query include that block
  (`latest_logs`: the query starts there). The head path reads each batch's last block before its
  logs (its hash is the next tip) and compares the first new block's parent hash with the tip: one
  block read for a pass with one new block, two with more. A pass with no new block checks the
  tip by one block read at most every `TIP_CHECK_S`.
- `rebuild()` drops the index tables and replays from `start_block` (the deploy block): the index
  is a cache of chain + store, and a test checks the rebuilt rows equal the incremental ones.
- The cursor is read from the database once per process and then kept in memory: a pass with new
  blocks checks it under the write lock anyway (and follows the database's value where another
  indexer, or a hand, moved it), so reading it again before every pass only cost a write
  transaction (1.5 ms a pass, 9 ms a version in the coordinator's demo).
- `latest_logs` (the coordinator's indexer, where confirmations are 0: a devnet): a pass asks for the logs from the
  cursor up to `latest` in one request and moves the cursor past the newest block that has one, so
  the head read before it is skipped (`eth_blockNumber`: 6 ms a pass, 37 ms a version on the
  loaded demo machine). Blocks up to that one are complete: a node resolves `latest` to one block
  at the start of the query and returns a block's logs whole. A pass that finds no logs reads the
  head as before at most once every `HEAD_READ_S`, so empty blocks do not pile up behind the
  cursor; until then the index may end a few blocks short of the head where the newest blocks
  hold none of the contract's logs (token transfers, for one), which no role acts on. With
  confirmations above 0 the head must be read to know which blocks are buried deep enough, so
  the option is ignored.
- Headers are fetched on a `Fetcher`'s threads, one lane per worker: a pass waits at most
  `PASS_WAIT_S` for the fetches it queued and records the rest on a later pass, so a header nobody
  has (a commit of junk, which waits out a networked store's timeout) holds one thread, not the
  pass, and is not fetched again while its fetch runs.
- Content is fetched only when due: after a pass applied events (which add pending rows), while an
  earlier fetch left rows unavailable to retry, and on this process's first pass. A pass with
  nothing new skips the two queries for pending rows.
- `content_in_sync=False` (the coordinator's indexer): passes index events only, and the owner
  calls `fetch_due_content()` when it has time (the coordinator, while it waits for
  contributions). None of the coordinator's decisions read the header or manifest rows (the
  explorer does), and fetching them inside the passes on a version's critical path cost it 48 ms
  a version on the demo machine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from sqlalchemy import func, or_, select
from sqlalchemy.exc import IntegrityError
from web3.exceptions import BlockNotFound

from krill.chain.events import LOG_REFUSALS, ChainEvent, decode_log, read_within_cap
from krill.chain.rpc import endpoint_of, with_retries
from krill.db.content import HEADER_LIMITS, CommitFacts, Fetched, fetch_header, fetch_manifest
from krill.db.errors import IndexMismatchError
from krill.db.ingest import DEFAULT_TRUST_PRIOR, TrustPrior, apply_event, known_events
from krill.db.models import INDEX_TABLES, Commit, FetchStatus, Header, IndexMeta, Shard, Version
from krill.db.session import Database
from krill.db.types import address
from krill.errors import ChainUnavailableError
from krill.payload.limits import PayloadLimits
from krill.store.fetcher import PASS_WAIT_S, Fetcher

log = logging.getLogger(__name__)

TIP_ROW = 2  # `IndexAnchor` row of the last indexed block (row 1: the start block)
HEAD_READ_S = 1.0  # with `latest_logs`, how often a pass that found no logs reads the head anyway
TIP_CHECK_S = 5.0  # how often a pass with no new block checks the last indexed block's hash


@dataclass
class SyncReport:
    """What one `sync()` pass did."""

    from_block: int
    next_block: int
    safe_head: int
    events: int = 0
    batches: int = 0
    fetched: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str, status: FetchStatus) -> None:
        key = f"{kind}_{status.value}"
        self.fetched[key] = self.fetched.get(key, 0) + 1


@dataclass(frozen=True)
class IndexStatus:
    """Where the index stands against the chain."""

    chain_id: int | None
    protocol: str | None
    next_block: int | None
    safe_head: int
    rows: dict[str, int]
    headers: dict[str, int]
    manifests: dict[str, int]

    @property
    def lag_blocks(self) -> int:
        """Confirmed blocks not yet indexed."""
        return max(0, self.safe_head + 1 - (self.next_block or 0))


class Indexer:
    """Follows one deployment's protocol events into `database`; optionally fills content from `store`."""

    def __init__(self, chain, database: Database, store=None, *, start_block: int = 0, confirmations: int = 0,
                 batch_blocks: int = 500, trust_prior: TrustPrior = DEFAULT_TRUST_PRIOR, max_fetch_attempts: int = 20,
                 fetch_batch: int = 64, header_limits: PayloadLimits = HEADER_LIMITS, latest_logs: bool = False,
                 content_in_sync: bool = True):
        if start_block < 0 or confirmations < 0 or batch_blocks < 1 or max_fetch_attempts < 1 or fetch_batch < 1:
            raise ValueError("start_block and confirmations must be >= 0; batch_blocks, max_fetch_attempts "
                             "and fetch_batch >= 1")
        self.chain = chain
        self.db = database
        self.store = store
        self.start_block = start_block
        self.confirmations = confirmations
        self.batch_blocks = batch_blocks
        self.trust_prior = trust_prior
        self.max_fetch_attempts = max_fetch_attempts
        self.fetch_batch = fetch_batch
        self.header_limits = header_limits
        self.latest_logs = latest_logs
        self.content_in_sync = content_in_sync
        self._content_due = True  # rows may be pending: events applied, or unavailable ones to retry
        self._fetcher = Fetcher()  # header fetches, one lane per worker (krill.store.fetcher)
        self._chain_id: int | None = None
        self._cursor: int | None = None  # next block to read, as this process last read or wrote it
        self._tip: tuple[int, str] | None = None  # (block, hash) of the last indexed block
        self._anchored = False  # the start block's hash was found on the chain and checked
        self._tip_checked_at = float("-inf")  # monotonic time of the last tip check
        self._head_read_at = float("-inf")  # monotonic time of the last head read

    # ------------------------------------------------------------------ chain access

    @property
    def chain_id(self) -> int:
        if self._chain_id is None:
            w3 = self.chain.w3
            self._chain_id = with_retries(lambda: w3.eth.chain_id, "eth_chainId", endpoint=endpoint_of(w3))
        return self._chain_id

    def safe_head(self) -> int:
        """The newest block with `confirmations` blocks on top (-1 if none)."""
        return self.chain.block_number() - self.confirmations

    def _logs(self, start: int, end: int) -> tuple[list[ChainEvent], dict[int, int], int | None, dict[int, str]]:
        """The run's events in blocks start..end, the timestamps their logs carry (by block), the
        newest block with a log (None if there is none), and the block hashes the logs carry."""
        return self._decoded(self._get_logs(start, end), start)

    def _logs_since(self, start: int) -> tuple[list[ChainEvent], dict[int, int], int | None, dict[int, str]]:
        """`_logs` from `start` to the node's latest block, in one request. The query starts a block
        earlier, whose logs are dropped: a node may refuse a range that starts past its head (Anvil
        does), which `start` is whenever no block came since the last pass. Any answer that is not
        logs reads as none found (the head path then runs when due, in batches a capped node accepts)."""
        try:
            logs = self._get_logs(max(start - 1, 0), "latest")
        except LOG_REFUSALS as exc:
            log.debug("eth_getLogs from block %d to latest refused: %s", start - 1, exc)
            return [], {}, None, {}
        return self._decoded(logs, start)

    def _get_logs(self, start: int, end: int | str) -> list:
        w3 = self.chain.w3
        query = {"fromBlock": start, "toBlock": end, "address": [self.chain.address]}
        return with_retries(lambda: w3.eth.get_logs(query), "eth_getLogs", endpoint=endpoint_of(w3))

    def _decoded(self, logs: list, start: int) -> tuple[list[ChainEvent], dict[int, int], int | None, dict[int, str]]:
        hashes = {int(lg["blockNumber"]): bytes(lg["blockHash"]).hex() for lg in logs
                  if lg.get("blockHash") is not None}  # the block before `start` too: the tip check reads it
        logs = sorted((lg for lg in logs if lg["blockNumber"] >= start), key=lambda lg: (lg["blockNumber"], lg["logIndex"]))
        stamped = {int(lg["blockNumber"]): _timestamp(lg["blockTimestamp"]) for lg in logs
                   if lg.get("blockTimestamp") is not None}
        events = (decode_log(self.chain.w3, lg) for lg in logs)
        newest = int(logs[-1]["blockNumber"]) if logs else None
        return [e for e in events if e is not None], stamped, newest, hashes

    def _block_times(self, events: list[ChainEvent], stamped: dict[int, int]) -> dict[int, int]:
        """Each event block's timestamp: from its logs where the node puts it there (`blockTimestamp`,
        Anvil and recent geth), else one block read per block."""
        w3 = self.chain.w3
        return {n: stamped[n] if n in stamped else
                int(with_retries(lambda n=n: w3.eth.get_block(n)["timestamp"], "eth_getBlockByNumber",
                                 endpoint=endpoint_of(w3)))
                for n in sorted({e.block_number for e in events})}

    # ------------------------------------------------------------------ cursor

    def _meta(self, session) -> IndexMeta:
        """The index's deployment row (created on first use), checked against this chain and contract."""
        meta = session.get(IndexMeta, 1, with_for_update=True)
        protocol = address(self.chain.address)
        if meta is None:
            # Two indexers may both find no row: the second insert loses on the primary key, and its
            # savepoint rolls back alone; it then waits on the winner's row like any later pass.
            try:
                with session.begin_nested():
                    session.add(IndexMeta(id=1, chain_id=self.chain_id, protocol=protocol,
                                          start_block=self.start_block, next_block=self.start_block))
            except IntegrityError:
                pass
            meta = session.get(IndexMeta, 1, with_for_update=True, populate_existing=True)
        elif (meta.chain_id, meta.protocol) != (self.chain_id, protocol):
            raise IndexMismatchError(
                f"this database indexes contract {meta.protocol} on chain {meta.chain_id}, not {protocol} on "
                f"chain {self.chain_id}: run `krill index rebuild` or set database.url to another database")
        return meta

    def next_block(self) -> int:
        """The first block not yet indexed (read from the database); checks the start block's hash."""
        from krill.db.models import IndexAnchor

        anchor = self._start_block_hash()
        with self.db.write() as session:
            self._cursor = self._meta(session).next_block
            self._check_anchor(session, anchor)
            tip = session.get(IndexAnchor, TIP_ROW)
            self._tip = None if tip is None else (tip.block_number, tip.block_hash)
        self._anchored = anchor is not None
        return self._cursor

    def _start_block_hash(self) -> str | None:
        """The chain's hash of the start block (None while the chain has not reached it)."""
        w3 = self.chain.w3
        try:
            block = with_retries(lambda: w3.eth.get_block(self.start_block), "eth_getBlockByNumber",
                                 endpoint=endpoint_of(w3))
        except BlockNotFound:
            return None
        return bytes(block["hash"]).hex()

    def _check_anchor(self, session, chain_hash: str | None) -> None:
        """Record the start block's hash on first use; IndexMismatchError when the chain now has another."""
        from krill.db.models import IndexAnchor

        anchor = session.get(IndexAnchor, 1)
        if chain_hash is None:
            return
        if anchor is None:
            session.add(IndexAnchor(id=1, block_number=self.start_block, block_hash=chain_hash))
            return
        if (anchor.block_number, anchor.block_hash) != (self.start_block, chain_hash):
            raise IndexMismatchError(
                f"this database indexes another chain: its block {anchor.block_number} has hash "
                f"{anchor.block_hash[:16]}…, the chain at {endpoint_of(self.chain.w3)} has "
                f"{chain_hash[:16]}… at block {self.start_block} (a devnet restarted since?): run "
                "`krill index rebuild`, or set database.url to another database")

    def _block_hash(self, number: int) -> str:
        return self._block_ids(number)[0]

    def _block_ids(self, number: int) -> tuple[str, str]:
        """(hash, parent hash) of block `number`, hex."""
        w3 = self.chain.w3
        block = with_retries(lambda: w3.eth.get_block(number), "eth_getBlockByNumber", endpoint=endpoint_of(w3))
        return bytes(block["hash"]).hex(), bytes(block["parentHash"]).hex()

    def _check_tip(self, hashes: dict[int, str]) -> None:
        """The chain still has the last indexed block as indexed (from `hashes`, the logs' block hashes,
        where they hold it; else one block read). IndexMismatchError when it has another block there;
        ChainUnavailableError while it has none (see the module docstring)."""
        self._tip_checked_at = time.monotonic()
        if self._tip is None:
            return
        number, indexed = self._tip
        if number in hashes:
            now = hashes[number]
        else:
            try:
                now = self._block_hash(number)
            except BlockNotFound:
                raise ChainUnavailableError(
                    f"the chain at {endpoint_of(self.chain.w3)} has no block {number}, which this index has read "
                    "(a node behind the others, or a restarted chain): waiting until it can be told apart") from None
        if now != indexed:
            raise IndexMismatchError(
                f"the chain at {endpoint_of(self.chain.w3)} no longer has block {number} as indexed (hash "
                f"{indexed[:16]}…, now {now[:16]}…): a reorganisation deeper than the {self.confirmations} "
                "confirmations, or a restarted chain; run `krill index rebuild`")

    # ------------------------------------------------------------------ passes

    def sync(self) -> SyncReport:
        """Index every confirmed block not yet indexed, then fetch pending content; one pass."""
        if self._cursor is None or not self._anchored:  # first pass, or the chain was short of the start block
            self.next_block()
        elif self.latest_logs and self.confirmations == 0:
            first = self._cursor
            events, stamped, newest, hashes = self._logs_since(first)
            if newest is not None:
                report = SyncReport(from_block=first, next_block=first, safe_head=newest)
                self._check_tip(hashes)
                if self._apply(first, newest, events, stamped, report, hashes.get(newest) or self._block_hash(newest)):
                    return self._fetch(report)
            elif time.monotonic() - self._head_read_at < HEAD_READ_S:
                # no head read: the newest block known is the last one indexed
                return self._fetch(SyncReport(from_block=first, next_block=first, safe_head=first - 1))
        first = self._cursor
        safe = self.safe_head()
        self._head_read_at = time.monotonic()
        report = SyncReport(from_block=first, next_block=first, safe_head=safe)
        start, checked = first, False
        if start > safe and time.monotonic() - self._tip_checked_at >= TIP_CHECK_S:
            self._check_tip({})  # no new block: now and then, so a chain that went back is not left unnoticed

        def batch(begin: int, end: int) -> tuple[str, list[ChainEvent], dict[int, int]]:
            nonlocal checked
            end_hash, end_parent = self._block_ids(end)  # before its logs: a reorg in between shows on the next check
            if not checked:  # the tip is the parent of the first new block: its parentHash, read with it
                checked = True
                if self._tip is not None and self._tip[0] == begin - 1:
                    parent = end_parent if begin == end else self._block_ids(begin)[1]
                    self._check_tip({begin - 1: parent})
                else:
                    self._check_tip({})
            events, stamped, _, _ = self._logs(begin, end)
            return end_hash, events, stamped

        while start <= safe:
            asked = min(safe, start + self.batch_blocks - 1)
            end, (end_hash, events, stamped) = read_within_cap(batch, start, asked)
            if end < asked:  # the node caps eth_getLogs: smaller batches from now on
                self.batch_blocks = end - start + 1
            if not self._apply(start, end, events, stamped, report, end_hash):
                start = self._cursor  # another indexer applied this range: go on from its cursor
                continue
            start = end + 1
        return self._fetch(report)

    def _apply(self, start: int, end: int, events: list[ChainEvent], stamped: dict[int, int],
               report: SyncReport, end_hash: str) -> bool:
        """Apply blocks start..end's `events` and move the cursor past them, under the write lock, with
        block `end`'s hash as the tip; False (nothing applied) where the database's cursor is not at
        `start`, which is then kept."""
        from krill.db.models import IndexAnchor

        times = self._block_times(events, stamped)
        with self.db.write() as session:
            meta = self._meta(session)
            if meta.next_block != start:
                self._cursor = meta.next_block
                return False
            known = known_events(session, events)
            applied = sum(apply_event(session, event, times[event.block_number], self.trust_prior, known)
                          for event in events)
            meta.next_block = end + 1
            tip = session.get(IndexAnchor, TIP_ROW)
            if tip is None:
                session.add(IndexAnchor(id=TIP_ROW, block_number=end, block_hash=end_hash))
            else:
                tip.block_number, tip.block_hash = end, end_hash
        self._cursor, self._tip = end + 1, (end, end_hash)
        if applied:
            self._content_due = True
        report.events += applied
        report.batches += 1
        report.next_block = end + 1
        return True

    def _fetch(self, report: SyncReport) -> SyncReport:
        if self.content_in_sync:
            self.fetch_due_content(report)
        return report

    def fetch_due_content(self, report: SyncReport | None = None) -> bool:
        """`fetch_content` when rows may be pending (see the module docstring); True when it ran."""
        if self.store is None or not self._content_due:
            return False
        self.fetch_content(report)
        return True

    def fetch_content(self, report: SyncReport | None = None) -> None:
        """Fetch pending and retryable headers and manifests from the store and record the outcome."""
        report = report or SyncReport(0, 0, 0)
        if self.store is None:
            return
        before = _unavailable(report)
        retry = or_(Header.status == FetchStatus.PENDING,
                    (Header.status == FetchStatus.UNAVAILABLE) & (Header.attempts < self.max_fetch_attempts))
        meta = {"chain_id": self.chain_id, "contract": address(self.chain.address)}
        due, queued, after = [], [], -1  # each header is tried at most once per pass
        while True:
            with self.db.session() as session:
                rows = session.execute(select(Header.commit_id, Header.attempts, Commit).join(Commit)
                                       .where(retry, Header.commit_id > after).order_by(Header.commit_id)
                                       .limit(self.fetch_batch)).all()
            if not rows:
                break
            after = rows[-1].commit_id
            for commit_id, attempts, c in rows:
                facts = CommitFacts(commit_id=c.commit_id, header_cid=c.header_cid, run_id=c.run_id, worker=c.worker,
                                    version=c.version, nonce=c.nonce, worker_key=c.worker_key, **meta)
                if self._fetcher.submit(c.worker, commit_id, partial(fetch_header, self.store, facts,
                                                                     self.header_limits)):
                    queued.append(commit_id)
                due.append((commit_id, attempts))
        self._fetcher.wait(queued, PASS_WAIT_S)
        results = [(commit_id, attempts, done.result()) for commit_id, attempts in due
                   if (done := self._fetcher.take(commit_id)) is not None]
        for i in range(0, len(results), self.fetch_batch):
            with self.db.write() as session:
                for commit_id, attempts, outcome in results[i:i + self.fetch_batch]:
                    self._store_header(session, commit_id, attempts, outcome)
                    report.count("headers", outcome.status)
        self._fetch_manifests(report)
        # due again for what the store lacked (retried on later passes, up to max_fetch_attempts) and
        # for fetches still running; a fault that raises above leaves it due
        self._content_due = _unavailable(report) > before or len(results) < len(due)

    def _store_header(self, session, commit_id: int, attempts_seen: int, outcome: Fetched) -> None:
        row = session.get(Header, commit_id, with_for_update=True)
        if row.attempts != attempts_seen or row.status in (FetchStatus.AVAILABLE, FetchStatus.INVALID):
            return  # another indexer recorded an outcome meanwhile
        row.status, row.error, row.attempts = outcome.status, outcome.error, row.attempts + 1
        for name, value in outcome.values.items():
            setattr(row, name, value)

    def _fetch_manifests(self, report: SyncReport) -> None:
        retry = or_(Version.manifest_status == FetchStatus.PENDING,
                    (Version.manifest_status == FetchStatus.UNAVAILABLE)
                    & (Version.manifest_attempts < self.max_fetch_attempts))
        with self.db.session() as session:  # versions are few: take the whole list, each tried once per pass
            todo = session.execute(select(Version.run_id, Version.version, Version.manifest_cid,
                                          Version.manifest_attempts).where(retry)
                                   .order_by(Version.run_id, Version.version)).all()
        for i in range(0, len(todo), self.fetch_batch):
            chunk = todo[i:i + self.fetch_batch]
            results = [(r, fetch_manifest(self.store, r.manifest_cid, r.version)) for r in chunk]
            with self.db.write() as session:
                for r, outcome in results:
                    report.count("manifests", outcome.status)
                    row = session.get(Version, (r.run_id, r.version), with_for_update=True)
                    if row.manifest_attempts != r.manifest_attempts or row.manifest_status in (
                            FetchStatus.AVAILABLE, FetchStatus.INVALID):
                        continue  # another indexer recorded an outcome meanwhile
                    row.manifest_status, row.manifest_error = outcome.status, outcome.error
                    row.manifest_attempts += 1
                    for name, value in outcome.values.items():
                        setattr(row, name, value)
                    for shard in outcome.shards:
                        session.add(Shard(run_id=r.run_id, version=r.version, **shard))

    def rebuild(self) -> SyncReport:
        """Drop the index tables and replay the chain from `start_block` (role state is kept)."""
        self.db.reset_index()
        self._cursor = None
        self._content_due = True
        return self.sync()

    def follow(self, poll_interval_s: float = 1.0, stop: threading.Event | None = None,
               on_pass: Callable[[SyncReport], None] | None = None) -> None:
        """Sync repeatedly until `stop` is set; a chain outage is waited out with back-off."""
        stop = stop or threading.Event()
        delay = poll_interval_s
        while not stop.is_set():
            try:
                report = self.sync()
            except ChainUnavailableError as exc:
                log.warning("chain unavailable, retrying in %.1f s: %s", delay, exc)
                stop.wait(delay)
                delay = min(delay * 2, 30.0)
                continue
            delay = poll_interval_s
            if on_pass is not None:
                on_pass(report)
            stop.wait(poll_interval_s)

    def status(self) -> IndexStatus:
        """Cursor, confirmed head, row counts, and content fetch states."""
        safe = self.safe_head()
        with self.db.session() as session:
            meta = session.get(IndexMeta, 1)
            rows = {t.name: session.scalar(select(func.count()).select_from(t)) for t in INDEX_TABLES}
            headers = dict(session.execute(select(Header.status, func.count()).group_by(Header.status)).all())
            manifests = dict(session.execute(select(Version.manifest_status, func.count())
                                             .group_by(Version.manifest_status)).all())
        return IndexStatus(chain_id=meta.chain_id if meta else None, protocol=meta.protocol if meta else None,
                           next_block=meta.next_block if meta else None, safe_head=safe, rows=rows,
                           headers={k.value: v for k, v in headers.items()},
                           manifests={k.value: v for k, v in manifests.items()})


def _unavailable(report: SyncReport) -> int:
    """Fetches in `report` whose content the store did not have (retryable)."""
    suffix = f"_{FetchStatus.UNAVAILABLE.value}"
    return sum(n for key, n in report.fetched.items() if key.endswith(suffix))


def _timestamp(value) -> int:
    """A log's `blockTimestamp` as web3 hands it over: a 0x-hex quantity or an int."""
    return int(value, 16) if isinstance(value, str) else int(value)
