"""The background submission: one in flight, saved before it is submitted, its outcome or its exception
handed to the caller's thread, and the contribution's phases recorded across the two threads."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from krill.phases import current, phase, recording
from krill.worker.errors import JailedError
from krill.worker.pipeline import SubmitPipeline


class _Submitter:
    """Records what `submit` was given; blocks until released; fails when told to."""

    def __init__(self, fail: BaseException | None = None):
        self.release, self.fail, self.calls, self.saved = threading.Event(), fail, [], []

    def package(self, made):
        with phase("hash_sign"):
            pending = SimpleNamespace(nonce=made.nonce, model_version=made.model_version)
        return pending, b"h", {"f": b"x"}, made.seconds, made.started

    def save(self, packaged) -> None:
        with phase("save"):
            self.saved.append(packaged[0].nonce)

    def submit(self, pending, header, files, seconds, started, resumed):
        assert self.saved[-1] == pending.nonce  # saved before anything is submitted
        self.release.wait(10)
        with phase("chain_confirm"):
            pass
        if self.fail is not None:
            raise self.fail
        self.calls.append((pending.nonce, header, files, resumed))
        return SimpleNamespace(nonce=pending.nonce, seconds=seconds, phases=current())


def _made(nonce: int):
    return SimpleNamespace(nonce=nonce, model_version=7, seconds={"sample": 0.1}, started=time.perf_counter())


def test_one_submission_in_flight_and_its_outcome_carries_both_threads_phases():
    sub = _Submitter()
    pipe = SubmitPipeline(sub)
    assert pipe.wait() is None and not pipe.in_flight
    with recording() as phases:
        with phase("rollout"):
            pass
        pipe.start(_made(3), phases)
    assert pipe.in_flight and pipe.model_version == 7 and not pipe.done()
    with pytest.raises(RuntimeError, match="already in flight"):
        pipe.start(_made(4), {})
    sub.release.set()
    outcome = pipe.wait()
    assert outcome.nonce == 3 and sub.calls == [(3, b"h", {"f": b"x"}, False)] and sub.saved == [3]
    assert {"rollout", "hash_sign", "save", "chain_confirm"} <= set(outcome.phases)  # packaged in the background
    assert 0 <= outcome.seconds["foreground"] and outcome.seconds["sample"] == 0.1
    assert not pipe.in_flight and pipe.model_version is None


def test_a_submissions_exception_is_raised_by_wait_in_the_callers_thread():
    sub = _Submitter(JailedError("worker 0xab is jailed"))
    sub.release.set()
    pipe = SubmitPipeline(sub)
    pipe.start(_made(0), {})
    deadline = time.monotonic() + 10
    while not pipe.failed() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pipe.failed()  # the main loop can see it without waiting
    with pytest.raises(JailedError, match="is jailed"):
        pipe.wait()
    assert not pipe.in_flight and not pipe.failed()
    sub.fail = None
    pipe.start(_made(1), {})  # the pipeline is usable again
    assert pipe.wait().nonce == 1 and not pipe.failed()


def test_the_stake_check_runs_first_in_the_background_and_stops_the_commit():
    sub = _Submitter()
    sub.release.set()
    pipe = SubmitPipeline(sub)

    def jailed() -> None:
        raise JailedError("worker 0xab is jailed")

    with recording() as phases:
        pipe.start(_made(5), phases, before=jailed)
    with pytest.raises(JailedError):
        pipe.wait()
    assert sub.calls == [] and sub.saved == []  # nothing saved or committed after the check failed
    checked = []
    pipe.start(_made(6), {}, before=lambda: checked.append(threading.current_thread().name))
    outcome = pipe.wait()
    assert outcome.nonce == 6 and checked == ["submit-nonce-6"] and "stake_check" in outcome.phases
