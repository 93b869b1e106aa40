"""Exceptions raised by the db package.

Two families: bad input from the caller (a ValueError, nothing is written), and a database
that cannot be used at all (a StorageError, nothing is touched).
"""

from __future__ import annotations

from collections.abc import Iterable


class InvalidInputError(ValueError):
    """A caller passed a value the database does not accept; nothing was written."""


class UnknownRunError(InvalidInputError, LookupError):
    """The run id does not exist in this database."""


class UnknownGpuError(InvalidInputError, LookupError):
    """No GPU with this name or UUID is recorded in this database."""


class StorageError(RuntimeError):
    """The database at this URL cannot be used; it was left exactly as found."""


class NotADatabaseError(StorageError):
    """The file at the URL exists but is not a SQLite database."""


class SchemaTooNewError(StorageError):
    """The schema was written by a newer gemmtune than this one (unknown Alembic revision)."""


def bad_value(what: str, value: object, allowed: Iterable[object] | str) -> InvalidInputError:
    """An InvalidInputError naming the bad value and what would have been accepted."""
    if not isinstance(allowed, str):
        allowed = ", ".join(repr(a) for a in allowed)
    return InvalidInputError(f"invalid {what} {value!r}; allowed: {allowed}")
