"""`krill bench gas --json` measures every headline call on its own Anvil."""

from __future__ import annotations

import json

from click.testing import CliRunner

from krill.commands.bench_gas import gas


def test_bench_gas_json():
    result = CliRunner().invoke(gas, ["--json", "--batch-size", "8"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    for key in ("stake", "commit", "attest", "slash", "publishVersion", "settle", "settleBatch", "claim"):
        assert 21_000 < figures[key] < 1_000_000, key
    assert figures["settleBatchSize"] == 8
    assert figures["settle"] == round(figures["settleBatch"] / 8)
    assert figures["attest"] > figures["attestPass"]  # a failing verdict also records the verifier
    assert figures["evmVersion"] == "prague"
