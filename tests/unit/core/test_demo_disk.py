"""The demo's disk check: the estimate scales with the weights and the version budget, a full disk stops it
before anything starts with figures and earlier demos named, and earlier demos are listed, never touched."""

from __future__ import annotations

from collections import namedtuple

import pytest

from krill.demo import disk
from krill.errors import ConfigError

Usage = namedtuple("Usage", "total used free")


def _model(tmp_path, size: int):
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"\0" * size)
    (d / "config.json").write_text("{}")
    return d


def test_the_estimate_scales_with_the_weights_and_the_versions(tmp_path):
    model = _model(tmp_path, 1000)
    assert disk.weight_bytes(model) == 1000
    assert disk.estimated_bytes(model, 400, 10) == int(1.05 * disk.store_bytes_per_weight_byte(10) * 1000 * 400)
    assert disk.estimated_bytes(model, 800, 10) == 2 * disk.estimated_bytes(model, 400, 10)
    # the AdamW states (2 x the weights) only every optimizer_state_every-th version
    assert disk.store_bytes_per_weight_byte(1) - disk.store_bytes_per_weight_byte(10) == pytest.approx(2 * 0.9)


def test_a_dense_start_adds_each_workers_unsent_coordinates_for_its_versions(tmp_path):
    from krill.demo.orchestrate import DemoConfig, spec_compression

    model = _model(tmp_path, 4000)  # 1,000 fp32 parameters
    sparse = disk.estimated_bytes(model, 400, 10)
    # 4 workers, 25% int8: a dense version sends 750 more int8 values per worker, 3,000 bytes (0.75 x the weights)
    dense = disk.DenseStart(versions=15, density=0.25, value_bytes=1, workers=4)
    assert dense.bytes_per_weight_byte() == pytest.approx(0.75)
    assert disk.estimated_bytes(model, 400, 10, dense) - sparse == pytest.approx(1.05 * 15 * 3000, abs=1)
    # only the dense versions within the budget count; none at all is the sparse estimate
    assert disk.estimated_bytes(model, 10, 10, dense) - disk.estimated_bytes(model, 10, 10) == pytest.approx(
        1.05 * 10 * 3000, abs=1)
    assert disk.estimated_bytes(model, 400, 10, disk.DenseStart(0, 0.25, 1, 4)) == sparse
    # the demo reads its run's compression as create-run will build it: the run default (25% int8), and a
    # compression table over it field by field (its density stays 0.25 where the table names none)
    default = spec_compression(DemoConfig())
    assert (default.density, default.dtype, default.dense_versions) == (0.25, "int8", 0)
    assert default == _created_spec(DemoConfig()).compression
    demo = DemoConfig(spec_overrides={"compression": {"dense_versions": 15, "dtype": "fp16"}})
    overridden = spec_compression(demo)
    assert overridden == _created_spec(demo).compression
    assert disk.DenseStart.of(overridden, 4) == disk.DenseStart(15, 0.25, 2, 4)


def _created_spec(config):
    """The RunSpec `krill coordinator create-run` builds from the demo's overrides, over a two-tensor model."""
    from types import SimpleNamespace

    from krill.coordinator.create_run import build_spec
    from krill.demo.orchestrate import demo_spec

    shards = [SimpleNamespace(parameters=[SimpleNamespace(shape=[4, 8])]),
              SimpleNamespace(parameters=[SimpleNamespace(shape=[8])])]
    manifest = SimpleNamespace(shards=shards, architecture={"vocab_size": 16, "max_position_embeddings": 32})
    return build_spec("krill-demo", manifest, "bafy" + "a" * 40, 2, demo_spec(config))


def test_a_demo_that_would_fill_the_disk_stops_naming_the_figures_and_earlier_demos(tmp_path, monkeypatch):
    model = _model(tmp_path, 4_000_000)
    parent = tmp_path / "demo"
    old = parent / "20261204-120000"
    (old / "store").mkdir(parents=True)
    (old / "store" / "block").write_bytes(b"x" * 2048)
    current = parent / "20261205-040000"  # not created yet: the check probes the nearest existing parent
    earlier = disk.earlier_demos(parent, current)
    assert earlier == [(old, 2048)]
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage(10**12, 0, 10**9))
    with pytest.raises(ConfigError) as info:
        disk.check_space(current, model, 400, 10, earlier)
    text = str(info.value)
    assert "2.6 GB" in text and "1.0 GB free" in text and "--versions" in text
    assert "20261204-120000 0.0 GB" in text
    assert old.exists()  # listed, never deleted
    assert disk.check_space(current, model, 20, 10, earlier) == disk.estimated_bytes(model, 20, 10)  # 20 versions fit
    with pytest.raises(ConfigError, match="every coordinate of every gradient for the first 20"):
        disk.check_space(current, model, 300, 10, earlier, disk.DenseStart(20, 0.25, 1, 4))
    # the demo's printed estimate says the same as the refusal, dense start included only when there is one
    assert disk.store_contents(10, disk.DenseStart(20, 0.25, 1, 4), 12).endswith("gradient for the first 12")
    assert disk.store_contents(10, disk.DenseStart(0, 0.25, 1, 4), 12) == disk.store_contents(10, None, 12) == (
        "each version's weights, and the AdamW states every 10 versions")


def test_tree_bytes_counts_regular_files_and_a_missing_tree_is_empty(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "f").write_bytes(b"12345")
    (tmp_path / "a" / "b" / "g").write_bytes(b"123")
    assert disk.tree_bytes(tmp_path / "a") == 8
    assert disk.tree_bytes(tmp_path / "missing") == 0
    assert disk.earlier_demos(tmp_path / "missing", tmp_path / "x") == []
