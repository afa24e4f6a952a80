"""The commands every staking role has: `init`, `stake`, `unstake`, `withdraw`, `claim`, and status output.

Design decisions:
- Built by factories that take the role's name, so `krill worker ...` and `krill verifier ...`
  offer the same options and the same messages, and each role's CLI only adds them to its group
  (`add_common_commands`). The core stays role-free: it is the roles that import this module.
- The work lives in `krill.staking`, `krill.role_init` and `krill.account_status`; these commands
  read options, ask for the password when a person is at a terminal, and print. Failures are
  `KrillError`s, shown by the root command as one `error: ...` line with exit status 1.
- The keystore password: --password-file, else KRILL_KEYSTORE__PASSWORD (keystore.password), else a
  prompt when stdin is a terminal; never echoed, never written to a file.
- `init --out` is checked when the options are read (`output_file`): a path through a file failed at the
  end, with a traceback, after the keystore was made and funded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from krill.commands.context import current_config, output_file


def password_prompt():
    """A prompt for the keystore password when a person can answer it, else None."""
    if not sys.stdin.isatty():
        return None
    return lambda: click.prompt("Keystore password", hide_input=True)


def _read_password(password_file: str | None, confirm: bool) -> str:
    from krill.errors import KeystoreError

    if password_file:
        try:
            return Path(password_file).read_text(encoding="utf-8").rstrip("\n")
        except OSError as exc:
            raise KeystoreError(f"cannot read password file {password_file}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:  # it escaped as a traceback
            raise KeystoreError(f"password file {password_file} is not UTF-8 text ({exc.reason} at byte "
                                f"{exc.start})") from None
    # The configuration's, as for every other command: KRILL_KEYSTORE__PASSWORD, `--set keystore.password=...`
    # or the config file's (reading the variable alone ignored the other two).
    secret = current_config().keystore.password
    if secret is not None and secret.get_secret_value():
        return secret.get_secret_value()
    if not sys.stdin.isatty():
        raise KeystoreError("no keystore password: set KRILL_KEYSTORE__PASSWORD or pass --password-file")
    return click.prompt("Keystore password", hide_input=True, confirmation_prompt=confirm)


def _amount(text: str | None) -> int | None:
    from krill.staking import parse_tokens

    return None if text is None else parse_tokens(text)


def init_command(role: str) -> click.Command:
    @click.command("init")
    @click.option("--devnet", is_flag=True, help="Use the devnet `krill devnet up` started (chain, contract, store).")
    @click.option("--rpc-url", help="EVM JSON-RPC endpoint of the run's chain (instead of --devnet).")
    @click.option("--protocol", metavar="0xADDRESS", help="KrillProtocol contract address (with --rpc-url).")
    @click.option("--store", metavar="PATH|URL", help="Content store: a local directory, or a Kubo RPC URL "
                  "(default: $KRILL_HOME/store).")
    @click.option("--run-id", metavar="HEX", help="The run to join (default: the chain's only run, if it has one).")
    @click.option("--keystore", metavar="NAME|PATH", help=f"Keystore to create, or to reuse if it exists "
                  f"(default: '{role}' in $KRILL_HOME/keys).")
    @click.option("--password-file", type=click.Path(dir_okay=False), help="Read the keystore password from a file.")
    @click.option("--out", type=click.Path(dir_okay=False), callback=output_file, help=f"Config file to write "
                  f"(default: $KRILL_HOME/{role}.toml).")
    @click.option("--force", is_flag=True, help="Replace an existing config file (keys are never overwritten).")
    @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
    def init(devnet, rpc_url, protocol, store, run_id, keystore, password_file, out, force, as_json) -> None:
        from krill.config import krill_home
        from krill.role_init import init_role, keystore_path

        path, exists = keystore_path(keystore, role)
        out_path = Path(out).expanduser().resolve() if out else krill_home() / f"{role}.toml"
        if out_path.exists() and not force:
            from krill.errors import ConfigError

            raise ConfigError(f"{out_path} already exists: pass --force to replace it, or --out to write elsewhere")
        password = _read_password(password_file, confirm=not exists)
        result = init_role(role, out=out_path, keystore=path, password=password, devnet=devnet, rpc_url=rpc_url,
                           protocol=protocol, store=store, run_id=run_id, force=force)
        if as_json:
            click.echo(json.dumps({"config": str(result.config_path), "keystore": str(result.keystore_path),
                                   "created_keystore": result.created_keystore, "address": result.address,
                                   "ed25519_public_key": result.ed25519_public_key, "rpc_url": result.rpc_url,
                                   "run_id": result.run_id, "funded": result.funded,
                                   "next_steps": result.next_steps()}))
            return
        made = "created" if result.created_keystore else "reusing"
        click.echo(f"{made} keystore {result.keystore_path}\n  address  {result.address}\n"
                   f"  ed25519  {result.ed25519_public_key}")
        if result.funded:
            click.echo(f"funded on the devnet: {', '.join(result.funded)}")
        click.echo(f"wrote {result.config_path} (chain {result.rpc_url}, run "
                   f"{result.run_id[:16] + '…' if result.run_id else 'not set'})")
        click.echo("next:")
        for step in result.next_steps():
            click.echo(f"  {step}")

    init.help = (f"Create (or reuse) a keystore and write a {role} config for a devnet or a given chain, "
                 "checking the chain, run and store first.")
    return init


def stake_command(role: str) -> click.Command:
    @click.command("stake")
    @click.option("--amount", metavar="TOKENS", help=f"Tokens to stake, e.g. 500 or 12.5 (default: {role}.stake).")
    def stake(amount: str | None) -> None:
        from krill.staking import stake as do_stake
        from krill.staking import tokens

        done = do_stake(current_config(), role, _amount(amount), password_prompt())
        click.echo(f"staked {tokens(done.amount)} KRILL as {role} {done.address} (total {tokens(done.staked)}; "
                   f"ed25519 {done.ed25519_public_key[:16]}…; tx {done.transaction_hash})")

    stake.help = f"Approve and stake tokens as a {role}, bound to this keystore's Ed25519 key (tops up if staked)."
    return stake


def unstake_command(role: str) -> click.Command:
    @click.command("unstake")
    @click.option("--amount", metavar="TOKENS", help="Tokens to unbond (default: everything staked).")
    def unstake(amount: str | None) -> None:
        from krill.staking import tokens
        from krill.staking import unstake as do_unstake

        done = do_unstake(current_config(), role, _amount(amount), password_prompt())
        click.echo(f"unbonding {tokens(done.amount)} KRILL of {done.address} (now {tokens(done.unbonding)} unbonding, "
                   f"{tokens(done.staked)} staked); withdraw from block {done.release_block} with "
                   f"`krill {role} withdraw` (tx {done.transaction_hash})")

    unstake.help = (f"Start unbonding stake; `krill {role} withdraw` pays it out after the unbonding period, "
                    "counted from the close of the challenge window of your latest commit if that is later (a "
                    "commit while unbonding moves it again); slashes still reach it until then.")
    return unstake


def withdraw_command(role: str) -> click.Command:
    @click.command("withdraw")
    def withdraw() -> None:
        from krill.staking import tokens
        from krill.staking import withdraw as do_withdraw

        done = do_withdraw(current_config(), role, password_prompt())
        click.echo(f"withdrew {tokens(done.amount)} KRILL to {done.address} (tx {done.transaction_hash})")

    withdraw.help = "Pay out the unbonded stake once its release block is reached (says how many blocks remain)."
    return withdraw


def claim_command(role: str) -> click.Command:
    @click.command("claim")
    def claim() -> None:
        from krill.staking import claim as do_claim
        from krill.staking import tokens

        done = do_claim(current_config(), role, password_prompt())
        click.echo(f"claimed {tokens(done.amount)} KRILL to {done.address} (tx {done.transaction_hash})")

    claim.help = "Pay this account its credited rewards and bounties."
    return claim


def add_common_commands(group: click.Group, role: str) -> None:
    """Add init, stake, unstake, withdraw and claim of `role` to its command group."""
    for factory in (init_command, stake_command, unstake_command, withdraw_command, claim_command):
        group.add_command(factory(role))


def emit_status(status, rows: list[tuple[str, str]], extra: dict, as_json: bool, details: list[str] = ()) -> None:
    """Print an `AccountStatus` plus the role's own rows: a table, or one JSON object with `extra` merged in."""
    from krill.account_status import render

    if as_json:
        click.echo(json.dumps(status.to_json() | extra, sort_keys=True))
        return
    table = render(status) + rows
    width = max(len(k) for k, _ in table)
    click.echo(f"{status.role} status")
    for key, value in table:
        click.echo(f"  {key:<{width}}  {value}")
    for line in details:
        click.echo(f"  {line}")
    for hint in status.hints:
        click.echo(f"next: {hint}")
