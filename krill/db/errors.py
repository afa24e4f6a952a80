"""Errors of the database layer (subclasses of `KrillError`)."""

from __future__ import annotations

from krill.errors import KrillError


class DatabaseError(KrillError):
    """The Krill database cannot be used as asked."""


class DatabaseValueError(DatabaseError, ValueError):
    """A value does not fit its column (wrong spelling or range); the message names the field."""


class DatabaseFullError(DatabaseError):
    """A write the disk refused (no space left, an I/O error); the message names the database."""


class SchemaVersionError(DatabaseError):
    """The database was written by another version of Krill's schema."""


class IndexMismatchError(DatabaseError):
    """The index in this database belongs to another chain or contract than the one asked for."""
