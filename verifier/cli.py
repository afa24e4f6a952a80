"""`krill verifier init|stake|run|status|unstake|withdraw|claim`: the verifier role's commands.

Design decisions:
- The commands read the effective configuration through the root command's --config/--set
  (`krill.commands.context.current_config`); `python -m krill.verifier` provides the same root
  options, so the role runs before (and without) its entry-point registration.
- `init`, `stake`, `unstake`, `withdraw` and `claim` are the core's role-neutral commands
  (`krill.commands.role_cmds`), the same as the worker's; amounts are in tokens for both roles.
- Heavy libraries (torch, web3, transformers) are imported inside the commands so that
  `krill --help` stays instant.
- `run` refuses to start unless this account is staked as a verifier with this keystore's
  Ed25519 key (selection is keyed by the staked key, so any other key would check the wrong
  commits), and says which command fixes it. Reaching the chain or store at start-up is
  retried with the same capped back-off as the loop itself. On a terminal a progress bar of
  attestations sits under the status lines (`krill.progress`).
- SIGTERM stops `run` as Ctrl-C does (`stop_on_signals`: KeyboardInterrupt, the loop's summary line,
  the state closed); it used to end the process where it stood. The first signal puts back the
  default actions, so a second one (`timeout -k`, a service manager's, another Ctrl-C) ends the
  process at once without a traceback: a second Ctrl-C landing in an interpreter exit hook printed
  `Exception ignored in atexit callback ... KeyboardInterrupt`.
"""

from __future__ import annotations

import time

import click

from krill.commands.role_cmds import add_common_commands
from krill.errors import ChainUnavailableError, ConfigError, StoreUnavailableError
from krill.runtime import stop_on_signals


@click.group("verifier")
def verifier() -> None:
    """Check a random sample of the workers' contributions and attest the verdicts on-chain."""


add_common_commands(verifier, "verifier")


def _connect(config, echo, prompt=None):
    """Identity, chain, store and run spec; start-up outages are retried with capped back-off."""
    from krill.protocol.state import load_run
    from krill.runtime import connect_chain, open_configured_store, run_id_of, unlock_identity

    identity = unlock_identity(config, prompt)
    run_id = run_id_of(config)
    delay = config.verifier.poll_interval_s
    while True:
        try:
            chain = connect_chain(config, identity.account)
            store = open_configured_store(config)
            return identity, chain, store, load_run(chain, store, run_id)
        except (ChainUnavailableError, StoreUnavailableError) as exc:
            echo(f"unreachable ({exc}); retrying in {delay:.2f}s")
            time.sleep(delay)
            delay = min(config.verifier.max_backoff_s, delay * 2)


def _require_stake(chain, identity) -> None:
    from krill.chain.types import Role
    from krill.staking import tokens

    info = chain.stake_of(identity.address)
    if info.role == int(Role.WORKER):
        raise ConfigError(f"account {identity.address} is staked as a worker; a verifier needs its own keystore "
                          "(`krill verifier init --keystore NEW_NAME`, then `krill verifier stake`)")
    if info.role != int(Role.VERIFIER):
        raise ConfigError(f"account {identity.address} is not staked as a verifier: run `krill verifier stake`")
    if not chain.is_eligible(identity.address, Role.VERIFIER):
        minimum = chain.minimum_stake(Role.VERIFIER)
        raise ConfigError(f"verifier {identity.address} holds {tokens(info.staked)} KRILL, under the verifier minimum "
                          f"of {tokens(minimum)} KRILL: top up with `krill verifier stake --amount "
                          f"{tokens(minimum - info.staked)}`")
    if info.ed25519_public_key != identity.ed25519_public_key:
        raise ConfigError(f"verifier {identity.address} staked Ed25519 key {info.ed25519_public_key.hex()}, not this "
                          "keystore's: use the keystore that staked it")


