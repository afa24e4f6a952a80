"""`krill config show`: the effective configuration with secrets masked."""

from __future__ import annotations

import json

import click

from krill.commands.context import current_config


@click.group()
def config() -> None:
    """Inspect the deployment configuration."""


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of TOML.")
def show(as_json: bool) -> None:
    """Print the effective configuration (file < env < --set) with secrets masked."""
    import tomli_w

    data = current_config().masked()
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(tomli_w.dumps(_drop_none(data)), nl=False)


def _drop_none(data):
    if isinstance(data, dict):
        return {k: _drop_none(v) for k, v in data.items() if v is not None}
    return data
