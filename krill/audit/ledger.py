"""What the chain paid and took for a version, against the rules anyone can recompute from public data.

Design decisions:
- The contract lets the run's coordinator settle any accounts and amounts (within rewardPerVersion
  and the pool) and slash or not as it likes; only the rules say what it should do. So the audit
  restates the rules, one row each per audited version:
  * `settlement`: when the chain says the version is settled, its `RewardCredited` events, summed per
    account, must be `version_split(spec, version, total, record.accepted)` (`krill.protocol.rewards`,
    the function the coordinator settles with, under the run's `reward.ties`) of the total its
    `VersionSettled` event took; and that total must be the rule's amount, min(reward per version,
    pool), for the pool the run held at some moment between the version's publication and its
    settlement (the coordinator reads the pool after it publishes, and a funding that lands between
    its read and its transaction must not make it look dishonest). A coordinator that pays itself,
    or anyone the record does not weigh, fails here.
    A version that is not settled passes while nothing is owed (no positive weight in the record, a
    reward per version of 0, or a pool that was empty at some moment since the publication: the
    rule's amount was 0 then) and while it is recent; it fails as skipped once it is overdue: once a
    later version is settled, or version v + SETTLE_GRACE_VERSIONS is published. An honest
    coordinator settles each version right after publishing it, before it ingests for the next
    (`coordinator/loop.py`), so it is never overdue; a grace of two publications leaves room for
    one that settles a version behind, and an audit run moments after a publication flags nothing.
  * `slashing`: every commit of the run whose failing verdicts reached the run's quorum must be
    slashed. A commit is due at the first version whose parent was published after the commit's
    challenge window closed (commit block + window < the parent's publication block): its verdicts
    are final by then, and the coordinator, which slashes at the start of every pass, has had every
    pass that built the version to do it. Each commit is due at exactly one version, so `--all`
    checks every commit once; one whose window closed after the latest version's parent was
    published is not due yet. A coordinator declines a slash its own replay shows to rest on false
    verdicts (`coordinator/confirm.py`); the audit replays each due commit left unslashed with the
    same checks (`krill.audit.refusals`) and the row fails naming those whose refusal the replay
    does not justify (a check fails, the payload does not validate, or it cannot be read), and
    passes listing the declined commits whose replay passes. A due commit that is slashed is
    judged too (`judge_slash`): the slash must land before the stake behind the commit could leave
    (a coordinator shielding its worker could otherwise wait for the withdrawal, then slash
    nothing), counted with the unbonding periods in force from the commit to the slash, not today's
    (the contract fixes a release block with the period in force when it computes it), and when the
    audit's replay passes every check, some failing verdict's evidence must say the content was
    unavailable (else honest work was slashed on a false quorum, which one staked verifier and the
    coordinator could otherwise do to any worker).
- The run's parameters (quorum, challenge window, reward per version) are the chain's, which the
  contract enforces. Events come from one scan (`AuditSource.history`), read again when the version's
  view (read fresh) says settled and the scan holds no settlement of it: on a live run a coordinator
  settles the latest version while `--all` works through the earlier ones. A due commit is re-read
  from the contract's view, which is authoritative.
- The settlement is checked against the record as published: whether the record itself is sound is
  the other rows' business, and a version whose fold does not match its record can still be settled
  exactly as its record says.
"""

from __future__ import annotations

from krill.audit.entries import _float
from krill.audit.refusals import judge_refusal
from krill.audit.report import AuditReport
from krill.audit.source import DATA_ERRORS, AuditSource, data_fault
from krill.protocol.rewards import version_split

SETTLE_GRACE_VERSIONS = 2
MAX_LISTED = 8  # accounts or commits named in one detail line


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def _listed(items: list[str], sep: str = "; ") -> str:
    more = len(items) - MAX_LISTED
    return sep.join(items[:MAX_LISTED]) + (f"{sep}and {more} more" if more > 0 else "")


def audit_ledger(source: AuditSource, version: int, info, report: AuditReport) -> None:
    """The `settlement` and `slashing` rows of published version `version` (`info`: its chain record)."""
    report.add("settlement", *check_settlement(source, version, info))
    report.add("slashing", *check_slashing(source, version))


def check_settlement(source: AuditSource, version: int, info) -> tuple[bool, str]:
    try:
        record = source.record(version)
    except DATA_ERRORS as exc:
        return False, f"not checked: the aggregation record is unavailable ({data_fault(exc)})"
    bad = [e.weight for e in record.accepted if _float(e.weight) is None]
    if bad:
        return False, f"not checked: the record's weight {bad[0]!r} is not a finite number"
    accepted = [{"worker": e.worker, "weight": e.weight} for e in record.accepted]
    if info.settled:
        return _check_paid(source, version, info, accepted)
    return _check_unsettled(source, version, info, accepted)


