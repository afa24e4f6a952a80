"""The robustness study mounts `tolerance-edge` on the Byzantine workers' own honest rows: the
trainer simulates all n workers and the last f rows are replaced, weights kept."""

import dataclasses

import torch

import krill.bench.robustness_inproc as inproc
from krill.bench.robustness_inproc import SIZES, AttackedTrainer, _config
from krill.rl.attacks import byzantine_updates


def _model(tmp_path):
    from krill.model.build import TinyModelSpec, build_tiny_model

    build_tiny_model(seed=0, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=tmp_path)
    return tmp_path


def test_own_gradient_attack_replaces_the_last_rows_and_keeps_their_weights(tmp_path):
    trainer = AttackedTrainer(_model(tmp_path), _config(SIZES["tiny"], 3), "tolerance-edge", 1, measure_shift=True)
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(3, 50, generator=gen) + torch.randn(50, generator=gen)
    weights = torch.tensor([1.0, 0.5, 1 / 3], dtype=torch.float64)
    x, w = trainer.shard_updates(0, rows, weights)
    assert x.shape == rows.shape and torch.equal(x[:2], rows[:2]) and w is weights
    expected = byzantine_updates("tolerance-edge", rows[:2], 1, torch.Generator(), own=rows[2:], n_total=3)
    assert torch.equal(x[2:], expected)  # the attack ignores the generator unless mu is parallel to the row
    cosine = float(x[2].double() @ rows[2].double() / (x[2].double().norm() * rows[2].double().norm()))
    assert 0.99909 <= cosine < 0.9991
    (shift,) = trainer.shifts
    assert 0 < shift["shift"] < 0.1 and shift["progress"] < 1.0


def test_grid_simulates_all_n_workers_for_own_gradient_attacks(tmp_path, monkeypatch):
    calls = []

    def fake_cell(model_dir, config, attack=None, n_byzantine=0, *rest, **kw):
        calls.append((attack, n_byzantine, config.workers))
        return {"accuracy": 0.0, "reward": 0.0, "seconds": 0.0}

    monkeypatch.setattr(inproc, "train_cell", fake_cell)
    size = dataclasses.replace(SIZES["tiny"], attacks=("sign-flip", "tolerance-edge"), rules=("mean",))
    inproc.robustness_grid(tmp_path, size, lambda line: None)
    assert calls == [(None, 0, 5), ("sign-flip", 1, 4), ("tolerance-edge", 1, 5)]


def test_markdown_says_what_tolerance_edge_rows_are():
    from krill.commands.bench_robustness import _robustness_md

    settings = {"versions": 2, "workers": 5, "prompts_per_worker": 2, "group_size": 4, "eval_n": 20,
                "fractions": [0.0, 0.2], "rules": ["mean"], "attacks": ["tolerance-edge"]}
    rows = [{"rule": "mean", "attack": None, "fraction": 0.0, "byzantine": 0, "accuracy": 0.5},
            {"rule": "mean", "attack": "tolerance-edge", "fraction": 0.2, "byzantine": 1, "accuracy": 0.4}]
    text = "\n".join(_robustness_md({"settings": settings, "robustness": rows, "base_accuracy": 0.3}))
    assert "verifier's gradient check admits" in text and "| mean | 50.0 | 40.0 |" in text
    settings["attacks"] = ["sign-flip"]
    rows[1]["attack"] = "sign-flip"
    assert "gradient check admits" not in "\n".join(_robustness_md({"settings": settings, "robustness": rows,
                                                                     "base_accuracy": 0.3}))
