"""Float options refuse `nan` (and infinities): click's `FloatRange` let `nan` through every bound, so
`krill index sync --poll nan` reached `time.sleep` and `krill train local --lr nan` the optimizer."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from krill.cli import cli

CASES = [
    (["index", "sync", "--follow", "--poll"], "--poll"),
    (["demo", "--minutes"], "--minutes"),
    (["train", "local", "--minutes"], "--minutes"),
    (["train", "local", "--lr"], "--lr"),
    (["train", "local", "--density"], "--density"),
    (["bench", "rl", "--out", "{tmp}", "--seconds"], "--seconds"),
]


@pytest.mark.parametrize(("args", "option"), CASES, ids=[" ".join(a) for a, _ in CASES])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_non_finite_float_is_a_usage_error_naming_the_option(tmp_path, monkeypatch, args, option, value):
    monkeypatch.setenv("KRILL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KRILL_CONFIG", raising=False)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args] + [value]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"Invalid value for '{option}'" in result.output
