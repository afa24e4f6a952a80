"""What a participant's `status` shows: stake, unbonding, jailing, trust, earnings, from chain and index.

Design decisions:
- The chain is the authority for money: stake, unbonding, release block, jailed, claimable are
  read from contract views at the head, never from a cache.
- A worker's trust is the trust the coordinator weighed it at, read from public data: the newest
  of its run's published aggregation records (located by the on-chain record digests, checked
  against them) that accepts one of the worker's contributions, with the version and commit it
  comes from (`trust_weighed`). At most `RECORDS_READ` records are read, newest first, and the
  walk stops at the first unreadable one (an older weighing is not passed off as the current one),
  so status stays fast; beyond that, or before the first weighing, trust is "none" with why.
- Status is interactive, so its time on the store is bounded: the store it opens waits at most
  `RECORD_WAIT_S` for one record, whatever the configured store timeout (a networked store waits
  that long, 60 s by default, for content nobody serves: status hung a minute on one such record,
  and up to eight timeouts on records served slowly), and no record is asked for once
  `RECORDS_BUDGET_S` have passed; status then says which versions' records it could not read.
  At worst the walk takes `RECORDS_BUDGET_S + RECORD_WAIT_S`. A record that takes longer to find
  reads as unavailable, and the next status tries again.
- An embedded-Kubo repo is held by the worker's own node while the worker runs (`RepoInUseError`):
  status then reads the records among the blocks already in that repo, without a node
  (`RepoBlocksReader`), and the trust row says so; a record the worker has not loaded reads as
  unavailable. Before, status said "store unavailable" exactly while the worker ran.
- The index's Beta tally over every verdict on the worker's commits (`Participant.trust`) is not
  shown as trust: the coordinator counts only verdicts of verifiers the commit's randomness drew,
  staked no later than the commit's block, on its run's commits, with its run's prior, so any
  staked account can raise the tally at will (five verifiers staked after a commit, passing it,
  lifted it from 0.4 to 0.7 while the coordinator weighed the worker at 0.25). The index's verdict
  counts are shown instead, labelled as every verifier's (`verdicts`). Verifiers are not weighed.
- A contribution counts as accepted once a published version folded it (`aggregated_version` up to
  the chain's latest version), as the record that version publishes, the explorer and `krill demo`
  count it: the coordinator's rows say accepted from validation on, while the contribution waits
  for a version (which may still reject it, as late) and while its version is journalled but not
  published. Those are counted apart (`accepted_unpublished`); counted as accepted, status said
  "3 accepted" beside a trust row that no published version had weighed the worker yet.
- The worker's commits the index holds (from the chain) with no coordinator row are counted too
  (`undecided`), and whether the index holds any of the coordinator's rows for the run at all
  (`decisions_indexed`): an index synced from the chain (`krill index sync`) has none, and status
  said "0 accepted, 0 rejected, 0 pending" of a worker with 31 commits on the run.
- The coordinator's verdicts on contributions and the earnings tally live in the index database
  (`krill.db`). The index is used when one is there for this deployment (an existing SQLite file
  or a reachable PostgreSQL whose `index_meta` names this contract); it is opened read-only
  (no table creation), and when it is missing, unreadable or of another contract the figures say
  "unknown (...)" with the reason instead of failing: status must work for a worker on a laptop
  that keeps no index. A PostgreSQL index is opened with libpq's `connect_timeout` (`INDEX_CONNECT_S`)
  unless the URL sets one: without it a server that accepts the connection and never answers held
  status for good (and a host whose packets are dropped for the kernel's two minutes).
- The readable table says which block the index was read to when figures come from it: the rows
  labelled "index" (verdict counts, the coordinator's decisions) are as of that block, and a stale
  index showed its old counts as current (a verifier's "0 passing" beside five attestations).
- Earnings without an index are summed from the account's `RewardCredited`/`BountyCredited`
  events since the deploy block: slower on a long chain, but exact. With an index, its tally covers
  the blocks before its cursor and the events from the cursor to the head are added: an index
  synced a while ago showed its old total as the earnings (10 KRILL earned beside 30 claimable).
  The tally and the cursor are read in one statement, not the cursor when the index is opened: an
  indexer running meanwhile (the coordinator syncs its index every pass) moved both, and the credits
  between the two cursors were counted twice (50 KRILL earned of 30).
- Amounts are exact decimal strings of tokens in the JSON form (no float rounding, no integers
  beyond what JavaScript reads exactly).
- Each status also carries `hints`: the next command for every state that needs one (not staked,
  below the minimum, jailed, unbonding released, something to claim).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from krill.config import KrillConfig
from krill.errors import ConfigError, ContentNotFoundError, KrillError
from krill.staking import jailed_advice, role_code, role_name, tokens

NO_INDEX = "unknown (no index)"
RECORDS_READ = 8  # newest published records a worker's status reads at most, looking for its weighing
NOT_WEIGHED = "none (the coordinator weighs workers' contributions, not verifiers)"
RECORD_WAIT_S = 5.0      # the most status waits for one record, whatever the store's own timeout
RECORDS_BUDGET_S = 15.0  # no further record is asked for once the walk has taken this long
INDEX_CONNECT_S = 5      # connect_timeout of a PostgreSQL index whose URL sets none
INDEX_BEHIND = 100       # blocks behind the head from which the status table suggests syncing the index


@dataclass
class Index:
    """An open index database for this deployment, or why there is none."""

    db: object | None
    note: str
    next_block: int | None = None

    def close(self) -> None:
        if self.db is not None:
            self.db.close()


def open_index(config: KrillConfig) -> Index:
    """The configured index if it exists and belongs to the configured contract (never creates one)."""
    from sqlalchemy import select
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from krill.db.models import IndexMeta
    from krill.db.session import open_database

    url = make_url(config.database.url)
    if url.get_backend_name() == "sqlite" and (not url.database or not Path(url.database).expanduser().exists()):
        return Index(None, NO_INDEX)
    target = config.database.url
    if url.get_backend_name() == "postgresql" and "connect_timeout" not in url.query:
        target = url.update_query_dict({"connect_timeout": str(INDEX_CONNECT_S)}).render_as_string(hide_password=False)
    db = None
    try:
        db = open_database(target, create=False)
        if "index_meta" not in db.table_names():
            db.close()
            return Index(None, NO_INDEX)
        with db.session() as session:
            meta = session.scalars(select(IndexMeta)).first()
        if meta is None or meta.protocol.lower() != (config.chain.protocol_address or "").lower():
            db.close()
            return Index(None, "unknown (the index holds another deployment: `krill index rebuild`)")
        return Index(db, "index", meta.next_block)
    except (SQLAlchemyError, KrillError) as exc:
        # Deliberately tolerated: status still reports everything the chain knows.
        if db is not None:
            db.close()
        return Index(None, f"unknown (index unreadable: {str(exc).splitlines()[0][:120]})")


@dataclass
class AccountStatus:
    """One participant's standing; amounts in base units (see `to_json`)."""

    role: str
    address: str
    staked_as: str
    staked: int
    unbonding: int
    release_block: int
    head_block: int
    jailed: bool
    minimum: int
    eligible: bool
    claimable: int
    earned: int | None
    claimed: int | None
    trust: float | None
    trust_note: str
    index: str
    index_block: int | None
    run: dict | None
    hints: list[str] = field(default_factory=list)
    trust_weighed: dict | None = None  # {run_id, version, commit_id} of the record `trust` comes from
    verdicts: dict | None = None       # the index's {passed, failed} over every verdict on its commits

    @property
    def blocks_to_release(self) -> int:
        return max(0, self.release_block - self.head_block - 1) if self.unbonding else 0

    def to_json(self) -> dict:
        data = asdict(self)
        for key in ("staked", "unbonding", "minimum", "claimable", "earned", "claimed"):
            if data[key] is not None:
                data[key] = tokens(data[key])
        data["blocks_to_release"] = self.blocks_to_release
        data["amounts"] = "KRILL (decimal strings)"
        return data


