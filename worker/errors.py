"""Errors of the worker role, under the core's `KrillError` root.

Each says what the person running the worker should do next (stake, wait, pick another key).
"""

from __future__ import annotations

from krill.errors import KrillError, ModelError


class WorkerError(KrillError):
    """The worker cannot go on."""


class NotStakedError(WorkerError):
    """The account is not an eligible worker (no stake, too little, or staked as another role)."""


class JailedError(WorkerError):
    """The account was slashed and jailed: the contract refuses its commits for good."""


class KeyMismatchError(WorkerError):
    """The account is staked with another Ed25519 key than the keystore's."""


class WorkerStateError(WorkerError):
    """The worker's persisted state is damaged or belongs to another run or account."""


class BrokenVersionError(ModelError):
    """A published version cannot be decoded (manifest, record, shards or masks): the worker skips it and
    works at the newest version before it that loads (nothing to do for the person running the worker)."""


class VersionNotPublishedError(KrillError):
    """The chain names no content for a version it said was published (an RPC node behind the one that said
    so, or a reorganisation that took the publication back): not broken, only not there yet; the worker
    works at the version before it this time and asks again next time."""
