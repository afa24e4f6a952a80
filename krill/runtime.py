"""What every long-running role needs from its configuration: identity, chain, store, database, run.

Design decisions:
- One place turns a `KrillConfig` into live objects, so every role fails the same way with the
  same advice: no keystore -> `krill keys new`; wrong password -> say so; no contract address ->
  `krill devnet up` or set chain.protocol_address; no run id -> set run.id; chain unreachable ->
  name the URL; no contract at the address -> say so at connect (one `eth_getCode`), before a
  call decodes the empty answer as a traceback or `krill index sync` indexes an empty address.
- Each role's writes follow its own `chain.*` send settings (`send_policy_of`: receipt timeout, when
  and how far a pending write's fees are raised), since a coordinator that must publish in time and a
  worker on a small stake price their gas differently; every client of the role shares them.
- A database that cannot be opened (server down, wrong password, no such driver, a SQLite folder
  that cannot be made, a SQLite file that is not a database) is one `DatabaseError` line naming the
  URL with its password hidden (`database_errors`), for every command that opens one, as the
  explorer already did.
- An index of another schema version is refused with "run `krill index rebuild`"; that command opens
  the database with `rebuilding_index`, which resets such index tables before the version check,
  so the advice is not a dead end. Role state of another version is still refused, untouched.
- The password comes from the configuration (KRILL_KEYSTORE__PASSWORD) or, interactively, a prompt
  that the CLI layer supplies; long-running roles never prompt on their own.
- Heavy imports (web3, torch) happen inside the functions.
- SIGTERM stops a worker or verifier as Ctrl-C does (`stop_on_signals`): the first signal raises
  KeyboardInterrupt and restores the default actions, so a second one ends the process at once
  without a traceback from an exit hook. The coordinator has its own graceful stop (it finishes the
  version under way), so it does not use this.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

from krill.config import ChainConfig, KrillConfig, krill_home
from krill.errors import ChainUnavailableError, ConfigError, KeystoreError, WrongPasswordError


def unlock_identity(config: KrillConfig, prompt: Callable[[], str] | None = None):
    """The participant's `krill.keystore.Identity`, unlocked with the configured password."""
    from krill.keystore import resolve_keystore, unlock

    path = resolve_keystore(config.keystore.path)
    if config.keystore.password is not None:
        password, source = config.keystore.password.get_secret_value(), "KRILL_KEYSTORE__PASSWORD / keystore.password"
    elif prompt is not None:
        password, source = prompt(), "the password typed"
    else:
        raise KeystoreError(f"no password for keystore {path}: set KRILL_KEYSTORE__PASSWORD or keystore.password")
    try:
        return unlock(path, password)
    except WrongPasswordError:
        raise WrongPasswordError(f"wrong password for keystore {path} (from {source}): use the password the keystore "
                                 "was made with, or point keystore.path at another keystore; "
                                 "`krill keys show --unlock` tries a password") from None


def send_policy_of(chain: ChainConfig):
    """The `SendPolicy` a role's `chain.*` settings give its writes (receipt timeout, fee replacements)."""
    from krill.chain.tx import FeeBumpPolicy, SendPolicy

    cap_wei = None if chain.fee_bump_cap_gwei is None else int(Decimal(repr(chain.fee_bump_cap_gwei)) * 10**9)
    return SendPolicy(receipt_timeout_s=chain.receipt_timeout_s,
                      bump=FeeBumpPolicy(after_s=chain.fee_bump_after_s, cap_factor=chain.fee_bump_cap_factor,
                                         cap_wei=cap_wei))