def _earned_from_chain(chain, address: str, from_block: int) -> tuple[int, int]:
    from krill.chain.events import BountyCredited, Claimed, RewardCredited

    earned = claimed = 0
    who = address.lower()
    for ev in chain.events(from_block, kinds=(RewardCredited, BountyCredited, Claimed)):
        account = getattr(ev, "account", None) or getattr(ev, "verifier", "")
        if account.lower() != who:
            continue
        if isinstance(ev, Claimed):
            claimed += ev.amount
        else:
            earned += ev.amount
    return earned, claimed


def check_run(chain, run_id: bytes) -> dict:
    """The configured run as the chain sees it; `ConfigError` naming run.id when it does not exist."""
    info = chain.run_of(run_id)
    if not info.exists:
        raise ConfigError(f"run {run_id.hex()} does not exist on the chain at {chain.address}: check run.id in "
                          "the config (`krill coordinator create-run` prints it) and that the config points at the "
                          "right chain and contract")
    return {"id": run_id.hex(), "latest_version": info.latest_version, "reward_pool": tokens(info.reward_pool)}


def weighed_trust(chain, store, run_id: bytes, worker: str, latest_version: int, depth: int = RECORDS_READ,
                  budget_s: float = RECORDS_BUDGET_S) -> tuple[float | None, str, dict | None]:
    """(trust, note, where) of the newest of the run's last `depth` published records that accepts a
    contribution of `worker`: the trust the coordinator weighed it at (see the module docstring). No record
    is asked for once `budget_s` seconds have passed (one fetch's wait is the store's timeout)."""
    from krill.protocol.record import load_record

    who = worker.lower()
    oldest = max(1, latest_version - depth + 1)
    deadline = time.monotonic() + budget_s
    for version in range(latest_version, oldest - 1, -1):
        if version < latest_version and time.monotonic() >= deadline:
            return None, f"unknown ({_records(version + 1, latest_version)} did not weigh this account and took " \
                         f"over {budget_s:g}s to read; {_records(oldest, version)} {_was(oldest, version)} not read)", \
                None
        try:
            record = load_record(store, chain.version_of(run_id, version).record_digest)
        except KrillError as exc:
            # Deliberately tolerated: status still reports everything else.
            unread = f"; {_records(oldest, version - 1)} {_was(oldest, version - 1)} not read" \
                if version > oldest else ""
            why = str(exc.args[0]) if exc.args else str(exc)  # a KeyError's str() would quote it
            return None, f"unknown (the record of version {version} is " \
                         f"{'unavailable' if isinstance(exc, ContentNotFoundError) else 'unreadable'}: " \
                         f"{why.splitlines()[0][:120] if why else type(exc).__name__}{unread})", None
        mine = [e for e in record.accepted if e.worker == who]
        if not mine:
            continue
        entry = max(mine, key=lambda e: e.commit_id)
        try:
            trust = float(entry.trust)
        except ValueError:
            trust = math.nan
        if not math.isfinite(trust):
            return None, f"unknown (the record of version {version} gives commit #{entry.commit_id} the trust " \
                         f"{entry.trust[:40]!r}, not a number)", None
        return trust, f"weighed by the coordinator in version {version} (commit #{entry.commit_id})", \
            {"run_id": run_id.hex(), "version": version, "commit_id": entry.commit_id}
    if latest_version == 0:
        return None, "none yet (the run has published no version)", None
    if oldest == 1:
        return None, "none yet (no published version folded a contribution of this account)", None
    return None, f"none in the last {depth} published versions (versions {oldest}..{latest_version})", None


