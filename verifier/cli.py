"""`krill verifier stake|run|status`: the verifier role's commands.

Design decisions:
- The commands read the effective configuration through the root command's --config/--set
  (`krill.commands.context.current_config`); `python -m krill.verifier` provides the same root
  options, so the role runs before (and without) its entry-point registration.
- Heavy libraries (torch, web3, transformers) are imported inside the commands so that
  `krill --help` stays instant.
- `run` refuses to start unless this account is staked as a verifier with this keystore's
  Ed25519 key (selection is keyed by the staked key, so any other key would check the wrong
  commits), and says which command fixes it. Reaching the chain or store at start-up is
  retried with the same capped back-off as the loop itself.
"""

from __future__ import annotations

import time
from decimal import Decimal, InvalidOperation

import click

from krill.errors import ChainUnavailableError, ConfigError, StoreUnavailableError


def _amount(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise click.BadParameter(f"{text!r} is not a number (token base units, e.g. 500e18)") from None
    if value <= 0 or value != value.to_integral_value():
        raise click.BadParameter(f"{text!r}: a positive whole number of token base units is needed")
    return int(value)


@click.group("verifier")
def verifier() -> None:
    """Check a random sample of the workers' contributions and attest the verdicts on-chain."""


@verifier.command("stake")
@click.option("--amount", "amount_text", metavar="BASE_UNITS",
              help="Tokens to stake, in base units (e.g. 500e18); default: verifier.stake.")
def stake(amount_text: str | None) -> None:
    """Approve and stake as a verifier, registering this keystore's Ed25519 key."""
    from krill.chain.events import Staked
    from krill.chain.types import Role
    from krill.commands.context import current_config
    from krill.runtime import connect_chain, unlock_identity

    config = current_config()
    amount = _amount(amount_text) or config.verifier.stake
    identity = unlock_identity(config)
    chain = connect_chain(config, identity.account)
    existing = chain.stake_of(identity.address)
    if existing.role not in (0, int(Role.VERIFIER)):
        raise ConfigError(f"account {identity.address} is staked as {Role(existing.role).name.lower()}; "
                          "a verifier needs its own account (`krill keys new`)")
    if existing.role and existing.ed25519_public_key != identity.ed25519_public_key:
        raise ConfigError(f"account {identity.address} registered Ed25519 key {existing.ed25519_public_key.hex()}, "
                          "not this keystore's; use the keystore that staked it")
    chain.approve_stake(amount)
    event = chain.stake(Role.VERIFIER, amount, identity.ed25519_public_key).event(Staked)
    click.echo(f"staked {amount} as verifier {identity.address} (total {event.staked}, "
               f"ed25519 {identity.ed25519_public_key.hex()[:16]}…)")


def _connect(config, echo):
    """Identity, chain, store and run spec; start-up outages are retried with capped back-off."""
    from krill.protocol.state import load_run
    from krill.runtime import connect_chain, open_configured_store, run_id_of, unlock_identity

    identity = unlock_identity(config)
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

    info = chain.stake_of(identity.address)
    if info.role != int(Role.VERIFIER):
        raise ConfigError(f"account {identity.address} is not staked as a verifier: run `krill verifier stake`")
    if not chain.is_eligible(identity.address, Role.VERIFIER):
        raise ConfigError(f"verifier {identity.address} holds {info.staked}, under the minimum of "
                          f"{chain.minimum_stake(Role.VERIFIER)}: top up with `krill verifier stake --amount ...`")
    if info.ed25519_public_key != identity.ed25519_public_key:
        raise ConfigError(f"verifier {identity.address} staked Ed25519 key {info.ed25519_public_key.hex()}, not this "
                          "keystore's: use the keystore that staked it")


@verifier.command("run")
@click.option("--max-attestations", type=click.IntRange(min=1), default=None,
              help="Exit after sending this many attestations (default: run until stopped).")
def run(max_attestations: int | None) -> None:
    """Watch the run's commits, replay those selected for this verifier, and attest."""
    import torch

    from krill.commands.context import current_config
    from krill.runtime import role_state_dir, set_threads
    from krill.verifier.attest import Who
    from krill.verifier.loop import DEVNET_CHAIN_IDS, LoopSettings, VerifierLoop
    from krill.verifier.state import VerifierState

    config = current_config()
    set_threads(config.verifier.threads)
    echo = click.echo
    identity, chain, store, spec = _connect(config, echo)
    _require_stake(chain, identity)
    state = VerifierState.for_run(role_state_dir(config, "verifier", identity.address), contract=chain.address,
                                  run_id=spec.run_id, verifier=identity.address)
    chain_id = chain.w3.eth.chain_id
    who = Who(chain_id=chain_id, contract=chain.address, address=identity.address,
              key=identity.ed25519_public_key, engine=f"{spec.engine} (torch {torch.__version__}, cpu, float32)")
    settings = LoopSettings(poll_interval_s=config.verifier.poll_interval_s, max_backoff_s=config.verifier.max_backoff_s,
                            confirmations=config.chain.confirmations,
                            devnet_mine_after_s=2.0 if chain_id in DEVNET_CHAIN_IDS else None)
    loop = VerifierLoop(chain, store, spec, state, who, settings, echo=echo, calibration=config.verifier.calibration)
    counts = state.counts()
    echo(f"verifier {identity.address} on run {spec.run_id.hex()[:16]}… (check probability "
         f"{spec.chain.check_probability_ppm / 10_000:g}%, window {spec.chain.challenge_window_blocks} blocks); "
         f"state {state.path} ({counts['attested']} attested, {counts['pending']} pending)")
    try:
        loop.run(max_attestations=max_attestations)
    except KeyboardInterrupt:
        echo("interrupted")
    finally:
        counts = state.counts()
        echo(f"verifier stopped: {counts['attested']} attested ({counts['passed']} passed, {counts['failed']} failed), "
             f"{counts['skipped']} not selected, {counts['missed']} missed, {counts['error']} errors, "
             f"{counts['pending']} pending")
        state.close()


@verifier.command("status")
def status() -> None:
    """This verifier's decisions so far on the configured run (from its state file)."""
    from krill.commands.context import current_config
    from krill.runtime import role_state_dir, run_id_of, unlock_identity
    from krill.verifier.state import VerifierState

    config = current_config()
    identity = unlock_identity(config)
    if not config.chain.protocol_address:
        raise ConfigError("chain.protocol_address is not set: run `krill devnet up` or set it in the config")
    state = VerifierState.for_run(role_state_dir(config, "verifier", identity.address),
                                  contract=config.chain.protocol_address,
                                  run_id=run_id_of(config), verifier=identity.address)
    counts = state.counts()
    click.echo(" ".join(f"{k}={v}" for k, v in counts.items()) + f"  cursor={state.cursor()}")
    state.close()
