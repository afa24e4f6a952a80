"""The `krill` command.

Design decisions:
- Sub-commands load lazily: the core ones from the `CORE_COMMANDS` table (module:attribute), the
  roles' from the `krill.commands` entry-point group that each role declares in pyproject, the
  way pytest and flask find plugins. The core never imports a role, and `krill --help` imports no
  heavy library (torch, transformers, web3): command modules import those inside their functions.
- Every deliberate `KrillError` is shown as one line `error: ...` with exit status 1; anything else
  is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points

import click

from krill import __version__
from krill.errors import KrillError

CORE_COMMANDS: dict[str, str] = {
    "config": "krill.commands.config_cmd:config",
    "keys": "krill.commands.keys_cmd:keys",
    "devnet": "krill.commands.devnet_cmd:devnet",
    "demo": "krill.commands.demo_cmd:demo",
    "bench": "krill.commands.bench_cmd:bench",
    "index": "krill.commands.index_cmd:index",
    "store": "krill.commands.store_cmd:store",
    "model": "krill.commands.model_cmd:model",
    "eval": "krill.commands.eval_cmd:eval_",
    "train": "krill.commands.train_cmd:train",
    "audit": "krill.commands.audit_cmd:audit",
    "calibrate": "krill.commands.calibrate_cmd:calibrate",
    "release": "krill.commands.release_cmd:release",
}
ROLE_GROUP = "krill.commands"


def _load(spec: str) -> click.Command:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported only when used (or listed by --help)."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, with_roles: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy or {})
        if with_roles:
            for ep in entry_points(group=ROLE_GROUP):
                self._lazy.setdefault(ep.name, ep.value)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self._lazy:
            return _load(self._lazy[name])
        return super().get_command(ctx, name)


class _KrillGroup(LazyGroup):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KrillError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            ctx.exit(1)


@click.group(cls=_KrillGroup, lazy=CORE_COMMANDS, with_roles=True,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "-V", "--version", prog_name="krill")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="KRILL_CONFIG",
              help="Deployment TOML file (default: $KRILL_CONFIG, else the running devnet's).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.FIELD=VALUE",
              help="Override one configuration field; repeatable.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Krill: RL post-training of language models on untrusted hardware, audited from public data."""
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path
    ctx.obj["overrides"] = overrides


def main() -> None:
    from krill.allocator import tune_heap

    tune_heap()
    cli(prog_name="krill")


if __name__ == "__main__":
    sys.exit(main())