def _records(first: int, last: int) -> str:
    return f"the record of version {first}" if first == last else f"the records of versions {first}..{last}"


def _was(first: int, last: int) -> str:
    return "was" if first == last else "were"


def _interactive(store_config):
    """`store_config` with its fetch timeout cut to `RECORD_WAIT_S` (a local store has none to cut)."""
    timeout = getattr(store_config, "timeout_s", None)
    if timeout is None or timeout <= RECORD_WAIT_S:
        return store_config
    return store_config.model_copy(update={"timeout_s": RECORD_WAIT_S})


def _worker_trust(config: KrillConfig, chain, store, run_id: bytes | None, address: str,
                  run: dict | None) -> tuple[float | None, str, dict | None]:
    if run_id is None or run is None:
        return None, "unknown (run.id is not set)", None
    if run["latest_version"] == 0:
        return weighed_trust(chain, store, run_id, address, 0)
    if store is not None:
        return weighed_trust(chain, store, run_id, address, run["latest_version"])
    from krill.store.base import open_store
    from krill.store.embedded_kubo import RepoBlocksReader, RepoInUseError

    source = ""
    try:
        try:
            opened = open_store(_interactive(config.store))
        except RepoInUseError as exc:  # the worker's node holds its repo: read the blocks already there
            opened = RepoBlocksReader(exc.repo, max_get_bytes=config.store.max_get_bytes)
            whose = f"pid {exc.holder}'s" if exc.holder is not None else "another process's"
            source = f" [read without a node from the blocks already in {exc.repo}, which {whose} " \
                     "node holds: nothing fetched from the network]"
    except KrillError as exc:
        # Deliberately tolerated, as an unreadable record is.
        return None, f"unknown (store unavailable: {str(exc).splitlines()[0][:120]})", None
    try:
        trust, note, where = weighed_trust(chain, opened, run_id, address, run["latest_version"])
        return trust, note + source, where
    finally:
        opened.close()


