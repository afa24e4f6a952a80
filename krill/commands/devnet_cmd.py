"""`krill devnet up|down|status`: a local chain for development and the demo.

Design decisions:
- `up` starts the pinned Anvil on 127.0.0.1 in its own session (it outlives the command), tracked by
  the PID written to $KRILL_HOME/devnet/anvil.pid; deploys the Krill token and protocol, mints stake
  tokens to the dev accounts, and writes $KRILL_HOME/devnet/config.toml, which later commands read by
  default (see `krill.config.default_config_path`).
- `up` is idempotent: a devnet that is running and answering is reported, not restarted.
- `down` stops only the PID it recorded, and removes the state so a later `up` starts clean.
"""

from __future__ import annotations

import json

import click

from krill.config import krill_home


def _state_dir():
    return krill_home() / "devnet"


@click.group()
def devnet() -> None:
    """Run a local development chain with the Krill contracts deployed."""


@devnet.command("up")
@click.option("--port", type=click.IntRange(1, 65535), default=8545, show_default=True, help="RPC port on 127.0.0.1.")
@click.option("--json", "as_json", is_flag=True, help="Print the devnet state as JSON.")
def up(port: int, as_json: bool) -> None:
    """Start Anvil, deploy the contracts, fund dev accounts and write the devnet config."""
    from krill.chain.devnet import start_devnet

    state, started = start_devnet(_state_dir(), port=port)
    if as_json:
        click.echo(json.dumps(state.to_json()))
        return
    click.echo(("started" if started else "already running") + f" devnet at {state.rpc_url} (pid {state.pid})")
    click.echo(f"  chain id        {state.chain_id}")
    click.echo(f"  KrillProtocol   {state.protocol_address}")
    click.echo(f"  KrillToken      {state.token_address}")
    click.echo(f"  config          {state.config_path}")


@devnet.command("down")
def down() -> None:
    """Stop the devnet started by `krill devnet up` and forget its state."""
    from krill.chain.devnet import stop_devnet

    stopped = stop_devnet(_state_dir())
    click.echo("devnet stopped" if stopped else "no devnet was running")


@devnet.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(as_json: bool) -> None:
    """Say whether the devnet runs, and its latest block."""
    from krill.chain.devnet import devnet_status

    data = devnet_status(_state_dir())
    if as_json:
        click.echo(json.dumps(data))
        return
    if not data["running"]:
        click.echo("no devnet running (start one with `krill devnet up`)")
        return
    for key, value in data.items():
        click.echo(f"{key:18} {value}")
