"""The exception hierarchy of Krill.

One root, `KrillError`, so callers can catch everything Krill raises deliberately. Subclasses
also derive from the closest built-in where that is natural (`ConfigError` is a `ValueError`),
as web3.py does, so generic handlers still work. Every message names what was wrong and, where
a person can act on it, what to do next. Contract reverts map one Python class per Solidity
custom error (see `krill.chain.errors`), carrying the revert's arguments.
"""

from __future__ import annotations


class KrillError(Exception):
    """Root of every error Krill raises on purpose."""


class ConfigError(KrillError, ValueError):
    """A configuration file, environment variable or flag is invalid."""


class KeystoreError(KrillError):
    """A keystore file is missing, unreadable or malformed."""


class WrongPasswordError(KeystoreError, ValueError):
    """The keystore password does not open the keystore."""


class ChainError(KrillError):
    """Talking to the chain failed."""


class ChainUnavailableError(ChainError, ConnectionError):
    """The JSON-RPC endpoint cannot be reached (after retries)."""


class ContractRevert(ChainError):
    """A contract call reverted. Subclasses are generated per Solidity custom error."""

    error_name: str = "Revert"

    def __init__(self, message: str, args: tuple = ()):
        super().__init__(message)
        self.revert_args = tuple(args)


class DevnetError(ChainError):
    """The local development chain could not be started, found or stopped."""


class StoreError(KrillError):
    """The content store failed or returned something unacceptable."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The content store cannot be reached."""


class ContentNotFoundError(StoreError, KeyError):
    """No content under the CID asked for."""

    def __str__(self) -> str:
        # KeyError's own str quotes its argument (repr): every command printed "error: '<cid> is not ...'".
        return Exception.__str__(self)


class IntegrityError(StoreError):
    """Content did not hash to the CID or digest that names it."""


class PayloadError(KrillError, ValueError):
    """An untrusted payload is malformed, oversized, inconsistent or forged.

    `field` names the part of the payload that failed, so the rejection can be recorded.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message if field is None else f"{field}: {message}")
        self.field = field


class ModelError(KrillError):
    """A model directory, manifest or shard is missing or inconsistent."""