def account_status(config: KrillConfig, role: str, chain, address: str, index: Index,
                   run_id: bytes | None, store=None) -> AccountStatus:
    """Chain figures for `address`, a worker's weighed trust from its run's published records (`store`:
    the content store to read them from, its timeout the caller's; when None, the configured one, opened
    with the fetch timeout cut to `RECORD_WAIT_S`), earnings and verdict counts from
    `index` when it is there."""
    from sqlalchemy import select

    from krill.db.models import IndexMeta, Participant

    info = chain.stake_of(address)
    head = chain.block_number()
    minimum = chain.minimum_stake(role_code(role))
    run = check_run(chain, run_id) if run_id is not None else None
    earned = claimed = verdicts = None
    cursor = index.next_block
    if role == "worker":
        trust, trust_note, trust_weighed = _worker_trust(config, chain, store, run_id, address, run)
    else:
        trust, trust_note, trust_weighed = None, NOT_WEIGHED, None
    if index.db is not None:
        with index.db.session() as session:
            # One statement: the tally and the cursor it is as of (module docstring, on earnings).
            read = session.execute(select(IndexMeta.next_block, Participant).select_from(IndexMeta)
                                   .outerjoin(Participant, Participant.address == address.lower())).first()
        row = None if read is None else read[1]
        if read is not None:
            cursor = read[0]
        if row is not None:
            later_earned, later_claimed = (0, 0) if cursor is None else _earned_from_chain(chain, address, cursor)
            earned = row.rewards_credited + row.bounties_credited + later_earned
            claimed = row.claimed + later_claimed
            verdicts = {"passed": row.checks_passed, "failed": row.checks_failed}
    if earned is None:
        earned, claimed = _earned_from_chain(chain, address, config.chain.deploy_block)
    status = AccountStatus(
        role=role, address=address, staked_as=role_name(info.role), staked=info.staked, unbonding=info.unbonding,
        release_block=info.release_block, head_block=head, jailed=info.jailed, minimum=minimum,
        eligible=chain.is_eligible(address, role_code(role)), claimable=chain.claimable_of(address), earned=earned,
        claimed=claimed, trust=trust, trust_note=trust_note, index=index.note if index.db is None else "index",
        index_block=cursor, run=run, trust_weighed=trust_weighed, verdicts=verdicts)
    status.hints = hints(status)
    return status


def hints(s: AccountStatus) -> list[str]:
    """The next command for each state of the account that needs one."""
    out = []
    if s.jailed:
        out.append(jailed_advice(s.address))
    elif s.staked_as == "nothing":
        out.append(f"not staked: run `krill {s.role} stake` (minimum {tokens(s.minimum)} KRILL)")
    elif s.staked_as != s.role:
        out.append(f"this account is staked as a {s.staked_as}: use `krill {s.staked_as} status`")
    elif not s.eligible:
        out.append(f"stake {tokens(s.staked)} KRILL is below the {s.role} minimum of {tokens(s.minimum)} KRILL: "
                   f"`krill {s.role} stake --amount {tokens(max(s.minimum - s.staked, 1))}`")
    if s.unbonding:
        if s.blocks_to_release == 0:
            out.append(f"{tokens(s.unbonding)} KRILL is released: `krill {s.role} withdraw`")
        else:
            out.append(f"{tokens(s.unbonding)} KRILL unbonding: withdrawable in {s.blocks_to_release} blocks "
                       f"(block {s.release_block})")
    if s.claimable:
        out.append(f"{tokens(s.claimable)} KRILL to claim: `krill {s.role} claim`")
    return out