def _check_paid(source: AuditSource, version: int, info, accepted: list[dict]) -> tuple[bool, str]:
    history, per_version = source.history, int(source.run.params.reward_per_version)
    events = history.settlements.get(version, [])
    if not events:  # settled after the run's events were read (a live run): read them again
        history = source.refresh_history()
        events = history.settlements.get(version, [])
    if len(events) != 1:
        return False, f"the chain says settled, yet {len(events)} VersionSettled events of the version were found"
    settled = events[0]
    total, where = int(settled.total), (settled.block_number, settled.log_index)
    paid: dict[str, int] = {}
    for credit in history.credits.get(version, []):
        paid[credit.account.lower()] = paid.get(credit.account.lower(), 0) + int(credit.amount)
    paid = {a: n for a, n in paid.items() if n}
    problems = []
    if sum(paid.values()) != total:
        problems.append(f"credits sum to {sum(paid.values())}, the settlement says {total}")
    rule = sorted({min(per_version, p) for p in history.pools_between((int(info.published_block), 0), where)})
    if total > per_version:
        problems.append(f"total {total} exceeds the reward per version {per_version}")
    elif total not in rule:
        problems.append(f"total {total} is not min(reward per version, pool) for any pool the run held between "
                        f"the publication and the settlement (that gives {', '.join(map(str, rule))})")
    owed: dict[str, int] = {}
    # the coordinator credits the record's addresses
    for account, amount in version_split(source.spec, version, total, accepted):
        owed[account.lower()] = owed.get(account.lower(), 0) + amount
    wrong = []
    for account in sorted(set(paid) | set(owed)):
        got, want = paid.get(account, 0), owed.get(account, 0)
        if got != want:
            wrong.append(f"{account} was paid {got}, " + (f"the record owes it {want}" if want else
                                                           "the record owes it nothing"))
    if wrong:
        problems.append(f"credits are not the record's split of {total} pro rata by weight: {_listed(wrong)}")
    return not problems, "; ".join(problems) or (
        f"{total} credited to {_n(len(paid), 'account')} at block {settled.block_number}: min(reward per "
        f"version, pool), split pro rata by the record's weights")


def _check_unsettled(source: AuditSource, version: int, info, accepted: list[dict]) -> tuple[bool, str]:
    history, per_version = source.history, int(source.run.params.reward_per_version)
    owed = version_split(source.spec, version, per_version, accepted)
    if not owed:
        return True, ("not settled; nothing to settle: the reward per version is 0" if per_version <= 0 else
                      "not settled; nothing to settle: the record has no positive weight")
    due = []
    later = history.first_settlement_after(version)
    if later is not None:
        due.append((later[0], f"version {later[1]} was settled at block {later[0][0]}"))
    grace = source.version_info(version + SETTLE_GRACE_VERSIONS)
    if grace is not None:
        due.append(((int(grace.published_block), 0),
                    f"version {version + SETTLE_GRACE_VERSIONS} was published at block {grace.published_block}"))
    if not due:
        return True, (f"not settled yet: due once a later version is settled or version "
                      f"{version + SETTLE_GRACE_VERSIONS} is published")
    point, why = min(due)
    pools = history.pools_between((int(info.published_block), 0), point)
    if 0 in pools:
        return True, ("not settled; nothing was owed: the run's reward pool was empty at some moment between "
                      "the publication and the settlement's due point")
    verb = "is" if len(owed) == 1 else "are"
    return False, (f"not settled, though {why}: the record's {_n(len(owed), 'worker')} {verb} owed min(reward per "
                   f"version {per_version}, pool), and the pool held at least {min(pools)} since the publication")


def check_slashing(source: AuditSource, version: int) -> tuple[bool, str]:
    params = source.run.params
    quorum, window = int(params.attestation_quorum), int(params.challenge_window_blocks)
    parent = source.version_info(version - 1)
    before = source.version_info(version - 2) if version >= 2 else None
    if parent is None:
        return False, f"not checked: version {version - 1} is not published"
    start, end = (int(before.published_block) if before is not None else 0), int(parent.published_block)
    due, unslashed = [], []
    for commit_id in sorted(c for c, n in source.history.fail_counts.items() if n >= quorum):
        commit = source.commit(commit_id)
        if commit.fail_count < quorum or not start <= commit.commit_block + window < end:
            continue
        due.append(commit_id)
        if not commit.slashed:
            unslashed.append(commit_id)
    span = (f"their challenge windows closed in blocks {start}..{end - 1}, before version {version - 1} was "
            f"published")
    wrongly = [why for c in due if c not in unslashed and (why := judge_slash(source, c, window)) is not None]
    if wrongly:
        return False, (f"{_n(len(wrongly), 'commit')} due here ({span}) {'was' if len(wrongly) == 1 else 'were'} "
                       f"slashed wrongly: {'; '.join(wrongly)}")
    judged = {c: judge_refusal(source, c) for c in unslashed}
    unjustified = [c for c in unslashed if not judged[c].justified]
    refused = [c for c in unslashed if judged[c].justified]
    because = "; ".join(f"commit {c}: {judged[c].detail}" for c in unjustified)
    declined = (f"; {_n(len(refused), 'commit')} declined, which the audit's replay passes (the failing verdicts "
                f"were false): {_listed([str(c) for c in refused], ', ')}") if refused else ""
    if unjustified:
        return False, (f"{len(unslashed)} of {_n(len(due), 'commit')} that reached the quorum of {quorum} failing "
                       f"verdicts {'is' if len(unslashed) == 1 else 'are'} not slashed: commits "
                       f"{_listed([str(c) for c in unslashed], ', ')} ({span}), and the audit's replay does not "
                       f"justify declining {_listed([str(c) for c in unjustified], ', ')}: {because}{declined}")
    if due:
        slashed = f"{len(due) - len(refused)} slashed" if refused else "all slashed"
        return True, (f"{_n(len(due), 'commit')} reached the quorum of {quorum} failing verdicts ({span}): "
                      f"{slashed}{declined}")
    return True, (f"no commit reached the quorum of {quorum} failing verdicts with its window closing in blocks "
                  f"{start}..{end - 1}")


