"""The base-model build: reproducible, cached by recipe, stops at the target accuracy."""

from __future__ import annotations

import time

import pytest

from krill.model.base import BaseModelRecipe, base_model_info, ensure_base_model


def _recipe(small_spec, **kw):
    args = {"task": "arithmetic:1", "spec": small_spec, "max_steps": 12, "eval_every": 6, "eval_n": 16,
            "warmup_steps": 4, "batch_size": 8, "target_accuracy": 1.0}
    args.update(kw)
    return BaseModelRecipe(**args)


def test_build_is_reproducible_and_cached(small_spec, tmp_path):
    recipe = _recipe(small_spec)
    a = ensure_base_model(recipe, home=tmp_path / "a")
    b = ensure_base_model(recipe, home=tmp_path / "b")
    assert a.name == b.name == recipe.digest()[:16]
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    info = base_model_info(a)
    assert info["steps"] == 12 and [s for s, _ in info["curve"]] == [6, 12] and not info["reached_target"]
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    started = time.perf_counter()
    assert ensure_base_model(recipe, home=tmp_path / "a") == a
    assert time.perf_counter() - started < 5  # a cache hit: the build itself takes about a minute
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in (tmp_path / "a" / "models").iterdir() if p.name.startswith(".tmp")]


def test_recipe_changes_change_the_cache_key(small_spec):
    base = _recipe(small_spec)
    assert base.digest() != _recipe(small_spec, lr=1e-3).digest()
    assert base.digest() != _recipe(small_spec, task="arithmetic:2").digest()
    assert base.digest() == _recipe(small_spec).digest()


def test_stops_once_target_is_reached(small_spec, tmp_path):
    path = ensure_base_model(_recipe(small_spec, target_accuracy=0.0, max_steps=50), home=tmp_path)
    info = base_model_info(path)
    assert info["steps"] == 6 and info["reached_target"]


@pytest.mark.slow
def test_model_init_builds_the_default_model_in_range_then_returns_from_cache(tmp_path):
    """`krill model init` end to end (minutes): held-out accuracy inside 5-60%, second call instant."""
    import json

    from click.testing import CliRunner

    from krill.commands.eval_cmd import eval_
    from krill.commands.model_cmd import model

    env = {"KRILL_HOME": str(tmp_path)}
    first = CliRunner(env=env).invoke(model, ["init", "--json"])
    assert first.exit_code == 0, first.output
    info = json.loads(first.stdout)
    assert info["reached_target"]
    started = time.perf_counter()
    again = CliRunner(env=env).invoke(model, ["init", "--json", "--out", str(tmp_path / "copy")])
    assert again.exit_code == 0 and time.perf_counter() - started < 5
    result = CliRunner().invoke(eval_, ["--model", str(tmp_path / "copy"), "--task", info["recipe"]["task"],
                                        "--n", "500", "--json"])
    accuracy = json.loads(result.stdout)["accuracy"]
    assert 0.05 <= accuracy <= 0.60
