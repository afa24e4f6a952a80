"""`krill coordinator create-run | run`: the coordinator role's commands.

Design decisions:
- Configuration is the root command's (`krill --config ... --set ... coordinator ...`); the
  coordinator's own section gives poll interval, back-off cap, eval cadence, version budget,
  served shards and threads. Flags override the section where both exist (`--shards`).
- Heavy libraries (torch, transformers, web3) are imported inside the commands.
- Starting while chain or store are unreachable waits with exponential back-off, like the loop.
- SIGTERM and SIGINT stop `run` gracefully (`graceful_signals`): the pass under way ends (a
  version it journalled is published and settled; no new one is decided after the signal), the
  loop returns, and the process says so in one line and exits 0. Python's default SIGTERM ended the
  process wherever it was: `krill demo` (and any service manager) stops the coordinator that way
  and never restarts it, so a version journalled but not yet published was lost to the demo. A
  second signal interrupts at once (KeyboardInterrupt); the journal still makes a restart safe.
- `run` refuses to start where the run's unbonding period leaves too few seconds after a challenge
  window to confirm withheld content and slash it before the worker withdraws
  (`krill.coordinator.margin`; `coordinator.allow_short_unbonding` overrides, with a warning).
- The handler only writes a byte to a pipe; a relay thread sets the loop's stop event. Setting a
  `threading.Event` inside a signal handler takes its lock, and the handler runs on the main thread
  between any two bytecodes, also while that thread holds the same lock in `Event.wait`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator

import click

from krill.commands.context import current_config


def _shards(text: str | None) -> list[int] | None:
    """`--shards 0,1`, refused as `coordinator.shards` is (`krill.config`): a shard named twice, a negative
    one, or none. (A negative one was let through and refused only once the run was opened, so against a
    chain that was down the coordinator waited on it, with back-off, before saying so.)"""
    if text is None:
        return None
    try:
        shards = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected shard numbers separated by commas, e.g. 0,1") from None
    if not shards:
        raise click.BadParameter(f"{text!r}: must name at least one shard (leave it out for all)")
    if any(s < 0 for s in shards):
        raise click.BadParameter(f"{text!r}: shard numbers start at 0, got {sorted(s for s in shards if s < 0)}")
    if len(set(shards)) != len(shards):
        raise click.BadParameter(f"{text!r}: names a shard twice: {sorted({s for s in shards if shards.count(s) > 1})}")
    return sorted(shards)


def _fund(text: str | None) -> int | None:
    """`--fund TOKENS` as base units: a finite number of tokens, 0 or more, with at most 18 decimals. It was a
    float: `nan` and `inf` crashed with a traceback (after the keystore was unlocked), and a negative amount
    created the run unfunded, exit status 0, reporting the negative figure as funded."""
    from decimal import Decimal, InvalidOperation

    from krill.coordinator.create_run import TOKEN

    if text is None:
        return None
    try:
        value = Decimal(text.strip()) * TOKEN
    except (InvalidOperation, ArithmeticError):
        raise click.BadParameter(f"{text!r} is not a number of tokens (e.g. 20000 or 12.5)") from None
    if not value.is_finite() or value < 0 or value != value.to_integral_value():
        raise click.BadParameter(f"{text!r}: expected a number of tokens, 0 or more, with at most 18 decimals")
    return int(value)


@contextlib.contextmanager
def graceful_signals(stop: threading.Event,
                     signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[list[str]]:
    """Within the block, the first of `signums` sets `stop` (the names of the signals received are
    appended to the yielded list) and a second raises KeyboardInterrupt; the previous handlers come
    back on leaving. Main thread only (Python delivers signals there)."""
    received: list[str] = []
    read_fd, write_fd = os.pipe()

    def relay() -> None:
        if os.read(read_fd, 1):  # b"": the block ended without a signal
            stop.set()

    def handler(signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if received:
            raise KeyboardInterrupt(name)
        received.append(name)
        os.write(write_fd, b"\0")

    thread = threading.Thread(target=relay, name="coordinator-stop", daemon=True)
    thread.start()
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield received
    finally:
        for signum, old in previous.items():
            signal.signal(signum, signal.SIG_DFL if old is None else old)
        os.close(write_fd)
        thread.join(5.0)
        os.close(read_fd)


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
@click.option("--fund", metavar="TOKENS", default=None, callback=lambda ctx, param, value: _fund(value),
              help="Reward tokens to fund, e.g. 20000 or 12.5; 0: none (default: 100 versions' rewards).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON description instead of the run id.")
def create_run_cmd(name: str, num_shards: int, spec_file: str | None, model_dir: str | None, fund: int | None,
                   as_json: bool) -> None:
    """Publish the base model and run spec, create the run on-chain and fund its rewards."""
    from krill.coordinator.create_run import check_spec, create_run, read_spec_file
    from krill.runtime import connect_chain, open_configured_store, unlock_identity

    config = current_config()
    overrides = read_spec_file(spec_file)
    source = f"spec file {spec_file}"
    check_spec(overrides, name=name, num_shards=num_shards, source=source)  # before the password and the upload
    if model_dir is None:
        from krill.model.base import ensure_base_model

        model_dir = str(ensure_base_model())
    identity = unlock_identity(config)
    chain = connect_chain(config, identity.account)
    with open_configured_store(config) as store:
        created = create_run(chain, store, model_dir, name=name, num_shards=num_shards, overrides=overrides,
                             fund=fund, source=source)
    click.echo(json.dumps(created.to_json(), sort_keys=True) if as_json else created.run_id)


@coordinator.command("run")
@click.option("--shards", "shards", callback=lambda ctx, param, value: _shards(value),
              help="Shards to serve, e.g. 0,1 (default: coordinator.shards, else all).")
def run_cmd(shards: list[int] | None) -> None:
    """Index, validate, fold, publish, settle and slash until stopped (or coordinator.max_versions)."""
    from krill.coordinator.context import open_run_context
    from krill.coordinator.loop import FAULTS, Coordinator, LoopOptions
    from krill.coordinator.margin import check_margin, measure
    from krill.db.indexer import Indexer
    from krill.runtime import apply_cpu_settings

    config = current_config()
    section = config.coordinator
    apply_cpu_settings(section)
    delay = section.poll_interval_s
    stop = threading.Event()
    with contextlib.ExitStack() as stack:
        received = stack.enter_context(graceful_signals(stop))
        while True:
            try:
                ctx = open_run_context(config, stack, shards)
                break
            except FAULTS as exc:
                delay = min(delay * 2, section.max_backoff_s)
                click.echo(f"waiting {delay:.1f} s: {type(exc).__name__}: {exc}", err=True)
                if stop.wait(delay):
                    click.echo(f"stopped on {received[0]} before the run was opened")
                    return
        depth = config.chain.confirmations_on(ctx.chain_id, ctx.spec.chain.challenge_window_blocks)
        margin = measure(ctx.chain, window_blocks=ctx.spec.chain.challenge_window_blocks, confirmations=depth,
                         fetch_timeout_s=getattr(config.store, "timeout_s", 0.0),
                         poll_interval_s=section.poll_interval_s)
        check_margin(margin, section.allow_short_unbonding, echo=lambda line: click.echo(line, err=True))
        indexer = Indexer(ctx.chain, ctx.db, ctx.store, start_block=config.chain.deploy_block,
                          confirmations=depth, latest_logs=True, content_in_sync=False)
        options = LoopOptions(poll_interval_s=section.poll_interval_s, max_backoff_s=section.max_backoff_s,
                              eval_every=section.eval_every, max_versions=section.max_versions)
        click.echo(f"coordinating run {ctx.run_hex[:16]}… ({ctx.spec.name}, task {ctx.spec.task}, "
                   f"K={ctx.spec.version.contributions}, deadline {ctx.spec.version.deadline_s:g} s, "
                   f"shards {ctx.shards if ctx.shards is not None else 'all'}) as {ctx.chain.sender}")
        try:
            Coordinator(ctx, indexer, options, echo=lambda line: click.echo(line)).run(stop)
        except KeyboardInterrupt:
            click.echo("stopped")
            return
        if received:
            click.echo(f"stopped on {received[0]}: {_in_flight(ctx)}")


def _in_flight(ctx) -> str:
    """What a graceful stop leaves: the versions journalled and not yet published (a restart
    publishes them), or those published and not yet settled."""
    from krill.coordinator.journal import DecisionState, unfinished

    with ctx.db.session() as s:
        rows = [(r.version, r.state) for r in unfinished(s, ctx.run_hex)]
    pending = [v for v, state in rows if state in (DecisionState.DECIDED, DecisionState.STORED)]
    if pending:
        return (f"version(s) {', '.join(map(str, pending))} journalled, not published "
                "(a channel fault cut the last pass); `krill coordinator run` publishes them")
    unsettled = [v for v, _ in rows]
    return "every journalled version is published" + (
        f" (version(s) {', '.join(map(str, unsettled))} not settled yet; a restart settles them)" if unsettled else "")
