"""The per-version cap (`worker.max_per_version`) counts a resumed commit that landed: a restart must not
give the worker a fresh share of the version it already committed at."""

from __future__ import annotations

import time
from types import SimpleNamespace

from krill.worker.contribute import COMMITTED, Outcome
from krill.worker.pipeline import SubmitPipeline
from krill.worker.runner import _contribute_loop, _Tally


class _Waited(Exception):
    """The loop waited for a newer version: the worker has its share of this one."""


class _Contributor:
    """Every contribution is made and committed at version 5; waiting for a newer one ends the loop."""

    watcher = None

    def __init__(self):
        self.nonce, self.committed = 1, []

    def newest(self, reuse_s=0.0):
        return 5

    def wait_newer(self, than, timeout_s):
        raise _Waited

    def make(self, latest, started, learn_after, poll_s, interrupt):
        self.nonce += 1
        return SimpleNamespace(nonce=self.nonce - 1, model_version=latest, behaviour_version=latest, seconds={},
                               started=time.perf_counter())

    def package(self, made):
        return (made, b"", {}, {}, made.started)

    def save(self, packaged):
        pass

    def submit(self, made, header, files, seconds, started, resumed):
        self.committed.append(made.model_version)
        return Outcome(COMMITTED, made.nonce, 5, made.model_version, commit_id=10 + len(self.committed))


def test_a_resumed_commit_that_landed_counts_toward_the_per_version_cap():
    contributor = _Contributor()
    tally = _Tally(lambda line: None, None)
    tally.report(Outcome(COMMITTED, 0, 5, 5, commit_id=10, resumed=True))  # the restart's resumed commit
    config = SimpleNamespace(worker=SimpleNamespace(max_per_version=2, sample_ahead=False, poll_interval_s=0.01))
    try:
        _contribute_loop(SimpleNamespace(contributor=contributor), config, SubmitPipeline(contributor), tally, None,
                         lambda: None)
    except _Waited:
        pass
    assert contributor.committed == [5] and tally.per_version == {5: 2}