def render(s: AccountStatus) -> list[tuple[str, str]]:
    """The common rows of the readable status table (the role adds its own after these)."""
    if s.staked_as in ("nothing", s.role):
        stake = f"{tokens(s.staked)} KRILL (minimum {tokens(s.minimum)}{'' if s.eligible else ', NOT eligible'})"
    else:
        stake = f"{tokens(s.staked)} KRILL as {s.staked_as}"
    if s.unbonding:
        left = "released" if s.blocks_to_release == 0 else f"{s.blocks_to_release} blocks left"
        unbonding = f"{tokens(s.unbonding)} KRILL, release block {s.release_block} ({left}; head {s.head_block})"
    else:
        unbonding = "none"
    rows = [
        ("account", s.address),
        ("stake", stake),
        ("unbonding", unbonding),
        ("jailed", "YES" if s.jailed else "no"),
        *([("trust", f"{s.trust:.3f} ({s.trust_note})" if s.trust is not None else s.trust_note)]
          if s.role == "worker" else []),
        *([("verdicts on its commits", _verdicts_row(s))] if s.role == "worker" else []),
        ("earned", f"{tokens(s.earned)} KRILL" + (f" ({tokens(s.claimed)} claimed)" if s.claimed else "")
         if s.earned is not None else "unknown"),
        ("claimable", f"{tokens(s.claimable)} KRILL"),
    ]
    if s.run is not None:
        rows.append(("run", f"{s.run['id'][:16]}… latest version {s.run['latest_version']}"))
    if s.index == "index" and s.index_block is not None:
        behind = max(0, s.head_block - (s.index_block - 1))
        rows.append(("index", f"read to block {s.index_block - 1} ({behind} behind the head): the figures marked "
                              "index are as of that block" + ("" if behind < INDEX_BEHIND else
                                                               ": `krill index sync` brings them up to date")))
    return rows


def _verdicts_row(s: AccountStatus) -> str:
    if s.verdicts is None:
        return s.index if s.index != "index" else "unknown (not in the index yet: `krill index sync`)"
    return f"{s.verdicts['passed']} passed / {s.verdicts['failed']} failed (every verifier's, index; not trust)"


def contributions_from_index(index: Index, run_id: bytes, worker: str, latest_version: int,
                             recent: int = 5) -> dict | None:
    """The coordinator's decisions on this worker's commits (from the shared database), or None if unknown.
    `latest_version`: the run's newest published version (the chain's); see the module docstring for why
    accepted contributions folded into none up to it are counted apart (`accepted_unpublished`)."""
    from sqlalchemy import case, func, select

    from krill.db.models import Commit, Contribution, ContributionStatus

    if index.db is None or "contributions" not in index.db.table_names():
        return None
    run_hex, who = run_id.hex(), worker.lower()
    where = (Contribution.run_id == run_hex, Contribution.worker == who)
    published = case((Contribution.aggregated_version <= int(latest_version), 1), else_=0)
    with index.db.session() as session:
        by_status: dict[str, int] = {}
        for status, in_published, n in session.execute(
                select(Contribution.status, published, func.count()).where(*where)
                .group_by(Contribution.status, published)).all():
            name = ContributionStatus(status).value
            if name == ContributionStatus.ACCEPTED.value and not in_published:
                name = "accepted_unpublished"
            by_status[name] = by_status.get(name, 0) + int(n)
        reasons = {str(getattr(k, "value", k)): v for k, v in session.execute(
            select(Contribution.reason_code, func.count()).where(*where, Contribution.reason_code.is_not(None))
            .group_by(Contribution.reason_code)).all()}
        latest = session.scalars(select(Contribution)
                                 .where(*where, Contribution.status == ContributionStatus.REJECTED)
                                 .order_by(Contribution.commit_id.desc()).limit(recent)).all()
        undecided = session.scalar(
            select(func.count()).select_from(Commit)
            .where(Commit.run_id == run_hex, Commit.worker == who,
                   Commit.commit_id.not_in(select(Contribution.commit_id).where(Contribution.run_id == run_hex)))) \
            if "commits" in index.db.table_names() else 0
        indexed = session.scalar(select(Contribution.commit_id).where(Contribution.run_id == run_hex).limit(1))
    return {
        "accepted": by_status.get("accepted", 0), "accepted_unpublished": by_status.get("accepted_unpublished", 0),
        "rejected": by_status.get("rejected", 0), "pending": by_status.get("pending", 0),
        "undecided": int(undecided or 0), "decisions_indexed": indexed is not None,
        "rejected_by_reason": dict(sorted(reasons.items())),
        "recent_rejections": [{"commit_id": c.commit_id, "version": c.version,
                               "reason_code": getattr(c.reason_code, "value", c.reason_code),
                               "reason": c.reason} for c in latest],
    }


def verdicts_from_index(index: Index, verifier: str) -> dict | None:
    """This verifier's attestations as the index saw them on-chain, or None without an index."""
    from sqlalchemy import func, select

    from krill.db.models import Verdict

    if index.db is None:
        return None
    with index.db.session() as session:
        counts = dict(session.execute(select(Verdict.ok, func.count()).where(Verdict.verifier == verifier.lower())
                                      .group_by(Verdict.ok)).all())
    return {"passed": counts.get(True, 0), "failed": counts.get(False, 0)}
