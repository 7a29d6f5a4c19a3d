"""The alkstore error hierarchy (docs/contract.md §2 "Errors").

Every error alkstore raises derives from :class:`AlkstoreError`.  Engines
wrap driver exceptions in :class:`EngineError` with the driver's exception
kept as ``__cause__``, so no driver exception crosses the contract (the
habit of SQLAlchemy's ``DBAPIError`` and procrastinate's
``ConnectorException``).
"""

from __future__ import annotations

__all__ = [
    "AlkstoreError",
    "EngineError",
    "SchemaVersionError",
    "StoreClosedError",
    "UnknownEngineError",
    "ValidationError",
]


class AlkstoreError(Exception):
    """Root of every error alkstore raises."""


class ValidationError(AlkstoreError, ValueError):
    """Bad input, refused before any I/O; nothing was written (docs/contract.md §3
    "Validation")."""


class StoreClosedError(AlkstoreError):
    """The store (or subscription) was closed (docs/contract.md §3 "Closed store")."""


class UnknownEngineError(AlkstoreError):
    """No installed engine serves the URL's scheme (docs/contract.md §1)."""


class SchemaVersionError(AlkstoreError):
    """The database schema is missing (with ``migrate=False``) or newer than
    this code understands (docs/contract.md §3 "Schema").

    Parameters
    ----------
    message
        What is wrong and the way out, for people.
    found
        The schema version stored in the database, ``None`` when there is
        no schema.
    expected
        The version this code reads and writes; ``None`` (with ``found``
        ``None`` too) when the engine that raised did not say.

    Attributes
    ----------
    found, expected
        As the parameters.
    """

    def __init__(
        self, message: str = "", *, found: int | None = None, expected: int | None = None
    ) -> None:
        super().__init__(message)
        self.found = found
        self.expected = expected


class EngineError(AlkstoreError):
    """The database driver failed; the driver's exception is ``__cause__``.

    Parameters
    ----------
    message
        What failed, for people.
    permanent
        ``True`` when the engine knows that trying again cannot succeed
        until someone steps in: the database file is read-only, missing or
        was replaced, the role lacks a privilege, the schema was dropped.
        ``False`` (the default, and what an engine that cannot tell
        raises) means the failure may pass: a held lock, a lost connection,
        a server restarting. The worker runtime retries writes on the jobs
        it holds and its claims after a non-permanent error, and stops,
        exiting non-zero, on a permanent one (docs/tasks-and-workers.md
        "Outcomes").

    Attributes
    ----------
    permanent
        As the parameter.
    """

    def __init__(self, message: str = "", *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
