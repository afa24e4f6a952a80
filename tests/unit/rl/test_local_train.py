import json

from click.testing import CliRunner

from krill.commands.train_cmd import train


def test_train_local_runs_versions_and_writes_summary_and_curve(tmp_path):
    from krill.model.build import TinyModelSpec, build_tiny_model

    model_dir = tmp_path / "model"
    build_tiny_model(seed=0, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=model_dir)
    summary = tmp_path / "out" / "summary.json"
    result = CliRunner().invoke(train, [
        "local", "--model", str(model_dir), "--versions", "3", "--workers", "5", "--prompts-per-worker", "2",
        "--group-size", "4", "--eval-n", "20", "--eval-every", "2", "--threads", "1", "--dense-versions", "1",
        "--summary", str(summary)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("v")]
    assert len(lines) == 3 and "staleness" in lines[0] and "tok/s" in lines[0]
    data = json.loads(summary.read_text())
    assert data["versions"] == 3
    assert [v for v, _ in data["curve"]] == [0, 2, 3]
    assert data["final_accuracy"] == data["curve"][-1][1]
    assert data["compression_ratio"] > 4 and data["wall_seconds"] > 0
    assert summary.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _tiny_trainer(tmp_path, **overrides):
    from krill.model.build import TinyModelSpec, build_tiny_model
    from krill.rl.local_train import LocalTrainConfig, LocalTrainer

    model_dir = tmp_path / "model"
    build_tiny_model(seed=0, spec=TinyModelSpec(hidden=32, layers=2, heads=2, intermediate=64), directory=model_dir)
    config = LocalTrainConfig(workers=2, prompts_per_worker=2, group_size=4, versions=3, minutes=None, eval_n=10,
                              **overrides)
    return LocalTrainer(model_dir, config)


def test_stale_gradients_fold_each_versions_contributions_one_version_later(tmp_path):
    trainer = _tiny_trainer(tmp_path, stale_gradients=True)
    folded = []
    for _ in range(3):
        contributions, masks = trainer.next_batch()
        folded.append([(x.worker, x.version, x.nonce) for x in contributions])
        trainer.step(contributions, masks)
    # Version 0 folds its own batch (nothing older exists), version 1 folds version 0's again,
    # version 2 folds version 1's: what each contribution was made at is one version back.
    assert folded[1] == folded[0]
    assert {nonce for _, _, nonce in folded[2]} == {1}
    fresh = _tiny_trainer(tmp_path / "fresh")
    contributions, _ = fresh.next_batch()
    assert {x.nonce for x in contributions} == {0}


def test_stale_gradients_need_room_in_the_staleness_bound(tmp_path):
    import pytest
    from pydantic import ValidationError

    from krill.rl.local_train import LocalTrainConfig
    from krill.rl.staleness import StalenessConfig

    with pytest.raises(ValidationError, match="max_staleness >= 1"):
        LocalTrainConfig(stale_gradients=True, staleness=StalenessConfig(max_staleness=0))
    result = CliRunner().invoke(train, ["local", "--stale-gradients", "--max-staleness", "0"])
    assert result.exit_code == 2 and "--stale-gradients needs --max-staleness >= 1" in result.output


def test_train_local_from_the_command_line_takes_a_new_runs_rule(tmp_path, monkeypatch):
    """The CLI's `--rule` is a table, so it gets what a new run's rule gets (fixed-tree reductions, and for
    clip-mix-trim the non-zero-median clip basis); a built rule object kept the class defaults."""
    import krill.rl.local_train as local_train
    from krill.rl.aggregate import default_rule

    seen = {}

    def capture(model_dir, config, echo):
        seen["rule"] = config.rule
        raise SystemExit(0)

    monkeypatch.setattr(local_train, "run_local", capture)
    for rule in ("clip-mix-trim", "trimmed-mean"):
        result = CliRunner().invoke(train, ["local", "--model", str(tmp_path), "--rule", rule])
        assert result.exit_code == 0, result.output
        assert seen["rule"].type == rule and seen["rule"].reductions == default_rule().reductions
    assert default_rule().reductions != "torch"
    CliRunner().invoke(train, ["local", "--model", str(tmp_path), "--rule", "clip-mix-trim"])
    assert seen["rule"].clip_basis == default_rule().clip_basis


def test_the_loss_must_fit_the_sampler():
    """A learner at another temperature than the sampler sees ratios != 1 on on-policy rollouts, and no
    reference model is kept for a KL term: both are refused, as a run spec refuses them."""
    import pytest
    from pydantic import ValidationError

    from krill.rl.local_train import LocalTrainConfig
    from krill.rl.loss import LossConfig

    with pytest.raises(ValidationError, match="must equal the sampling temperature"):
        LocalTrainConfig(temperature=0.7)
    assert LocalTrainConfig(temperature=0.7, loss=LossConfig(temperature=0.7)).loss.temperature == 0.7
    with pytest.raises(ValidationError, match="no reference policy"):
        LocalTrainConfig(loss=LossConfig(kl_coef=0.5))
