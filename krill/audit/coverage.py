"""Every commit of the run is named in some record in time: a coordinator cannot drop work in silence.

Design decisions:
- The coordinator promises that each commit of the run ends accepted or rejected, and that every
  accepted and every rejected one is named in a record (`coordinator/ingest.py`, `coordinator/close.py`).
  Without this row a coordinator could leave an honest worker's commit out of every record: out of
  the fold and the reward, and invisible to every other check, which all start from the records.
- When it is due. An honest coordinator decides a commit once it fetched the content, or, for
  content that never arrives, once `spec.version.deadline_s` has passed since the commit's block,
  after a last fetch that may wait out its store's timeout; fetches of one worker queue in one lane
  and the lanes share a few threads (`krill.store.fetcher`), so other workers' junk can delay it a
  little more. So a commit is due at version v when, as of the publication block of v's parent,
  its challenge window has closed and `deadline_s + DECISION_SLACK_S` have passed since its block
  (block timestamps); the slack (10 minutes) covers a 60 s store timeout for some eighty lanes of
  junk ahead of it. Each commit is due at exactly one version (like the slashing row), so `--all`
  judges each once, and versions published moments apart judge few commits each.
- Room. A record names at most `MAX_ACCEPTED_PER_VERSION` accepted entries and
  `MAX_REJECTED_PER_RECORD` rejections within its byte cap (`fitting_entries`); the rest wait. When
  a version's record had no room (`had_room`), its due commits are judged at the next version whose
  record had room, together with that version's own.
- A worker's own junk. A commit queued behind the same worker's content that never arrived waits
  for it: a commit is not judged when an earlier commit of the same worker, committed at most a
  challenge window before it, is named in a record as `unavailable`. Only a named rejection
  excuses: an unnamed commit does not, else one `unavailable` claim (which the audit cannot check)
  would excuse a chain of later commits a window apart, dropped in silence. The queue behind junk
  is short-lived: the junk is slashed once a verifier fails it, and a jailed worker's commits are
  rejected before any fetch.
- Where: a commit may be named in any record of a version published after its block, up to and
  including v. Only those records are read (they are cached by the source), so the row costs a
  few records and two searches over block timestamps per version.
"""

from __future__ import annotations

from krill.audit.source import DATA_ERRORS, AuditSource, data_fault

DECISION_SLACK_S = 600
MAX_LISTED = 8


def check_coverage(source: AuditSource, version: int) -> tuple[bool, str]:
    """The `coverage` row of published version `version`: (ok, detail)."""
    from krill.protocol.record import had_room

    parent = source.version_info(version - 1)
    if parent is None:
        return False, f"not checked: version {version - 1} is not published"
    try:
        if not had_room(source.record(version), source.spec.num_shards):
            return True, "the record is full: commits due here are judged at the next version whose record has room"
        first = version  # the earliest version whose due commits are judged here: those after full records
        while first > 1 and not had_room(source.record(first - 1), source.spec.num_shards):
            first -= 1
    except DATA_ERRORS as exc:
        return False, f"not checked: a record is unavailable ({data_fault(exc)})"
    window = int(source.run.params.challenge_window_blocks)
    wait = float(source.spec.version.deadline_s) + DECISION_SLACK_S
    hi = min(int(parent.published_block) - window - 1, _last_block_before(source, parent, wait))
    before = source.version_info(first - 2) if first >= 2 else None
    lo = 0 if before is None else min(int(before.published_block) - window,
                                      _last_block_before(source, before, wait) + 1)
    due = sorted(c for c, (block, _) in source.history.commits.items() if lo <= block <= hi)
    if not due:
        return True, f"no commit became due here (committed in blocks {max(lo, 0)}..{hi})"
    try:
        named = _named_since(source, min(source.history.commits[c][0] for c in due) - window, version)
    except DATA_ERRORS as exc:
        return False, f"not checked: a record is unavailable ({data_fault(exc)})"
    unnamed, shielded = [], []
    for c in due:
        if c in named:
            continue
        (shielded if _behind_own_junk(source, c, named, window) else unnamed).append(c)
    shown = f" ({len(shielded)} not judged: queued behind the same worker's content that never arrived)" \
        if shielded else ""
    if unnamed:
        listed = ", ".join(f"{c} by {source.history.commits[c][1]}" for c in unnamed[:MAX_LISTED])
        more = f" and {len(unnamed) - MAX_LISTED} more" if len(unnamed) > MAX_LISTED else ""
        return False, (f"{len(unnamed)} of {len(due)} commits due here are named in no record up to this version, "
                       f"though their challenge windows closed and {wait:g} s passed before version {version - 1} "
                       f"was published: commits {listed}{more}{shown}")
    return True, f"{len(due) - len(shielded)} commits due here, each named in a record{shown}"


def _last_block_before(source: AuditSource, info, wait: float) -> int:
    """The last block whose timestamp is at least `wait` seconds before the block `info` was published in
    (-1: none). Block timestamps never decrease, so a binary search over blocks 0..that block."""
    end = int(info.published_block)
    limit = source.block_time(end) - wait
    lo, hi = 0, end
    if source.block_time(0) > limit:
        return -1
    while lo < hi:  # invariant: block lo is early enough
        mid = (lo + hi + 1) // 2
        if source.block_time(mid) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _named_since(source: AuditSource, block: int, version: int) -> dict[int, str]:
    """Commit id -> "accepted" or its rejection's reason code, over the records of the versions published
    after `block`, up to `version`."""
    lo, hi = 1, version  # the first version published after `block` (publication blocks never decrease)
    while lo < hi:
        mid = (lo + hi) // 2
        info = source.version_info(mid)
        if info is not None and int(info.published_block) > block:
            hi = mid
        else:
            lo = mid + 1
    first = lo
    named: dict[int, str] = {}
    for v in range(first, version + 1):
        record = source.record(v)
        named.update({e.commit_id: e.reason_code for e in record.rejected})
        named.update({e.commit_id: "accepted" for e in record.accepted})
    return named


def _behind_own_junk(source: AuditSource, commit_id: int, named: dict[int, str], window: int) -> bool:
    block, worker = source.history.commits[commit_id]
    return any(w == worker and c < commit_id and b >= block - window and named.get(c) == "unavailable"
               for c, (b, w) in source.history.commits.items())
