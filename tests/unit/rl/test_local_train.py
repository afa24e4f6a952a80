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
        "--group-size", "4", "--eval-n", "20", "--eval-every", "2", "--threads", "1", "--summary", str(summary)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("v")]
    assert len(lines) == 3 and "staleness" in lines[0] and "tok/s" in lines[0]
    data = json.loads(summary.read_text())
    assert data["versions"] == 3
    assert [v for v, _ in data["curve"]] == [0, 2, 3]
    assert data["final_accuracy"] == data["curve"][-1][1]
    assert data["compression_ratio"] > 4 and data["wall_seconds"] > 0
    assert summary.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
