"""`python -m krill.verifier [--config F] [--set S.F=V] COMMAND`: the role without the `krill` entry point
(commands: init, stake, run, status, unstake, withdraw, claim).

The root options mirror `krill`'s own, so `krill.commands.context.current_config` finds them;
deliberate `KrillError`s print one `error:` line and exit 1, as under `krill`.
"""

from __future__ import annotations

import sys

import click

from krill.errors import KrillError
from krill.verifier.cli import verifier


@click.group(commands=verifier.commands, help=verifier.help,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="KRILL_CONFIG",
              help="Deployment TOML file (default: $KRILL_CONFIG, else the running devnet's).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.FIELD=VALUE",
              help="Override one configuration field; repeatable.")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, overrides: tuple[str, ...]) -> None:
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path
    ctx.obj["overrides"] = overrides


if __name__ == "__main__":
    try:
        main(prog_name="python -m krill.verifier")
    except KrillError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(1)
