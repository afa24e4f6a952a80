"""`graceful_signals`: the first SIGTERM/SIGINT asks the coordinator's loop to stop, a second interrupts."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from krill.coordinator.cli import graceful_signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_first_signal_sets_stop_a_second_interrupts_and_the_handlers_come_back(signum):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stop = threading.Event()
    with pytest.raises(KeyboardInterrupt), graceful_signals(stop) as received:
        os.kill(os.getpid(), signum)
        assert stop.wait(5.0) and received == [signal.Signals(signum).name]
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between two bytecodes of this thread
            pass
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_block_without_a_signal_leaves_stop_unset():
    stop = threading.Event()
    with graceful_signals(stop) as received:
        pass
    assert not stop.is_set() and received == []
