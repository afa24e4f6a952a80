"""`krill worker ...`: the worker's commands (`init`, `stake`, `run`, `status`, `unstake`, `withdraw`, `claim`).

Design decisions:
- The commands only read options and print; the work lives in `runner`, `status` and
  `nonce_state`, and in the core's role-neutral `krill.staking`, `krill.role_init` and
  `krill.account_status` (whose click commands `krill.commands.role_cmds` builds for both roles).
  torch, transformers and web3 are imported inside the functions, so `krill --help` stays instant.
- Under `krill` the root command supplies --config/--set; `python -m krill.worker` wraps the same
  commands in a small group with those options (`main`), so the role also runs on its own.
- Status lines go to stdout as they happen, one per contribution; on a terminal a progress bar
  sits under them (`krill.progress`), elsewhere the output is exactly the lines.
- SIGTERM stops `run` as Ctrl-C does (`stop_on_signals`: KeyboardInterrupt, the state is saved and
  the worker says so). The first signal puts back the default actions, so a second one (`timeout
  -k`, a service manager's, another Ctrl-C) ends the process at once without a traceback: the
  handler used to stay and raise KeyboardInterrupt again, which, landing in an interpreter exit
  hook, printed `Exception ignored in atexit callback ... KeyboardInterrupt`.
"""

from __future__ import annotations

import click

from krill.commands.role_cmds import add_common_commands
from krill.errors import KrillError
from krill.runtime import stop_on_signals
from krill.worker.behaviors import BEHAVIORS

BEHAVIOR_NAMES = sorted(BEHAVIORS)


@click.group("worker")
def worker() -> None:
    """Contribute rollouts and gradients to a run (init, stake, then run)."""


add_common_commands(worker, "worker")


@worker.command("run")
@click.option("--behavior", type=click.Choice(BEHAVIOR_NAMES), default=None,
              help="Strategy (default: worker.behavior); anything but honest is an attack for tests and demos.")
@click.option("--max-contributions", type=click.IntRange(min=1), default=None,
              help="Stop after this many commits (default: worker.max_contributions, else run on).")
def run(behavior: str | None, max_contributions: int | None) -> None:
    """Watch the run's versions, sample, learn, sign, upload and commit contributions."""
    with stop_on_signals():
        _run(behavior, max_contributions)


def _run(behavior: str | None, max_contributions: int | None) -> None:
    from krill.commands.context import current_config
    from krill.commands.role_cmds import password_prompt
    from krill.progress import LineProgress
    from krill.worker.runner import run_worker

    config = current_config()
    limit = max_contributions if max_contributions is not None else config.worker.max_contributions
    committed = 0

    with LineProgress("committed", total=limit) as bar:
        def on_outcome(outcome) -> None:
            nonlocal committed
            committed += outcome.status == "committed"
            bar.update(committed)

        try:
            outcomes = run_worker(config, behavior, max_contributions, echo=bar.line, on_outcome=on_outcome,
                                  prompt=password_prompt())
        except KeyboardInterrupt:
            bar.line("worker stopped (state saved; `krill worker run` resumes)")
            return
    done = sum(o.status == "committed" for o in outcomes)
    click.echo(f"worker done: {done} committed, {len(outcomes) - done} dropped")


@worker.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (amounts as decimal token strings).")
def status(as_json: bool) -> None:
    """Stake, unbonding, jailed, trust, contributions (committed/dropped; accepted/rejected with reasons),
    earned and claimable."""
    from krill.commands.context import current_config
    from krill.commands.role_cmds import emit_status
    from krill.worker.status import worker_status

    account, rows, extra, details = worker_status(current_config())
    emit_status(account, rows, extra, as_json, details)


class _StandaloneGroup(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KrillError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            ctx.exit(1)


@click.group(cls=_StandaloneGroup, commands=worker.commands,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="KRILL_CONFIG",
              help="Deployment TOML file (default: $KRILL_CONFIG, else the running devnet's).")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.FIELD=VALUE",
              help="Override one configuration field; repeatable.")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, overrides: tuple[str, ...]) -> None:
    """The Krill worker (same commands as `krill worker`)."""
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path
    ctx.obj["overrides"] = overrides