def judge_slash(source: AuditSource, commit_id: int, window: int) -> str | None:
    """Why the slash of `commit_id` (due, slashed) fails the audit, or None when it stands.

    It must land before the stake behind the commit could leave, and a slash after that may take
    nothing (the coordinator shielding its worker by waiting). The earliest block it could leave
    follows from the contract's rules, with E = commit block + `window` (the window's close) and U(p)
    the unbonding period in force at point p (the admin may change it at any time, and the view gives
    only today's, so the periods come from the `UnbondingBlocksSet` events, `AuditSource.unbonding_in_force`):
    withdraw pays out only from the worker's release block R on, and after the commit every write of R
    is one of
    * requestUnstake at p: R = max(block of p, windowEnd) + U(p), and windowEnd (the latest close of
      any of the worker's commits, a running maximum) >= E from the commit on;
    * the commit itself, when stake is unbonding: R becomes at least E + U(commit); and a later commit
      of the worker, which only ever raises R (`ReleaseDelayed`).
    A request before the commit leaves R below E + U(commit) only when nothing is unbonding at the
    commit, and then nothing can leave before a new request. So stake withdrawn at block b >= the
    commit's has b >= max(block of p, E) + U(p) for some point p from the commit to b, and a request
    right after the commit, or right after a change of the period, reaches it. The stake could leave
    from min over the periods u in force from the commit to the slash of max(first block u was in
    force there, E) + u: E + the smallest period in force by the window's close, or a shorter period
    set later counted from the block it was set. (Today's period was right only while it never
    changed: raised after an unstake request it excused a slash after the withdrawal, lowered after
    the slash it failed one in time.)

    And it must have grounds: the audit replays the commit as for a declined slash (`judge_refusal`);
    when the replay passes every check, the only ground an honest coordinator has is content that
    stayed unavailable, so some failing verdict's evidence must say `unavailable` (the audit cannot
    see when content appeared: a worker slashed for withholding may upload it afterwards)."""
    commit = source.commit(commit_id)
    event = source.history.slashes.get(commit_id)
    if event is not None:
        block, close = int(event.block_number), int(commit.commit_block) + window
        periods = source.unbonding_in_force(source.history.committed_at.get(commit_id, (int(commit.commit_block), 0)),
                                            (block, int(event.log_index)))
        if periods is None:
            return (f"commit {commit_id} was slashed at block {block}, and the audit cannot tell whether in time: no "
                    f"UnbondingBlocksSet event from block {source.from_block} (the protocol's deployment block, as "
                    f"configured) up to its commit tells the unbonding period then")
        leave = min(max(first, close) + blocks for first, blocks in periods)
        if block >= leave:
            return (f"commit {commit_id} was slashed at block {block}, when the stake behind it could "
                    f"already have left (from block {leave}); the slash took {event.amount}")
    judged = judge_refusal(source, commit_id)
    if judged.justified is not True:
        return None  # the replay fails it, or cannot tell: the slash stands
    reasons = failing_reasons(source, commit_id)
    if "unavailable" in reasons:
        return None
    named = ", ".join(sorted(set(reasons))) or "none the audit could read"
    return (f"commit {commit_id} was slashed, but the audit's replay passes every check and no failing verdict "
            f"said its content was unavailable (their evidence names: {named})")


def failing_reasons(source: AuditSource, commit_id: int) -> list[str]:
    """The `reason` of each readable failing verdict's evidence document about `commit_id`."""
    from krill.payload.canonical import parse_canonical
    from krill.store.cid import digest_to_cid

    reasons = []
    for digest in source.history.failing_evidence.get(commit_id, []):
        try:
            doc = parse_canonical(source.store.get(digest_to_cid(digest), max_bytes=1 << 20), 1 << 20, "evidence")
        except DATA_ERRORS:
            continue
        if isinstance(doc, dict) and doc.get("commit_id") == commit_id and isinstance(doc.get("reason"), str):
            reasons.append(doc["reason"])
    return reasons
