"""`krill worker ...`: the worker's commands (`stake`, `run`, `status`).

Design decisions:
- The commands only read options and print; the work lives in `runner`, `stake` and
  `nonce_state`, which tests call directly. torch, transformers and web3 are imported inside the
  functions (through those modules), so `krill --help` stays instant.
- Under `krill` the root command supplies --config/--set; `python -m krill.worker` wraps the same
  commands in a small group with those options (`main`), so the role also runs on its own.
- Status lines go to stdout as they happen, one per contribution.
"""

from __future__ import annotations

import click

from krill.errors import KrillError
from krill.worker.behaviors import BEHAVIORS

BEHAVIOR_NAMES = sorted(BEHAVIORS)


@click.group("worker")
def worker() -> None:
    """Contribute rollouts and gradients to a run (stake first, then run)."""


@worker.command("stake")
@click.option("--amount", default=None, metavar="TOKENS",
              help="Tokens to stake, e.g. 500 or 12.5 (default: worker.stake from the config).")
def stake(amount: str | None) -> None:
    """Approve and stake tokens as a worker, bound to this keystore's Ed25519 key."""
    from krill.commands.context import current_config
    from krill.worker.stake import parse_tokens, stake_worker, tokens

    result = stake_worker(current_config(), parse_tokens(amount) if amount is not None else None)
    click.echo(f"staked {tokens(result.amount)} KRILL as worker {result.address} (total {tokens(result.staked)}; "
               f"ed25519 {result.ed25519_public_key[:16]}…; tx {result.transaction_hash})")


@worker.command("run")
@click.option("--behavior", type=click.Choice(BEHAVIOR_NAMES), default=None,
              help="Strategy (default: worker.behavior); anything but honest is an attack for tests and demos.")
@click.option("--max-contributions", type=click.IntRange(min=1), default=None,
              help="Stop after this many commits (default: worker.max_contributions, else run on).")
def run(behavior: str | None, max_contributions: int | None) -> None:
    """Watch the run's versions, sample, learn, sign, upload and commit contributions."""
    import signal

    from krill.commands.context import current_config
    from krill.worker.runner import run_worker

    def _terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    try:
        outcomes = run_worker(current_config(), behavior, max_contributions, echo=lambda line: click.echo(line))
    except KeyboardInterrupt:
        click.echo("worker stopped (state saved; `krill worker run` resumes)")
        return
    done = sum(o.status == "committed" for o in outcomes)
    click.echo(f"worker done: {done} committed, {len(outcomes) - done} dropped")


@worker.command("status")
def status() -> None:
    """This worker's stake and local state (next nonce, pending commit, outcomes)."""
    from krill.commands.context import current_config
    from krill.keystore import read_info, resolve_keystore
    from krill.runtime import connect_chain, role_state_dir, run_id_of
    from krill.worker.nonce_state import WorkerState
    from krill.worker.stake import tokens

    config = current_config()
    info = read_info(resolve_keystore(config.keystore.path))
    chain = connect_chain(config)
    stake_info = chain.stake_of(info.address)
    state = WorkerState.open(role_state_dir(config, "worker", info.address), run_id_of(config), info.address)
    history = state.history()
    click.echo(f"worker {info.address}: staked {tokens(stake_info.staked)} KRILL, jailed={stake_info.jailed}")
    click.echo(f"next nonce {state.next_nonce}; pending: "
               + (f"nonce {state.pending.nonce} at v{state.pending.model_version}" if state.pending else "none"))
    click.echo(f"{sum(h['status'] == 'committed' for h in history)} committed, "
               f"{sum(h['status'] != 'committed' for h in history)} dropped ({state.log_path})")


class _StandaloneGroup(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KrillError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            ctx.exit(1)


@click.group(cls=_StandaloneGroup, commands={"stake": stake, "run": run, "status": status},
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