@verifier.command("run")
@click.option("--max-attestations", type=click.IntRange(min=1), default=None,
              help="Exit after sending this many attestations (default: run until stopped).")
def run(max_attestations: int | None) -> None:
    """Watch the run's commits, replay those selected for this verifier or failed by another, and attest."""
    from krill.commands.context import current_config
    from krill.progress import LineProgress

    with stop_on_signals():
        config = current_config()
        with LineProgress("attested", total=max_attestations) as bar:
            _run(config, bar, max_attestations)


def _run(config, bar, max_attestations: int | None) -> None:
    import torch

    from krill.commands.role_cmds import password_prompt
    from krill.config import DEVNET_CHAIN_IDS
    from krill.errors import ChainUnavailableError, StoreUnavailableError
    from krill.runtime import apply_cpu_settings, role_state_dir
    from krill.verifier.attest import Who
    from krill.verifier.loop import LoopSettings, VerifierLoop
    from krill.verifier.replay import RunDataUnavailable
    from krill.verifier.state import VerifierState

    apply_cpu_settings(config.verifier)
    state, first = None, 0

    def echo(line: str) -> None:
        bar.line(line)
        if state is not None:
            bar.update(state.counts()["attested"] - first)

    identity, chain, store, spec = _connect(config, echo, password_prompt())
    _require_stake(chain, identity)
    state = VerifierState.for_run(role_state_dir(config, "verifier", identity.address), contract=chain.address,
                                  run_id=spec.run_id, verifier=identity.address)
    chain_id = chain.w3.eth.chain_id
    who = Who(chain_id=chain_id, contract=chain.address, address=identity.address,
              key=identity.ed25519_public_key, engine=f"{spec.engine} (torch {torch.__version__}, cpu, float32)")
    settings = LoopSettings(poll_interval_s=config.verifier.poll_interval_s, max_backoff_s=config.verifier.max_backoff_s,
                            confirmations=config.chain.confirmations_on(chain_id,
                                                                        spec.chain.challenge_window_blocks),
                            devnet_mine_after_s=2.0 if chain_id in DEVNET_CHAIN_IDS else None)
    loop = VerifierLoop(chain, store, spec, state, who, settings, echo=echo, calibration=config.verifier.calibration)
    try:
        echo(f"ready to check: model, tokenizer and task loaded in {loop.replayer.warm_up():.1f}s")
    except (RunDataUnavailable, ChainUnavailableError, StoreUnavailableError) as exc:
        echo(f"not warmed up ({type(exc).__name__}: {exc}); the first check loads what it needs")
    counts = state.counts()
    first = counts["attested"]
    echo(f"verifier {identity.address} on run {spec.run_id.hex()[:16]}… (check probability "
         f"{spec.chain.check_probability_ppm / 10_000:g}%, window {spec.chain.challenge_window_blocks} blocks); "
         f"state {state.path} ({counts['attested']} attested, {counts['pending']} pending)")
    try:
        loop.run(max_attestations=max_attestations)
    except KeyboardInterrupt:
        echo("interrupted")
    finally:
        counts = state.counts()
        corroborated = (f"; {counts['corroborated']} corroborating another verifier's failing verdict"
                        if counts["corroborated"] else "")
        echo(f"verifier stopped: {counts['attested']} attested ({counts['passed']} passed, {counts['failed']} failed"
             f"{corroborated}), {counts['skipped']} not selected, {counts['missed']} missed, {counts['error']} errors, "
             f"{counts['pending']} pending")
        state.close()


@verifier.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (amounts as decimal token strings).")
def status(as_json: bool) -> None:
    """Stake, unbonding, attestations passed/failed (and not selected, missed), earned and claimable."""
    from krill.commands.context import current_config
    from krill.commands.role_cmds import emit_status
    from krill.verifier.status import verifier_status

    account, rows, extra, details = verifier_status(current_config())
    emit_status(account, rows, extra, as_json, details)
