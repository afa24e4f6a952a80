"""The explorer's queries on both database backends (SQLite and a private PostgreSQL server).

Uint columns are decimal text on SQLite and NUMERIC on PostgreSQL, enums are strings, and the
read-only guard is a different statement on each: the same requests must give the same answers.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from krill.explorer.audit_status import AuditStatus
from krill.explorer.database import open_read_only
from krill.explorer.web import ExplorerApp
from krill.testing.index_world import fill_index_world


def _get(app, path: str):
    path, _, query = path.partition("?")
    status, _headers, body = app.respond("GET", path, query)
    return status, json.loads(body)


def test_same_answers_on_both_backends_and_no_writes(db_url, tmp_path):
    world = fill_index_world(db_url, tmp_path)
    db = open_read_only(db_url)
    try:
        app = ExplorerApp(db, world.store, AuditStatus(world.audit), page_size=10, max_page_size=20)
        status, overview = _get(app, "/api/")
        assert status == 200
        assert overview["totals"]["stake"]["worker"]["staked"] == str(750 * 10**18)
        assert overview["totals"]["contributions"] == {"accepted": 1, "rejected": 1, "pending": 0,
                                             "accepted_unpublished": 0}
        _, page = _get(app, "/api/contributions?page=4")
        assert page["total"] == world.commits and [c["commit_id"] for c in page["items"]] == [2, 1]
        _, rejected = _get(app, "/api/contributions?status=rejected")
        assert [c["reason_code"] for c in rejected["items"]] == ["wrong_rewards"]
        _, forger = _get(app, f"/api/participants/{world.forger}")
        assert forger["slashed_total"] == str(250 * 10**18)
        assert forger["lists"]["slashes"]["items"][0]["evidence"][0]["evidence_digest"] == world.evidence_digest
        _, version = _get(app, "/api/versions/1")
        assert version["record"]["available"] and version["audit"]["status"] == "passed"
        with pytest.raises(DBAPIError):
            with db.session() as s:
                s.execute(text("DELETE FROM slashes"))
        workers = _get(app, "/api/participants?role=worker")[1]
        assert workers["total"] == 2
        assert {w["address"]: (w["trust"], w["contributions"]["accepted"]) for w in workers["items"]} == {
            world.honest: (0.25, 1), world.forger: (None, 0)}
        assert _get(app, "/api/contributions/1")[1]["record_published"] is True
    finally:
        db.close()
