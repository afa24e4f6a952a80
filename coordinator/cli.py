"""`krill coordinator create-run | run`: the coordinator role's commands.

Design decisions:
- Configuration is the root command's (`krill --config ... --set ... coordinator ...`); the
  coordinator's own section gives poll interval, back-off cap, eval cadence, version budget,
  served shards and threads. Flags override the section where both exist (`--shards`).
- Heavy libraries (torch, transformers, web3) are imported inside the commands.
- Starting while chain or store are unreachable waits with exponential back-off, like the loop.
"""

from __future__ import annotations

import contextlib
import json
import time

import click

from krill.commands.context import current_config


def _shards(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected shard numbers separated by commas, e.g. 0,1") from None


@click.group()
def coordinator() -> None:
    """Fold workers' contributions into new model versions and publish them (the coordinator role)."""


@coordinator.command("create-run")
@click.option("--name", default="krill-run", show_default=True, help="Run name (letters, digits, . _ -).")
@click.option("--shards", "num_shards", type=click.IntRange(1, 256), default=2, show_default=True,
              help="Number of parameter shards.")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False), help="TOML overrides of the run spec.")
@click.option("--model", "model_dir", type=click.Path(file_okay=False), help="Local HF model directory "
              "(default: the built-in base model, built on first use).")
@click.option("--fund", type=float, default=None, help="Reward tokens to fund (default: 100 versions' rewards).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON description instead of the run id.")
def create_run_cmd(name: str, num_shards: int, spec_file: str | None, model_dir: str | None, fund: float | None,
                   as_json: bool) -> None:
    """Publish the base model and run spec, create the run on-chain and fund its rewards."""
    from krill.coordinator.create_run import TOKEN, create_run, read_spec_file
    from krill.runtime import connect_chain, open_configured_store, unlock_identity

    config = current_config()
    overrides = read_spec_file(spec_file)
    if model_dir is None:
        from krill.model.base import ensure_base_model

        model_dir = str(ensure_base_model())
    identity = unlock_identity(config)
    chain = connect_chain(config, identity.account)
    with open_configured_store(config) as store:
        created = create_run(chain, store, model_dir, name=name, num_shards=num_shards, overrides=overrides,
                             fund=None if fund is None else int(round(fund * TOKEN)))
    click.echo(json.dumps(created.to_json(), sort_keys=True) if as_json else created.run_id)


@coordinator.command("run")
@click.option("--shards", "shards_text", help="Shards to serve, e.g. 0,1 (default: coordinator.shards, else all).")
def run_cmd(shards_text: str | None) -> None:
    """Index, validate, fold, publish, settle and slash until stopped (or coordinator.max_versions)."""
    from krill.coordinator.context import open_run_context
    from krill.coordinator.loop import FAULTS, Coordinator, LoopOptions
    from krill.db.indexer import Indexer
    from krill.runtime import apply_cpu_settings

    config = current_config()
    section = config.coordinator
    apply_cpu_settings(section)
    delay = section.poll_interval_s
    with contextlib.ExitStack() as stack:
        while True:
            try:
                ctx = open_run_context(config, stack, _shards(shards_text))
                break
            except FAULTS as exc:
                delay = min(delay * 2, section.max_backoff_s)
                click.echo(f"waiting {delay:.1f} s: {type(exc).__name__}: {exc}", err=True)
                time.sleep(delay)
        depth = config.chain.confirmations_on(ctx.chain_id, ctx.spec.chain.challenge_window_blocks)
        indexer = Indexer(ctx.chain, ctx.db, ctx.store, start_block=config.chain.deploy_block,
                          confirmations=depth, latest_logs=True, content_in_sync=False)
        options = LoopOptions(poll_interval_s=section.poll_interval_s, max_backoff_s=section.max_backoff_s,
                              eval_every=section.eval_every, max_versions=section.max_versions)
        click.echo(f"coordinating run {ctx.run_hex[:16]}… ({ctx.spec.name}, task {ctx.spec.task}, "
                   f"K={ctx.spec.version.contributions}, deadline {ctx.spec.version.deadline_s:g} s, "
                   f"shards {ctx.shards if ctx.shards is not None else 'all'}) as {ctx.chain.sender}")
        try:
            Coordinator(ctx, indexer, options, echo=lambda line: click.echo(line)).run()
        except KeyboardInterrupt:
            click.echo("stopped")
