"""Every benchmark states the machine it ran on: `krill bench store` and `krill bench gas` too.

Both print a rich table and had no machine in it (`bench store` had none in its JSON either), while
the README and `krill bench`'s help say every benchmark states it.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from krill.bench_env import machine_facts


def _states(output: str, machine: dict) -> bool:
    return (f"Machine: {machine['usable_cpus']} usable CPUs of {machine['cpu_count']}" in output
            and machine["date_utc"] in output and f"torch {machine['versions']['torch']}" in output)


def test_bench_store_states_the_machine_in_its_json_and_under_its_table():
    from krill.commands.bench_store import store

    data = json.loads(CliRunner().invoke(store, ["--size-mb", "1", "--repeats", "1", "--json"]).output)
    assert set(data["machine"]) >= {"cpu_count", "usable_cpus", "memory_gib", "platform", "versions", "date_utc"}
    result = CliRunner().invoke(store, ["--size-mb", "1", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert "validate a contribution" in result.output
    assert "Machine: " in result.output and "usable CPUs of" in result.output


def test_bench_gas_states_the_machine_under_its_table(monkeypatch):
    import krill.commands.bench_gas as bench_gas

    machine = machine_facts()
    figures = {key: 50_000 for key in bench_gas.LABELS} | {"settleBatchSize": 16, "compiler": "0.8.37",
                                                           "evmVersion": "prague", "node": "anvil 1.7.1",
                                                           "machine": machine}
    monkeypatch.setattr(bench_gas, "run_bench", lambda batch_size: figures)  # no Anvil: the rendering only
    result = CliRunner().invoke(bench_gas.gas, [])
    assert result.exit_code == 0, result.output
    assert "publishVersion" in result.output and _states(result.output, machine)
