"""Phases record only inside `recording()`, add up by name, and stay apart between recordings."""

from __future__ import annotations

import time

from krill.phases import current, phase, recording


def test_phases_add_up_inside_a_recording_and_cost_nothing_outside():
    with phase("outside"):
        pass
    assert current() == {}
    with recording() as phases:
        with phase("a"):
            time.sleep(0.01)
        with phase("a"), phase("b"):
            time.sleep(0.01)
        assert set(current()) == {"a", "b"}
    assert phases["a"] >= 0.02 and 0.01 <= phases["b"] <= phases["a"]
    assert current() == {}


def test_nested_recordings_do_not_mix():
    outer: dict[str, float] = {}
    with recording(outer):
        with phase("x"):
            pass
        with recording() as inner:
            with phase("y"):
                pass
        with phase("z"):
            pass
    assert set(outer) == {"x", "z"} and set(inner) == {"y"}
