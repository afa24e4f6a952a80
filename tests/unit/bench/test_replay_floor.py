"""The in-process floor of a replay: every pass is measured on a real (tiny) model, and the report reads them."""

from __future__ import annotations

import pytest

from krill.bench.replay_floor import markdown_lines, measure


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from krill.model.build import TinyModelSpec, build_tiny_model

    directory = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(seed=1, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=directory)
    return directory


def test_every_pass_is_measured_and_the_ratios_follow_from_them(tiny_model):
    floor = measure(tiny_model, prompts=3, group_size=4, num_shards=2, repeats=1)
    ms = floor["ms"]
    for key in ("generate", "gradient_all_shards", "teacher_forced", "gradient_shard_0", "gradient_shard_1",
                "teacher_forced_one_group", "gradient_shard_0_one_group", "gradient_per_group_claims"):
        assert ms[key] > 0, key
    assert floor["settings"]["sequences"] == 12
    assert floor["worker_ms"] == pytest.approx(ms["generate"] + ms["gradient_all_shards"])
    resample = ms.get("confirm_draws", ms["teacher_forced"])
    one_shard = (ms["gradient_shard_0"] + ms["gradient_shard_1"]) / 2
    assert floor["replay_pct"] == pytest.approx(100 * (resample + one_shard) / floor["worker_ms"])
    assert floor["per_group_claims_gradient_x"] == pytest.approx(ms["gradient_per_group_claims"] / ms["gradient_all_shards"])
    text = "\n".join(markdown_lines(floor))
    assert "12 sequences = 3 prompts x 4" in text and "gradient of shard 1 alone" in text
    assert f"{floor['replay_pct']:.1f}%" in text


def test_the_floor_by_completion_length_measures_each_cap_on_a_random_model_of_the_shape():
    from krill.bench.replay_floor import by_completion_length, length_markdown_lines
    from krill.model.build import TinyModelSpec

    rows = by_completion_length(TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), (2, 6), prompts=2,
                                group_size=4, repeats=1)
    assert [r["max_new_tokens"] for r in rows] == [2, 6] and all(r["sequences"] == 8 for r in rows)
    # a random model rarely ends a sample early: the longer cap samples more tokens
    assert rows[0]["completion_tokens"] <= 16 < rows[1]["completion_tokens"] <= 48
    for r in rows:
        ms = r["ms"]
        resample = ms.get("confirm_draws", ms.get("teacher_forced"))
        assert r["worker_ms"] == pytest.approx(ms["generate"] + ms["gradient_all_shards"])
        assert r["replay_pct"] == pytest.approx(100 * (resample + ms["gradient_one_shard"]) / r["worker_ms"])
        assert r["gradient_check_x"] == pytest.approx(ms["gradient_one_shard"] / ms["gradient_all_shards"])
    text = "\n".join(length_markdown_lines(rows, "test"))
    assert "random model of the test shape" in text and f"| 6 | {rows[1]['completion_tokens']} |" in text