def connect_chain(config: KrillConfig, account=None, *, address_from: str = "chain.protocol_address"):
    """A `KrillChain` client for the configured protocol, acting as `account` (None: read-only).

    `address_from` names where the protocol address came from, for the error when no contract is there."""
    from krill.chain.client import KrillChain
    from krill.chain.rpc import RetryPolicy, connect_http, with_retries

    if not config.chain.protocol_address:
        raise ConfigError("chain.protocol_address is not set: run `krill devnet up` or set it in the config")
    w3 = connect_http(config.chain.rpc_url, timeout_s=config.chain.request_timeout_s)
    retry = RetryPolicy(attempts=config.chain.retries + 1)
    try:
        # The first contact is retried as every later read is: one reset connection on a lossy link made it
        # "unreachable", which stopped `krill worker stake` and `krill coordinator run`.
        chain_id = with_retries(lambda: w3.eth.chain_id, "eth_chainId", retry, config.chain.rpc_url)
    except Exception as exc:  # noqa: BLE001 - any transport failure means the same thing to the user
        raise ChainUnavailableError(f"chain at {config.chain.rpc_url} is unreachable ({type(exc).__name__}): "
                                    "is the node running? (`krill devnet status`)") from None
    if config.chain.chain_id is not None and chain_id != config.chain.chain_id:
        raise ConfigError(f"chain at {config.chain.rpc_url} has chain id {chain_id}, the config expects "
                          f"{config.chain.chain_id}")
    try:
        code = with_retries(lambda: w3.eth.get_code(w3.to_checksum_address(config.chain.protocol_address)),
                            "eth_getCode", retry, config.chain.rpc_url)
    except Exception as exc:  # noqa: BLE001 - as for the chain id above
        raise ChainUnavailableError(f"chain at {config.chain.rpc_url} is unreachable ({type(exc).__name__}): "
                                    "is the node running? (`krill devnet status`)") from None
    if not code:
        raise ConfigError(f"no contract at {address_from} {config.chain.protocol_address} on the chain at "
                          f"{config.chain.rpc_url} (chain id {chain_id}): check {address_from} (the KrillProtocol "
                          "address the run's operator published; a fresh `krill devnet up` writes it to its config) "
                          "and that the chain is the run's")
    return KrillChain(w3, config.chain.protocol_address, account, retry, send_policy_of(config.chain))


def open_configured_store(config: KrillConfig):
    from krill.store.base import open_store

    return open_store(config.store)


