"""`freeze_heap`: objects alive at the freeze leave the collector's view, once per process."""

import gc

import krill.runtime as runtime


def test_freeze_heap_freezes_once_per_process(monkeypatch):
    monkeypatch.setattr(runtime, "_HEAP_FROZEN", False)
    before = gc.get_freeze_count()
    try:
        runtime.freeze_heap()
        frozen = gc.get_freeze_count()
        assert frozen > before
        garbage = [[] for _ in range(1000)]
        runtime.freeze_heap()  # a second call changes nothing
        assert gc.get_freeze_count() == frozen
        del garbage
    finally:
        gc.unfreeze()
