"""Worker-local pieces: the persisted nonce/pending state, the back-off, the strategies, status lines."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from krill.errors import ChainUnavailableError, ConfigError, StoreUnavailableError
from krill.worker.backoff import Backoff
from krill.worker.behaviors import get_behavior
from krill.worker.contribute import Outcome
from krill.worker.errors import WorkerStateError
from krill.worker.nonce_state import Pending, WorkerState

RUN = hashlib.sha256(b"run").digest()
WORKER = "0x" + "ab" * 20


def _pending(nonce: int, header: bytes) -> Pending:
    return Pending(model_version=3, behaviour_version=2, nonce=nonce, digest=hashlib.sha256(header).hexdigest(),
                   files=["grad-0.safetensors", "rollouts.safetensors"], summary={"tokens": 7})


def test_a_nonce_becomes_durable_with_the_contribution_saved_under_it(tmp_path):
    state = WorkerState.open(tmp_path, RUN, WORKER)
    assert not state.existed and [state.reserve_nonce() for _ in range(3)] == [0, 1, 2]
    # Nothing was saved under 0..2 (a crash mid-sampling): handing them out again is safe.
    assert WorkerState.open(tmp_path, RUN, WORKER).next_nonce == 0
    header = b'{"header":2}'
    state.save_pending(_pending(2, header), header, {"rollouts.safetensors": b"r", "grad-0.safetensors": b"g"})
    reopened = WorkerState.open(tmp_path, RUN, WORKER.upper().replace("0X", "0x"))
    assert reopened.existed and reopened.reserve_nonce() == 3  # never 2 again: it is on its way
    assert reopened.reserve_nonce() == 4  # handed out in memory, never saved
    reopened.drop(3, {"nonce": 3, "status": "rollouts-stale"})  # logged work persists its nonce as used
    assert WorkerState.open(tmp_path, RUN, WORKER).next_nonce == 4
    reopened.advance_to(2)
    assert (reopened.next_nonce, reopened.durable_next_nonce) == (5, 4)
    reopened.advance_to(10)
    assert WorkerState.open(tmp_path, RUN, WORKER).next_nonce == 10


def test_saving_a_contribution_persists_its_own_nonce_not_those_handed_out_after_it(tmp_path):
    # The pipelined worker saves contribution n in the background after it handed out n + 1.
    state = WorkerState.open(tmp_path, RUN, WORKER)
    first, second = state.reserve_nonce(), state.reserve_nonce()
    header = b'{"header":0}'
    state.save_pending(_pending(first, header), header, {"rollouts.safetensors": b"r", "grad-0.safetensors": b"g"})
    assert (state.next_nonce, state.durable_next_nonce) == (second + 1, first + 1)
    assert WorkerState.open(tmp_path, RUN, WORKER).reserve_nonce() == second  # a restart reuses the unsaved one


def test_pending_contribution_survives_a_reopen_and_is_cleared_after_logging(tmp_path):
    state = WorkerState.open(tmp_path, RUN, WORKER)
    header = b'{"header":1}'
    files = {"rollouts.safetensors": b"r" * 10, "grad-0.safetensors": b"g" * 5}
    pending = _pending(state.reserve_nonce(), header)
    state.save_pending(pending, header, files)
    with pytest.raises(WorkerStateError):
        state.save_pending(pending, header, files)
    again = WorkerState.open(tmp_path, RUN, WORKER)  # as after kill -9
    assert again.pending == pending and again.pending_payload() == (header, files)
    again.finish({"nonce": 0, "status": "committed"})
    assert again.pending is None and WorkerState.open(tmp_path, RUN, WORKER).pending is None
    assert not list((again.directory / "pending").iterdir())
    with open(again.log_path, "a") as fh:
        fh.write('{"nonce": 1, "sta')  # torn by a crash mid-append
    assert again.history() == [{"nonce": 0, "status": "committed"}]


def test_pending_bytes_are_checked_against_the_digest(tmp_path):
    state = WorkerState.open(tmp_path, RUN, WORKER)
    header = b"header bytes"
    with pytest.raises(WorkerStateError, match="does not describe"):
        state.save_pending(_pending(0, b"other"), header, {"rollouts.safetensors": b"", "grad-0.safetensors": b""})
    state.save_pending(_pending(0, header), header, {"rollouts.safetensors": b"", "grad-0.safetensors": b""})
    bundle = state.directory / "pending" / f"{state.pending.digest}.bundle"
    saved = bundle.read_bytes()
    bundle.write_bytes(saved.replace(header, b"HEADER BYTES"))
    with pytest.raises(WorkerStateError, match="does not hash"):
        state.pending_payload()
    bundle.write_bytes(saved[:len(saved) - len(header) - 1])
    with pytest.raises(WorkerStateError, match="damaged"):
        state.pending_payload()


def test_a_pending_contribution_saved_as_a_folder_by_an_earlier_version_is_still_read(tmp_path):
    state = WorkerState.open(tmp_path, RUN, WORKER)
    header = b'{"header":3}'
    files = {"rollouts.safetensors": b"r" * 3, "grad-0.safetensors": b"g" * 4}
    state.save_pending(_pending(0, header), header, files)
    digest = state.pending.digest
    (state.directory / "pending" / f"{digest}.bundle").unlink()
    folder = state.directory / "pending" / digest
    folder.mkdir()
    for name, data in [("header.json", header), *files.items()]:
        (folder / name).write_bytes(data)
    again = WorkerState.open(tmp_path, RUN, WORKER)
    assert again.pending_payload() == (header, files)
    again.finish({"nonce": 0, "status": "committed"})
    assert not folder.exists()


def test_state_of_another_run_or_a_damaged_file_is_refused(tmp_path):
    WorkerState.open(tmp_path, RUN, WORKER).reserve_nonce()
    with pytest.raises(WorkerStateError, match="belongs to"):
        WorkerState.open(tmp_path, RUN, "0x" + "cd" * 20)
    path = tmp_path / "runs" / RUN.hex() / "state.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(doc | {"next_nonce": -1}))
    with pytest.raises(WorkerStateError, match="damaged"):
        WorkerState.open(tmp_path, RUN, WORKER)


def test_backoff_doubles_up_to_the_cap_and_only_retries_unreachability():
    waits, lines = [], []
    failures = [ChainUnavailableError("node down")] * 4 + [StoreUnavailableError("store down")]

    def flaky():
        if failures:
            raise failures.pop(0)
        return "ok"

    backoff = Backoff(0.5, 3.0, lines.append, sleep=waits.append)
    assert backoff.call(flaky, "chain") == "ok"
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0] and backoff.waits == 5
    assert lines[0] == "chain: unreachable (node down); retrying in 0.5s"

    def answer():
        raise ValueError("a revert is an answer")

    with pytest.raises(ValueError):
        backoff.call(answer, "chain")
    assert backoff.waits == 5


def test_forge_rewards_reports_the_opposite_of_every_outcome():
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0])
    assert torch.equal(get_behavior("honest").reported_rewards(rewards), rewards)
    assert torch.equal(get_behavior("forge-rewards").reported_rewards(rewards), torch.tensor([1.0, 0.0, 0.0, 1.0]))
    with pytest.raises(ConfigError, match="worker.behavior"):
        get_behavior("napping")


def test_status_line_names_every_figure():
    outcome = Outcome("committed", 4, 1, 2, commit_id=17, mean_reward=0.25, true_mean_reward=0.75, tokens=1200,
                      bytes_uploaded=4096, seconds={"sample": 0.5, "learn": 0.25, "total": 1.0})
    line = outcome.line()
    for part in ("nonce 4", "b1->v2", "reward 0.250 (true 0.750)", "1200 tok", "2,400 tok/s", "up 4.0 KiB",
                 "commit #17", "sample 0.50 learn 0.25 total 1.00s"):
        assert part in line, (part, line)


class _Killed(BaseException):
    """The process stopped (Ctrl-C, kill) while the nonce recovery waited out an RPC outage."""


def test_nonce_recovery_stopped_midway_runs_again_at_the_next_start(tmp_path):
    from types import SimpleNamespace

    from krill.worker.runner import recover_nonces

    def committed(*nonces):
        return lambda from_block, kinds: [SimpleNamespace(run_id=RUN, worker=WORKER, nonce=n) for n in nonces]

    def killed(from_block, kinds):
        raise _Killed()

    backoff = Backoff(0.01, 0.02, lambda line: None, sleep=lambda s: None)
    first = WorkerState.open(tmp_path, RUN, WORKER)  # writes state.json before anything is recovered
    assert not first.recovered
    with pytest.raises(_Killed):
        recover_nonces(first, SimpleNamespace(events=killed), RUN, WORKER, 0, backoff)
    again = WorkerState.open(tmp_path, RUN, WORKER)
    assert again.existed and not again.recovered  # the state on disk is no proof of a recovery
    recover_nonces(again, SimpleNamespace(events=committed(0, 4, 2)), RUN, WORKER, 0, backoff)
    assert again.recovered and again.reserve_nonce() == 5
    third = WorkerState.open(tmp_path, RUN, WORKER)
    assert third.recovered and third.next_nonce == 5
    recover_nonces(third, SimpleNamespace(events=killed), RUN, WORKER, 0, backoff)  # not scanned again


def test_a_state_file_written_before_the_recovered_flag_recovers_again_and_only_moves_forward(tmp_path):
    state = WorkerState.open(tmp_path, RUN, WORKER)
    path = state.directory / "state.json"
    doc = json.loads(path.read_text())
    del doc["recovered"]
    path.write_text(json.dumps(doc | {"next_nonce": 10}))  # as an earlier version wrote it
    old = WorkerState.open(tmp_path, RUN, WORKER)
    assert old.existed and not old.recovered and old.next_nonce == 10
    old.recovered_to(3)  # the chain knows fewer commits than the local state: never moves back
    reopened = WorkerState.open(tmp_path, RUN, WORKER)
    assert reopened.recovered and reopened.next_nonce == 10


def test_status_counts_each_nonce_once_when_a_crash_repeated_its_outcome_line(tmp_path, monkeypatch):
    import krill.runtime
    from krill.worker.status import _local

    run, worker = hashlib.sha256(b"run").digest(), "0x" + "aa" * 20
    monkeypatch.setattr(krill.runtime, "role_state_dir", lambda config, role, address: tmp_path)
    state = WorkerState.open(tmp_path, run, worker)
    # Each line written, then the process killed before the state write: the restart logs it again, resumed.
    for nonce, status, resumed in [(0, "committed", False), (0, "committed", True), (1, "stale", False),
                                   (1, "stale", True), (2, "front-run", False), (3, "committed", False)]:
        state.log({"nonce": nonce, "status": status, "resumed": resumed, "detail": f"n{nonce}"})
    local = _local(None, worker, run)
    assert local["committed"] == 2 and local["dropped"] == {"front-run": 1, "stale": 1}
    assert [d["nonce"] for d in local["recent_dropped"]] == [1, 2]


def test_an_outcome_logged_after_a_line_torn_by_a_crash_starts_a_line_of_its_own(tmp_path):
    """A crash mid-append leaves half a line and no newline: the outcome the restart logs again (and every one
    after it) is read back, and only the torn fragment is skipped."""
    state = WorkerState.open(tmp_path, RUN, WORKER)
    state.log({"nonce": 0, "status": "committed"})
    line = json.dumps({"nonce": 1, "status": "committed"})
    with open(state.log_path, "a", encoding="utf-8") as fh:
        fh.write(line[:len(line) // 2])
    restarted = WorkerState.open(tmp_path, RUN, WORKER)
    restarted.log({"nonce": 1, "status": "committed", "resumed": True})
    restarted.log({"nonce": 2, "status": "committed"})
    assert [(h["nonce"], h.get("resumed", False)) for h in restarted.history()] == [(0, False), (1, True), (2, False)]
    assert restarted.log_path.read_text(encoding="utf-8").count("\n") == 4  # one newline added, none doubled


def _disk_full_for(monkeypatch, name: str) -> None:
    """Writes to files whose name contains `name` fail as on a full disk (the rest of the module's I/O is real)."""
    import builtins
    import errno
    import io

    import krill.worker.nonce_state as nonce_state

    class Full(io.FileIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def fake_open(path, mode="r", *args, **kwargs):
        if name in str(path) and any(c in mode for c in "wa"):
            return Full(path, mode.replace("b", ""))
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(nonce_state, "open", fake_open, raising=False)


def test_a_full_disk_is_one_error_naming_the_file_and_leaves_the_state_as_it_was(tmp_path, monkeypatch):
    """ENOSPC while saving a contribution's state or logging an outcome: a WorkerStateError naming the file
    (it was a bare OSError naming none), no temporary file or orphan bundle left, and the same contribution
    saves under the same nonce once there is room again."""
    state = WorkerState.open(tmp_path, RUN, WORKER)
    header, files = b'{"header":0}', {"rollouts.safetensors": b"r", "grad-0.safetensors": b"g"}
    pending = _pending(state.reserve_nonce(), header)
    _disk_full_for(monkeypatch, "state.json")
    with pytest.raises(WorkerStateError, match=r"cannot write .*state\.json: No space left on device"):
        state.save_pending(pending, header, files)
    assert state.pending is None and state.durable_next_nonce == 0
    assert sorted(p.name for p in state.directory.rglob("*") if p.is_file()) == ["state.json"]
    assert WorkerState.open(tmp_path, RUN, WORKER).pending is None
    monkeypatch.undo()
    state.save_pending(pending, header, files)
    assert WorkerState.open(tmp_path, RUN, WORKER).pending_payload() == (header, files)

    _disk_full_for(monkeypatch, "contributions.jsonl")
    with pytest.raises(WorkerStateError, match=r"cannot write .*contributions\.jsonl: No space left on device"):
        state.finish({"nonce": 0, "status": "committed"})
    monkeypatch.undo()
    assert WorkerState.open(tmp_path, RUN, WORKER).pending == pending  # resumed on restart, never lost
    state.finish({"nonce": 0, "status": "committed"})
    assert state.history() == [{"nonce": 0, "status": "committed"}] and state.pending is None


def test_a_write_whose_temporary_file_cannot_be_removed_either_is_still_one_error_naming_the_file(tmp_path):
    """A file system that refuses the write may refuse the cleanup's unlink too: remounted read-only (as the
    kernel does after disk errors), even the unlink of a temporary file never made fails (EROFS), and that
    OSError escaped bare, naming the temporary file, in place of the WorkerStateError. Here the run's folder
    turned into a file under the worker, which refuses the unlink the same way (ENOTDIR), with no mount."""
    import shutil

    state = WorkerState.open(tmp_path, RUN, WORKER)
    shutil.rmtree(state.directory)
    state.directory.write_bytes(b"")
    with pytest.raises(WorkerStateError, match=r"cannot write .*state\.json: Not a directory"):
        state.advance_to(5)
