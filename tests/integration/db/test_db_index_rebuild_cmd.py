"""`krill index rebuild` repairs an index of another schema version, on both backends.

The index's `SchemaVersionError` says "run `krill index rebuild`"; that command used to open the
database the same way first (create and check), so it failed with the same error and the advice was
a dead end. Role tables (state, the coordinator's journal) must survive the rebuild.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from db_scenario import play
from sqlalchemy import select, update

from krill.chain.rpc import connect_in_process
from krill.cli import cli
from krill.db.errors import SchemaVersionError
from krill.db.models import Commit, RoleCursor, SchemaVersion
from krill.db.session import SCHEMA_VERSIONS, open_database
from krill.store.local import LocalStore


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    root = tmp_path_factory.mktemp("rebuild-scenario")
    return play(connect_in_process(accounts=10), LocalStore(root / "store"))


def _rebuild(sc, db_url, tmp_path, monkeypatch):
    import krill.runtime

    monkeypatch.setattr(krill.runtime, "connect_chain", lambda config: sc.chain())
    return CliRunner().invoke(cli, ["--set", f"database.url={db_url}", "--set",
                                    f"chain.deploy_block={sc.deployment.block_number}",
                                    "index", "rebuild", "--no-store", "--json"],
                              env={"KRILL_HOME": str(tmp_path / "home"), "KRILL_CONFIG": None})


def test_rebuild_repairs_an_index_of_another_schema_version_and_keeps_role_tables(played, db_url, tmp_path,
                                                                                   monkeypatch):
    from krill.coordinator.journal import DecisionState, VersionDecision, ensure_tables

    with open_database(db_url) as db:
        ensure_tables(db)
        with db.write() as s:
            s.add(RoleCursor(name="verifier", position=3))
            s.add(VersionDecision(run_id="ab" * 32, version=1, state=DecisionState.DECIDED, closed_by="count",
                                  accepted=[], rejected=[], decided_at=1.0, window_s=2.0))
            s.execute(update(SchemaVersion).where(SchemaVersion.component == "index").values(version=99))
    with pytest.raises(SchemaVersionError, match="krill index rebuild"):
        open_database(db_url)

    result = _rebuild(played, db_url, tmp_path, monkeypatch)
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.output)["events"] > 30

    with open_database(db_url) as db, db.session() as s:  # opens again: the version is this Krill's
        assert s.get(SchemaVersion, "index").version == SCHEMA_VERSIONS["index"]
        assert s.scalar(select(Commit).limit(1)) is not None
        assert s.get(RoleCursor, "verifier").position == 3
        assert s.get(VersionDecision, ("ab" * 32, 1)).closed_by == "count"


def test_rebuild_still_refuses_role_state_of_another_version_without_dropping_the_index(played, db_url, tmp_path,
                                                                                         monkeypatch):
    with open_database(db_url) as db, db.write() as s:
        s.add(RoleCursor(name="verifier", position=3))
        s.execute(update(SchemaVersion).where(SchemaVersion.component == "state").values(version=0))
        s.execute(update(SchemaVersion).where(SchemaVersion.component == "index").values(version=99))
    result = _rebuild(played, db_url, tmp_path, monkeypatch)
    assert result.exit_code == 1 and "use a new database" in result.output, result.output
    with open_database(db_url, create=False) as db, db.session() as s:
        assert {r.component: r.version for r in s.scalars(select(SchemaVersion))} == {"index": 99, "state": 0}
        assert s.get(RoleCursor, "verifier").position == 3


def test_rebuild_of_a_new_database_creates_every_table(played, db_url, tmp_path, monkeypatch):
    result = _rebuild(played, db_url, tmp_path, monkeypatch)
    assert result.exit_code == 0, (result.output, result.exception)
    with open_database(db_url) as db, db.session() as s:
        assert s.scalar(select(Commit).limit(1)) is not None
