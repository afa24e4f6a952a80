"""`krill bench ...`: benchmarks that print figures (tables, or JSON with --json).

Each benchmark lives in its own module and loads only when run; every benchmark states the machine
it ran on (see `krill.bench_env.machine_facts`).

The `--out` folder of a benchmark that writes files is made and test-written before the benchmark runs
(`output_dir`): a path through a file, or a folder that cannot be written, used to fail only when the
results were written, after the whole run (seconds to hours), losing them with a traceback.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from krill.cli import LazyGroup

BENCHMARKS = {
    "aggregate": "krill.commands.bench_aggregate:aggregate",
    "compression": "krill.commands.bench_compression:compression",
    "gas": "krill.commands.bench_gas:gas",
    "latency": "krill.commands.bench_latency:latency",
    "protocol": "krill.commands.bench_protocol:protocol",
    "robustness": "krill.commands.bench_robustness:robustness",
    "rl": "krill.commands.bench_rl:rl",
    "scale": "krill.commands.bench_scale:scale",
    "store": "krill.commands.bench_store:store",
    "verify": "krill.commands.bench_verify:verify",
}


def output_dir(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A click callback for `--out`: the folder, made if need be and checked writable (a file created and
    removed in it) before the benchmark starts; `click.BadParameter` naming the path and the reason if not."""
    if value is None:
        return None
    try:
        value.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=value):
            pass
    except OSError as exc:
        raise click.BadParameter(f"{value} cannot hold the results: {exc.strerror or exc}") from None
    return value


@click.group(cls=LazyGroup, lazy=BENCHMARKS)
def bench() -> None:
    """Measure Krill: gas per contract call, store and signature throughput, and more."""
