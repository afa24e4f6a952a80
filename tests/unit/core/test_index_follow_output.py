"""What `krill index sync --follow` prints of its passes."""

from __future__ import annotations

import json

from krill.commands.index_cmd import following_printer
from krill.db.indexer import SyncReport


def _passes() -> list[SyncReport]:
    idle = [SyncReport(from_block=10, next_block=10, safe_head=9) for _ in range(5)]
    moved = SyncReport(from_block=10, next_block=12, safe_head=11, events=3, batches=1)
    fetched = SyncReport(from_block=12, next_block=12, safe_head=11, fetched={"header_available": 1})
    return [*idle, moved, fetched, *idle[:3]]


def test_follow_in_text_says_once_that_nothing_is_new_until_something_is():
    # Before: every poll (one a second by default) printed "no new confirmed block" again.
    lines: list[str] = []
    show = following_printer(False, lines.append)
    for report in _passes():
        show(report)
    assert lines == [
        "no new confirmed block (next block 10, confirmed head 9): 0 events in 0 batches; nothing fetched; "
        "quiet until there is something new",
        "blocks 10..11 (confirmed head 11): 3 events in 1 batches; nothing fetched",
        "no new confirmed block (next block 12, confirmed head 11): 0 events in 0 batches; header available 1",
        "no new confirmed block (next block 10, confirmed head 9): 0 events in 0 batches; nothing fetched; "
        "quiet until there is something new",
    ]


def test_follow_in_json_prints_every_pass():
    lines: list[str] = []
    show = following_printer(True, lines.append)
    for report in _passes():
        show(report)
    assert len(lines) == len(_passes())
    assert [json.loads(line)["events"] for line in lines] == [0, 0, 0, 0, 0, 3, 0, 0, 0, 0]
