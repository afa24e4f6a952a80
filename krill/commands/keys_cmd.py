"""`krill keys new|show|list`: manage this participant's encrypted keystores.

The password comes from, in order: --password-file, the configuration (`keystore.password`, e.g.
the KRILL_KEYSTORE__PASSWORD variable), an interactive prompt. Nothing secret is ever printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from krill.commands.context import current_config
from krill.errors import KeystoreError


def read_password(password_file: str | None, *, confirm: bool = False) -> str:
    """The keystore password from a file, the configuration, or a prompt."""
    if password_file:
        try:
            return Path(password_file).read_text(encoding="utf-8").rstrip("\n")
        except OSError as exc:
            raise KeystoreError(f"cannot read password file {password_file}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:  # it escaped as a traceback
            raise KeystoreError(f"password file {password_file} is not UTF-8 text ({exc.reason} at byte "
                                f"{exc.start})") from None
    secret = current_config().keystore.password
    if secret is not None:
        return secret.get_secret_value()
    return click.prompt("Keystore password", hide_input=True, confirmation_prompt=confirm)


def _info_dict(info) -> dict:
    return {"name": info.name, "address": info.address, "ed25519_public_key": info.ed25519_public_key,
            "path": str(info.path)}


@click.group()
def keys() -> None:
    """Create and inspect keystores (Ethereum account + Ed25519 signing key)."""


@keys.command("new")
@click.option("--name", required=True, help="Name of the keystore file in $KRILL_HOME/keys.")
@click.option("--password-file", type=click.Path(dir_okay=False), help="Read the password from this file.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="Keys directory (default $KRILL_HOME/keys).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def new(name: str, password_file: str | None, directory: str | None, as_json: bool) -> None:
    """Create a new keystore with fresh keys."""
    from krill.keystore import create_keystore

    password = read_password(password_file, confirm=True)
    info = create_keystore(name, password, directory=Path(directory) if directory else None)
    if as_json:
        click.echo(json.dumps(_info_dict(info)))
    else:
        click.echo(f"created {info.path}\n  address  {info.address}\n  ed25519  {info.ed25519_public_key}")


@keys.command("show")
@click.argument("name", required=False)
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="Keys directory (default $KRILL_HOME/keys).")
@click.option("--unlock", is_flag=True, help="Also check that the password opens the keystore.")
@click.option("--password-file", type=click.Path(dir_okay=False), help="Read the password from this file.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(name: str | None, directory: str | None, unlock: bool, password_file: str | None, as_json: bool) -> None:
    """Show the public keys of a keystore (NAME, a path, or the configured one)."""
    from krill.keystore import read_info, resolve_keystore
    from krill.keystore import unlock as do_unlock

    path = resolve_keystore(name or current_config().keystore.path, Path(directory) if directory else None)
    info = read_info(path)
    if unlock:
        do_unlock(path, read_password(password_file))
    data = _info_dict(info) | ({"unlocked": True} if unlock else {})
    if as_json:
        click.echo(json.dumps(data))
    else:
        for key, value in data.items():
            click.echo(f"{key:20} {value}")


@keys.command("list")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="Keys directory (default $KRILL_HOME/keys).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_(directory: str | None, as_json: bool) -> None:
    """List keystores in the keys directory."""
    from krill.keystore import keys_dir, list_keystores

    found = list_keystores(Path(directory) if directory else None)
    if as_json:
        click.echo(json.dumps([_info_dict(i) for i in found]))
        return
    if not found:
        click.echo(f"no keystores in {Path(directory) if directory else keys_dir()} (create one with `krill keys new`)")
    for info in found:
        click.echo(f"{info.name:20} {info.address}  ed25519 {info.ed25519_public_key[:16]}…  {info.path}")