@contextlib.contextmanager
def database_errors(url: str, setting: str = "database.url", what: str = "the database") -> Iterator[None]:
    """Within the block, a failure to open the database at `url` becomes one `DatabaseError` line that names
    the URL with its password hidden (and cut out of the driver's reason, should it echo it)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, InterfaceError, NoSuchModuleError, OperationalError
    from sqlalchemy.exc import DatabaseError as DriverDatabaseError

    from krill.db.errors import DatabaseError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DatabaseError(f"{setting} is not a database URL: give e.g. sqlite:///path/krill.db or "
                            "postgresql+psycopg://user@host/db") from None
    shown = parsed.render_as_string(hide_password=True)

    def hidden(text: str) -> str:
        return text.replace(str(parsed.password), "***") if parsed.password else text

    try:
        yield
    except (NoSuchModuleError, ModuleNotFoundError) as exc:
        raise DatabaseError(f"cannot open {what} {shown}: no driver {parsed.drivername!r} here "
                            f"({hidden(str(exc))}); check {setting}: sqlite:///path.db or "
                            "postgresql+psycopg://user@host/db") from None
    except (OperationalError, InterfaceError) as exc:
        lines = str(exc.orig if exc.orig is not None else exc).strip().splitlines()
        reason = hidden(lines[0] if lines else type(exc).__name__)
        advice = (": it must name a database file (not a folder) in a writable folder, on a disk with room"
                  if parsed.get_backend_name() == "sqlite" else " and that its server is running")
        raise DatabaseError(f"cannot open {what} {shown}: {reason}; check {setting}{advice}") from None
    except DriverDatabaseError as exc:
        # SQLite: the URL names a file that is not a database, or a damaged one. It is left as it is.
        if getattr(exc.orig, "sqlite_errorcode", 0) & 0xFF not in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            raise
        raise DatabaseError(f"cannot open {what} {shown}: {hidden(str(exc.orig))}; check {setting}: it names a "
                            "file that is not a SQLite database, or a damaged one (left untouched)") from None
    except OSError as exc:  # SQLite: the database's folder cannot be made
        raise DatabaseError(f"cannot open {what} {shown}: {exc.strerror or exc}"
                            f"{f' ({exc.filename})' if exc.filename else ''}; check {setting}") from None


def open_configured_database(config: KrillConfig, *, rebuilding_index: bool = False):
    """The configured database, its tables created and schema versions checked. `rebuilding_index` (for
    `krill index rebuild`, which the index's `SchemaVersionError` names as the remedy) first resets index
    tables of another schema version, so the command that error advises can open the database at all."""
    from krill.db.session import open_database

    Path(krill_home()).mkdir(parents=True, exist_ok=True)
    with database_errors(config.database.url):
        if not rebuilding_index:
            return open_database(config.database.url)
        db = open_database(config.database.url, create=False)
        try:
            _reset_index_of_another_version(db)
            db.create_all()
        except BaseException:
            db.close()
            raise
        return db


def _reset_index_of_another_version(db) -> None:
    """Reset the index tables when their recorded schema version is not this Krill's. Nothing else is
    touched, and role state of another version is refused (`SchemaVersionError`) before anything is."""
    from sqlalchemy import select

    from krill.db.errors import SchemaVersionError
    from krill.db.models import SchemaVersion
    from krill.db.session import SCHEMA_VERSIONS

    if SchemaVersion.__tablename__ not in db.table_names():
        return  # a new database: create_all makes every table
    with db.session() as session:
        found = {row.component: row.version for row in session.scalars(select(SchemaVersion))}
    if found.get("state", SCHEMA_VERSIONS["state"]) != SCHEMA_VERSIONS["state"]:
        # create_all checks the index first, and would advise the rebuild under way
        raise SchemaVersionError(f"the state tables of {db.engine.url.render_as_string(hide_password=True)} have "
                                 f"schema version {found['state']}; this Krill uses {SCHEMA_VERSIONS['state']}: "
                                 "use a new database (role state is never migrated silently)")
    if found.get("index", SCHEMA_VERSIONS["index"]) != SCHEMA_VERSIONS["index"]:
        db.reset_index()


def run_id_of(config: KrillConfig) -> bytes:
    """The configured on-chain run id as 32 bytes."""
    if config.run.id is None:
        raise ConfigError("run.id is not set: pass --set run.id=<64 hex digits> (printed by "
                          "`krill coordinator create-run`)")
    return bytes.fromhex(config.run.id.removeprefix("0x"))


def role_state_dir(config: KrillConfig, role: str, address: str) -> Path:
    """Private working state of one role instance (mode 0700)."""
    section = getattr(config, role)
    path = section.state_dir or (krill_home() / role / address.lower())
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def apply_cpu_settings(section) -> None:
    """A role section's CPU settings, at the role's start: torch threads (`threads`), then priority (`nice`)."""
    set_threads(section.threads)
    lower_priority(section.nice)


def lower_priority(nice: int) -> None:
    """Lower this process's CPU priority by `nice` (a role section's `nice`); a no-op at 0 or where the
    platform has no `os.nice`."""
    if nice > 0 and hasattr(os, "nice"):
        os.nice(nice)


_HEAP_FROZEN = False


def freeze_heap() -> None:
    """Collect once, then exempt every object alive now (modules, model, tokenizer) from future collections.

    A role with torch, transformers and web3 loaded holds about 430,000 objects; a full collection
    scanned them all (about 170 ms on the demo machine) and landed in whichever phase was running.
    Frozen, they are never scanned again; objects made later are collected as usual. Call once the
    role has started up (its model and clients loaded). In 1.5-minute demo runs the worker's protocol
    overhead was the same with and without it (7.0% and 6.9%): full collections are rare there; the
    freeze bounds their cost where they are not. Once per process: a process that runs roles in turn
    (the tests) would otherwise keep freezing whatever earlier ones left behind."""
    import gc

    global _HEAP_FROZEN
    if _HEAP_FROZEN:
        return
    _HEAP_FROZEN = True
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def stop_on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """Within the block, the first of `signums` raises KeyboardInterrupt (as Ctrl-C does), and puts back
    every one's default action, so a second signal ends the process at once, wherever it is, without a
    traceback; the previous handlers come back on leaving only if no signal came. Main thread only."""
    previous = {signum: signal.getsignal(signum) for signum in signums}
    fired: list[int] = []

    def interrupt(signum: int, frame) -> None:
        fired.append(signum)
        for s in signums:
            signal.signal(s, signal.SIG_DFL)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in signums:
        signal.signal(signum, interrupt)
    try:
        yield
    finally:
        if not fired:
            for signum, old in previous.items():
                signal.signal(signum, signal.SIG_DFL if old is None else old)
