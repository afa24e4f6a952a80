"""The detection study's per-attack summary over its runs (`--full` repeats every batch), without demos."""

from __future__ import annotations

import pytest


def _run(commits: int, versions_to_slash: int | None) -> dict:
    return {"commits": commits, "checked": 2, "failed": 1, "detection_rate": 0.5, "rejected_by_coordinator": {},
            "folded": 1, "versions_to_slash": versions_to_slash, "jailed": versions_to_slash is not None,
            "versions": 100}


@pytest.fixture
def summarised(monkeypatch):
    import krill.bench.detection as detection

    runs = {"once-in-two": [_run(8, 3), _run(9, None)],  # slashed in one repeat of two
            "two-in-three": [_run(8, 3), _run(9, 5), _run(7, None)],
            "always": [_run(8, 3), _run(9, 5)],
            "refused": [_run(0, None), _run(4, 2)]}  # the contract refused its commits in one run: nothing to slash
    monkeypatch.setattr(detection, "_run_batches", lambda plan, p, root, echo: (runs, 1.0))
    return detection.run_detection("full", echo=lambda line: None)


def test_a_run_that_ended_without_a_slash_counts_as_slowest_not_left_out(summarised):
    attacks = summarised["attacks"]
    assert attacks["once-in-two"]["median_versions_to_slash"] is None  # it read 3: the one run that slashed
    assert attacks["two-in-three"]["median_versions_to_slash"] == 5  # median of 3, 5 and never; it read 4.0
    assert attacks["always"]["median_versions_to_slash"] == 4.0
    assert attacks["refused"]["median_versions_to_slash"] == 2
    assert [attacks[a]["slashed_runs"] for a in ("once-in-two", "two-in-three", "always")] == [1, 2, 2]


def test_the_table_says_how_unslashed_runs_count(summarised):
    from krill.bench.detection import markdown

    table = markdown(summarised)
    assert "counts a run that ended without a slash as slowest" in table
    assert "| once-in-two | 17 | 4 | 2 | 0.50 | 2 | - | - | 1/2 |" in table
