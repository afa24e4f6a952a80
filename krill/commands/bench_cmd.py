"""`krill bench ...`: benchmarks that print figures (tables, or JSON with --json).

Each benchmark lives in its own module and loads only when run; every benchmark states the machine
it ran on (see `krill.bench_env.machine_facts`).
"""

from __future__ import annotations

import click

from krill.cli import LazyGroup

BENCHMARKS = {
    "aggregate": "krill.commands.bench_aggregate:aggregate",
    "compression": "krill.commands.bench_compression:compression",
    "gas": "krill.commands.bench_gas:gas",
    "protocol": "krill.commands.bench_protocol:protocol",
    "robustness": "krill.commands.bench_robustness:robustness",
    "rl": "krill.commands.bench_rl:rl",
    "scale": "krill.commands.bench_scale:scale",
    "store": "krill.commands.bench_store:store",
    "verify": "krill.commands.bench_verify:verify",
}


@click.group(cls=LazyGroup, lazy=BENCHMARKS)
def bench() -> None:
    """Measure Krill: gas per contract call, store and signature throughput, and more."""
