"""The explorer app against a hand-filled index: pages, JSON API, pagination, headers, injection, read-only."""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import OperationalError

from krill.db.errors import DatabaseError
from krill.db.models import Commit, Participant
from krill.explorer.audit_status import AuditStatus
from krill.explorer.database import open_read_only
from krill.explorer.web import ExplorerApp


class Client:
    def __init__(self, app):
        self.app = app

    def get(self, path: str, method: str = "GET"):
        path, _, query = path.partition("?")
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query}
        seen = {}

        def start_response(status, headers):
            seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

        body = b"".join(self.app(environ, start_response))
        return seen["status"], seen["headers"], body.decode()

    def json(self, path: str):
        status, headers, body = self.get(path)
        assert headers["Content-Type"] == "application/json", (status, body[:300])
        return status, json.loads(body)


@pytest.fixture
def world(explorer_world):
    db = open_read_only(explorer_world.url)
    explorer_world.app = ExplorerApp(db, explorer_world.store, AuditStatus(explorer_world.audit), page_size=10,
                                     max_page_size=20)
    explorer_world.client = Client(explorer_world.app)
    explorer_world.db = db
    yield explorer_world
    db.close()


def test_overview_page_has_charts_and_totals(world):
    status, headers, body = world.client.get("/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert body.count("<svg") == 4 and "<polyline" in body and 'class="bar"' in body
    assert world.run in body and "Eval accuracy" in body and "Mean reward" in body
    status, data = world.client.json("/api/")
    assert status == 200
    totals = data["totals"]
    assert totals["contributions"] == {"accepted": 1, "rejected": 1, "pending": 0,
                                         "accepted_unpublished": 0}
    assert totals["slashes"] == 1 and totals["slashed_amount"] == str(250 * 10**18)
    assert totals["stake"]["worker"] == {"participants": 2, "staked": str(750 * 10**18), "unbonding": "0", "jailed": 1}
    assert totals["stake"]["verifier"]["staked"] == str(500 * 10**18)
    assert totals["rewards"] == {"reward": str(10 * 10**18), "bounty": str(50 * 10**18), "claim": str(5 * 10**18)}
    assert totals["tokens_per_s"] == pytest.approx(120 / 3.0)
    accuracy = {p["version"]: p["accuracy"] for p in data["series"]}
    assert accuracy == {0: 0.1, 1: None, 2: 0.3}
    assert [p["mean_reward"] for p in data["series"] if p["version"] == 2] == [None]  # NaN is null in JSON


def test_every_response_carries_security_headers(world):
    for path in ("/", "/api/", "/versions/1", "/nope", "/versions?page=x", "/static/style.css", "/api"):
        status, headers, _ = world.client.get(path)
        csp = headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, path
        assert "script-src" not in csp and "unsafe-inline" not in csp, path
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["Referrer-Policy"] == "no-referrer"
    status, headers, body = world.client.get("/", method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, _, body = world.client.get("/", method="HEAD")
    assert status == 200 and body == ""


def test_pages_have_no_script_and_escape_everything(world):
    for path in ("/", "/versions", "/versions/1", "/participants", f"/participants/{world.forger}", "/contributions",
                 "/contributions/2", f"/evidence/{world.evidence_digest}", "/api"):
        status, _, body = world.client.get(path)
        assert status == 200, (path, body[:500])
        assert "<script" not in body.lower() and " style=" not in body, path


def test_lists_are_paginated_with_caps(world):
    status, page1 = world.client.json("/api/contributions")
    assert status == 200 and page1["per_page"] == 10 and page1["total"] == world.commits
    assert page1["pages"] == 4 and len(page1["items"]) == 10
    _, page4 = world.client.json("/api/contributions?page=4")
    assert [c["commit_id"] for c in page4["items"]] == [2, 1]
    _, capped = world.client.json("/api/contributions?per_page=100000")
    assert capped["per_page"] == 20 and len(capped["items"]) == 20
    _, past = world.client.json("/api/contributions?page=99")
    assert past["items"] == [] and past["total"] == world.commits
    for bad in ("page=0", "page=-1", "per_page=abc", "page=1e3", "status=bogus"):
        status, err = world.client.json(f"/api/contributions?{bad}")
        assert status == 400 and err["status"] == 400, bad
    _, sub = world.client.json(f"/api/participants/{world.honest}/contributions?per_page=5&page=2")
    assert sub["total"] == 31 and len(sub["items"]) == 5 and sub["pages"] == 7
    _, rejected = world.client.json("/api/contributions?status=rejected")
    assert [c["commit_id"] for c in rejected["items"]] == [2] and rejected["items"][0]["reason_code"] == "wrong_rewards"
    _, unseen = world.client.json("/api/contributions?status=unseen&per_page=20")
    assert unseen["total"] == 30


def test_injection_attempts_are_harmless(world):
    def counts():
        with world.db.session() as s:
            return s.scalar(select(func.count()).select_from(Commit)), s.scalar(
                select(func.count()).select_from(Participant))

    before = counts()
    attacks = ["' OR 1=1 --", "1; DROP TABLE commits; --", "0x11' UNION SELECT * FROM participants --",
               "<script>alert(1)</script>", "\"><img src=x onerror=alert(1)>"]
    for attack in attacks:
        q = quote(attack)
        for path in (f"/api/contributions?worker={q}", f"/api/contributions?status={q}",
                     f"/api/versions?run={q}", f"/api/contributions?version={q}", f"/api/participants?role={q}"):
            status, err = world.client.json(path)
            assert status == 400 and "error" in err, path
        status, _, body = world.client.get(f"/contributions?worker={q}")
        assert status == 400 and "<script>alert" not in body and "<img src=x" not in body
        status, _, body = world.client.get(f"/participants/{world.honest}?run={q}")
        assert status == 200 and "<script>alert" not in body and "<img src=x" not in body
        status, headers, body = world.client.get(f"/search?q={q}")
        assert status == 400 and "<script>alert" not in body
    assert counts() == before


def test_search_leads_to_the_thing(world):
    for q, where in ((world.forger, f"/participants/{world.forger}"), ("2", "/contributions/2"), ("v1", "/versions/1"),
                     (world.evidence_digest, f"/evidence/{world.evidence_digest}")):
        status, headers, _ = world.client.get(f"/search?q={q}")
        assert status == 303 and headers["Location"] == where


def test_version_page_shows_record_shards_evals_and_audit(world):
    status, v1 = world.client.json("/api/versions/1")
    assert status == 200 and v1["audit"]["status"] == "passed" and v1["record_cid"] == world.record_cid
    assert [s["cid"] for s in v1["shards"]] == ["bafkreishard0", "bafkreishard1"]
    record = v1["record"]
    assert record["available"] and [s["trimmed_fractions"] for s in record["record"]["shards"]] == [["0.125"], ["0.375"]]
    assert [(c["commit_id"], c["status"], c["weight"]) for c in v1["contributions"]["items"]] == \
        [(1, "accepted", 0.25), (2, "rejected", None)]
    _, v2 = world.client.json("/api/versions/2")
    assert v2["audit"] == {"status": "failed", "failed_checks": ["manifest"], "checks": 1}
    assert not v2["record"]["available"] and "ContentNotFoundError" in v2["record"]["error"]
    _, v0 = world.client.json("/api/versions/0")
    assert v0["audit"]["status"] == "not audited" and v0["evals"][0]["accuracy"] == 0.1
    status, _, body = world.client.get("/versions/1")
    assert "0.375" in body and "audited" in body and "clip-mix-trim" in body
    status, _, body = world.client.get("/versions")
    assert status == 200 and "audit FAILED" in body
    assert world.client.json("/api/versions/7")[0] == 404


def test_slashed_worker_links_to_its_evidence(world):
    status, _, body = world.client.get(f"/participants/{world.forger}")
    assert status == 200 and "jailed" in body and "wrong_rewards" in body
    links = re.findall(r'class="evidence-link" href="([^"]+)"', body)
    assert links == [f"/evidence/{world.evidence_digest}"]
    status, _, evidence = world.client.get(links[0])
    assert status == 200 and "32 of 32 rewards differ" in evidence and "check-failed" in evidence
    _, data = world.client.json(f"/api{links[0]}")
    assert data["evidence"]["matches_chain"] is True and data["worker"] == world.forger
    assert data["evidence"]["cid"] == world.evidence_cid


def test_evidence_naming_another_commits_header_does_not_agree_with_the_chain(explorer_world):
    """Same commit id, verifier and outcome, but the document's header is not the committed one (a document
    copied from another commit or deployment): it used to read as agreeing with the chain."""
    from sqlalchemy import update

    from krill.db.models import Commit
    from krill.db.session import open_database

    with open_database(explorer_world.url) as db, db.write() as s:
        s.execute(update(Commit).where(Commit.commit_id == 2).values(header_digest="77" * 32))
    db = open_read_only(explorer_world.url)
    try:
        client = Client(ExplorerApp(db, explorer_world.store, AuditStatus(explorer_world.audit), page_size=10,
                                    max_page_size=20))
        _, data = client.json(f"/api/evidence/{explorer_world.evidence_digest}")
        assert data["evidence"]["available"] and data["evidence"]["matches_chain"] is False
    finally:
        db.close()


def test_participant_lists(world):
    _, forger = world.client.json(f"/api/participants/{world.forger}")
    assert forger["jailed"] and forger["contributions"]["rejected"] == 1
    assert forger["rejections"] == [{"reason_code": "wrong_rewards", "count": 1}]
    assert forger["lists"]["slashes"]["items"][0]["evidence"][0]["evidence_digest"] == world.evidence_digest
    _, verifier = world.client.json(f"/api/participants/{world.verifier}")
    assert verifier["role"] == "verifier" and verifier["lists"]["verdicts"]["total"] == 2
    assert verifier["claimable"] == str(45 * 10**18)
    _, rewards = world.client.json(f"/api/participants/{world.verifier}/rewards")
    assert [r["kind"] for r in rewards["items"]] == ["claim", "bounty"]
    _, workers = world.client.json("/api/participants?role=worker")
    assert {p["address"] for p in workers["items"]} == {world.honest, world.forger}
    assert world.client.json("/api/participants/0x" + "00" * 20)[0] == 404


def test_contribution_page(world):
    status, c = world.client.json("/api/contributions/2")
    assert status == 200 and c["status"] == "rejected" and c["slashed"] and c["slash"]["amount"] == str(250 * 10**18)
    assert [v["ok"] for v in c["verdicts"]] == [False]
    assert c["indexed_header"]["status"] == "available"
    assert not c["header"]["available"]  # the hand-filled header CIDs are not in the store
    status, _, body = world.client.get("/contributions/2")
    assert status == 200 and c["tx_hash"] in body and "FAIL" in body
    assert world.client.json("/api/contributions/999")[0] == 404


def test_without_a_store_details_say_why(world):
    app = ExplorerApp(world.db, None, AuditStatus(), page_size=10)
    status, data = Client(app).json("/api/versions/1")
    assert status == 200 and data["record"]["error"].startswith("no content store")
    assert data["audit"]["status"] == "not audited"
    status, _, body = Client(app).get(f"/evidence/{world.evidence_digest}")
    assert status == 200 and "Document unavailable" in body


def test_database_is_read_only(world):
    with pytest.raises(OperationalError, match="readonly|read-only|query_only"):
        with world.db.session() as s:
            s.execute(text("DELETE FROM commits"))
    with world.db.session() as s:
        assert s.scalar(select(func.count()).select_from(Commit)) == world.commits


def test_open_read_only_refuses_what_is_not_an_index(tmp_path):
    with pytest.raises(DatabaseError, match="no database at"):
        open_read_only(f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()
    (tmp_path / "a-folder.db").mkdir()
    with pytest.raises(DatabaseError, match=r"a-folder\.db is a folder, not a database file: point database\.url"):
        open_read_only(f"sqlite:///{tmp_path / 'a-folder.db'}")
    import sqlite3

    sqlite3.connect(tmp_path / "other.db").execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(DatabaseError, match="holds no Krill index"):
        open_read_only(f"sqlite:///{tmp_path / 'other.db'}")


def test_unknown_run_and_paths(world):
    assert world.client.json("/api/versions?run=" + "cd" * 32)[0] == 404
    status, headers, body = world.client.get("/nothing/here")
    assert status == 404 and "nothing at" in body
    status, headers, body = world.client.get("/versions?" + "a=b&" * 1500)
    assert status == 400


def test_runs_list(world):
    status, runs = world.client.json("/api/runs?per_page=5")
    assert status == 200 and runs["total"] == 1 and runs["items"][0]["run_id"] == world.run
    status, _, body = world.client.get("/runs")
    assert status == 200 and world.run in body


def test_an_evidence_document_of_the_wrong_shape_is_unavailable_not_an_error(world):
    from krill.explorer.store_view import evidence_view
    from krill.payload.canonical import canonical_json

    good = {"format": "krill-evidence/1", "ok": False, "reason": "rewards",
            "checks": [{"name": "rewards", "ok": False, "detail": "d", "ms": 3}]}
    bad = {"missing 'reason'": ({k: v for k, v in good.items() if k != "reason"}, "'reason' is missing"),
           "ok a string": ({**good, "ok": "no"}, "'ok' is a string, expected a boolean"),
           "check without detail": ({**good, "checks": [{"name": "x", "ok": True, "ms": 1}]},
                                    "checks[0].detail is missing"),
           "ms a boolean": ({**good, "checks": [{**good["checks"][0], "ms": True}]}, "checks[0].ms is a boolean"),
           "figures a list": ({**good, "checks": [{**good["checks"][0], "figures": [1]}]},
                              "checks[0].figures is a list"),
           "a figure an object": ({**good, "checks": [{**good["checks"][0], "figures": {"a": {}}}]},
                                  "checks[0].figures['a']")}
    import hashlib

    digest = hashlib.sha256(canonical_json(good)).hexdigest()
    world.store.put_block(canonical_json(good), pin=True)
    assert evidence_view(world.store, digest)["available"] is True  # figures and failed_field may be absent
    for name, (doc, why) in bad.items():
        data = canonical_json(doc)
        world.store.put_block(data, pin=True)
        view = evidence_view(world.store, hashlib.sha256(data).hexdigest())
        assert view["available"] is False and why in view["error"], (name, view["error"])


def test_a_page_that_fails_to_render_is_a_500_with_headers(world, monkeypatch):
    render = world.app._html

    def failing(status, template, *args, **kw):
        if template == "version.html":
            raise KeyError("a field the template needs")
        return render(status, template, *args, **kw)

    monkeypatch.setattr(world.app, "_html", failing)
    status, headers, body = world.client.get("/versions/1")
    assert status == 500 and "internal error" in body
    assert headers["X-Frame-Options"] == "DENY" and "default-src 'none'" in headers["Content-Security-Policy"]


def test_a_number_past_the_index_range_is_a_bad_request(world):
    status, data = world.client.json("/api/contributions?version=" + "9" * 20)
    assert status == 400 and "at most 9223372036854775807" in data["error"]
    assert world.client.json("/api/contributions?version=9223372036854775807")[0] == 200


def test_search_from_a_run_page_stays_in_that_run(world):
    # A search from /versions?run=R carries R (hidden field), so 'v1' is R's version 1, not the latest run's.
    status, _, body = world.client.get(f"/versions?run={world.run}")
    assert status == 200 and f'<input type="hidden" name="run" value="{world.run}">' in body
    assert 'name="run"' not in world.client.get("/versions")[2]
    for q, where in (("v1", "/versions/1"), ("2", "/contributions/2"), (world.forger, f"/participants/{world.forger}"),
                     (world.evidence_digest, f"/evidence/{world.evidence_digest}")):
        status, headers, _ = world.client.get(f"/search?q={q}&run={world.run.upper()}")
        assert status == 303 and headers["Location"] == f"{where}?run={world.run}"
    assert world.client.get(headers["Location"])[0] == 200
    status, _, body = world.client.get("/search?q=v1&run=" + quote("<b>x</b>"))
    assert status == 400 and "parameter &#39;run&#39;" in body and "<b>x" not in body


def test_more_links_keep_the_page_size(world):
    """The participant page shows `per_page` rows of each list; its "more" link must go on from there
    (it went to page 2 at the default size, so rows per_page + 1 .. default never appeared)."""
    _, _, body = world.client.get(f"/participants/{world.verifier}?per_page=1")
    more = re.search(r'href="([^"]*/verdicts[^"]*)">more verdicts', body)
    assert more is not None and "page=2" in more.group(1) and "per_page=1" in more.group(1), body[-2000:]


@pytest.mark.parametrize("path", [
    "/api/contributions?worker={honest}%0a",
    "/search?q=v1&run={run}%0a",
    "/api/participants/{honest}%0a",
])
def test_a_trailing_newline_is_a_bad_request_not_a_match(world, path):
    """`$` matches before a final newline: the value kept it, answered with no rows, or went into a
    Location header (a bare LF on the wire)."""
    from urllib.parse import unquote

    target = path.format(honest=world.honest, run=world.run)
    head, _, query = target.partition("?")
    status, headers, _ = world.client.get(unquote(head) + ("?" + query if query else ""))
    assert status in (400, 404) and "Location" not in headers, (status, headers)


def test_version_zero_is_the_base_model_with_nothing_to_settle(world):
    _, _, body = world.client.get("/versions/0")
    assert "base model: nothing to settle" in body and "block None" not in body


def test_a_coordinator_that_never_staked_is_shown_without_a_dead_link(world):
    _, data = world.client.json("/api/")
    coordinator = data["run"]["coordinator"]
    _, _, body = world.client.get("/")
    assert data["run"]["coordinator_indexed"] is False  # the hand-filled index's coordinator never staked
    assert "(not staked: no participant page)" in body and f'href="/participants/{coordinator}"' not in body
    assert world.client.get(f"/participants/{coordinator}")[0] == 404
    _, _, honest = world.client.get(f"/participants/{world.honest}")
    assert "not staked" not in honest


def test_trust_is_the_coordinators_weighing_not_every_verdict(world):
    """Five verifiers staked after commit 1 attest it as passing: the coordinator counts none of them
    (krill.coordinator.standing), so the worker's trust stays the 0.25 its contribution was weighed at;
    a weighing journalled for a version not published yet is not shown either."""
    from krill.chain import events as ev
    from krill.db.ingest import DEFAULT_TRUST_PRIOR, apply_event, known_events
    from krill.db.models import Contribution, ContributionStatus
    from krill.db.session import open_database

    protocol = "0x" + "44" * 20
    events = []
    for i in range(5):
        sybil, tx = "0x" + f"{0xa0 + i:02x}" * 20, "0x" + f"{0xf00 + i:064x}"
        events.append(ev.Staked(500, tx, 0, protocol, sybil, 2, 10, 10, bytes([i + 1]) * 32))
        events.append(ev.Attested(501, tx, 1, protocol, 1, sybil, True, b"\x01" * 32, 2 + i, 0))
    with open_database(world.url) as db, db.write() as s:
        known = known_events(s, events)
        for event in events:
            apply_event(s, event, 0, DEFAULT_TRUST_PRIOR, known)
        s.add(Contribution(commit_id=3, run_id=world.run, worker=world.honest, version=2,
                           status=ContributionStatus.ACCEPTED, weight=0.9, staleness=0, trust=0.9,
                           aggregated_version=3))  # journalled, v3 not published
    _, honest = world.client.json(f"/api/participants/{world.honest}")
    assert honest["checks_passed"] == 1 + 5  # every verdict is still listed as attested
    assert honest["trust"] == 0.25
    assert honest["trust_weighed"] == {"run_id": world.run, "version": 1, "commit_id": 1}
    _, workers = world.client.json("/api/participants?role=worker")
    assert {p["address"]: p["trust"] for p in workers["items"]} == {world.honest: 0.25, world.forger: None}
    _, _, body = world.client.get(f"/participants/{world.honest}")
    trust_cell = re.search(r'<td id="trust">(.*?)</td>', body).group(1)
    assert trust_cell.startswith("0.25 ") and f"/versions/1?run={world.run}" in trust_cell
    _, _, forger = world.client.get(f"/participants/{world.forger}")
    assert "not weighed in a published version yet" in forger


def test_a_contribution_links_the_versions_of_its_own_run_and_only_published_records(world):
    """A commit's version links name its run (the default run is the newest, here another one), and a
    contribution the coordinator journalled for a version it has not published yet is not shown as in
    that version's record (whose page is a 404)."""
    from krill.db.models import Contribution, ContributionStatus, Run
    from krill.db.session import open_database

    with open_database(world.url) as db, db.write() as s:
        first = s.get(Run, world.run)
        s.add(Run(**{c.name: getattr(first, c.name) for c in Run.__table__.columns}
                  | {"run_id": "cd" * 32, "created_block": 50, "latest_version": 0}))
        s.add(Contribution(commit_id=3, run_id=world.run, worker=world.honest, version=2,
                           status=ContributionStatus.ACCEPTED, weight=0.25, staleness=0, trust=0.25,
                           aggregated_version=3))  # journalled, v3 not published (the run's latest is 2)
    assert world.client.json("/api/")[1]["run"]["run_id"] == "cd" * 32
    _, _, body = world.client.get("/contributions/1")
    assert f'href="/versions/0?run={world.run}"' in body  # learner version
    assert f'in the record of <a href="/versions/1?run={world.run}">v1</a>' in body
    _, c = world.client.json("/api/contributions/3")
    assert c["aggregated_version"] == 3 and c["record_published"] is False
    assert world.client.json("/api/contributions/1")[1]["record_published"] is True
    _, _, body = world.client.get("/contributions/3")
    assert "decided for v3, not published yet" in body and "/versions/3" not in body
    _, _, honest = world.client.get(f"/participants/{world.honest}")
    assert f'href="/versions/2?run={world.run}"' in honest and 'href="/versions/2"' not in honest


def test_accepted_counts_only_contributions_in_a_published_record(world):
    """Rows the coordinator accepted at validation but has not folded into a published version (waiting
    for one, or journalled for v3, not published) are counted apart, as `krill demo`'s summary does."""
    from krill.db.models import Contribution, ContributionStatus
    from krill.db.session import open_database

    with open_database(world.url) as db, db.write() as s:
        for commit_id, folded in ((3, 3), (4, None)):
            s.add(Contribution(commit_id=commit_id, run_id=world.run, worker=world.honest, version=2,
                               status=ContributionStatus.ACCEPTED, aggregated_version=folded))
    expected = {"accepted": 1, "rejected": 1, "pending": 0, "accepted_unpublished": 2}
    assert world.client.json("/api/")[1]["totals"]["contributions"] == expected
    _, honest = world.client.json(f"/api/participants/{world.honest}")
    assert honest["contributions"] == {"accepted": 1, "rejected": 0, "pending": 0, "accepted_unpublished": 2}
    _, workers = world.client.json("/api/participants?role=worker")
    assert {p["address"]: p["contributions"]["accepted"] for p in workers["items"]} == {world.honest: 1,
                                                                                        world.forger: 0}
    _, _, body = world.client.get("/")
    assert "+ 2 accepted, not in a published version yet" in body
