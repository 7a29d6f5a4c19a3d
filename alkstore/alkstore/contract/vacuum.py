"""An optional engine capability: what keeps dead row versions in a
store's tables (docs/operations.md "Long transactions").

An engine whose database keeps old row versions until no transaction can
see them (PostgreSQL's MVCC) implements :class:`VacuumReporting`; the core
(``alkstore bloat``) checks for it with ``isinstance`` and says there is
nothing to report for engines without it (SQLite rewrites rows in place).
It is not part of the :class:`~alkstore.Store` ABC: no engine must
implement it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

__all__ = ["HorizonHolder", "TableVacuum", "VacuumReport", "VacuumReporting"]


@dataclass(frozen=True)
class TableVacuum:
    """One of the store's tables as the server's statistics see it.

    ``live_rows`` and ``dead_rows`` are the server's estimates (row
    versions); the instants are UTC, ``None`` when it never happened.
    """

    table: str
    live_rows: int
    dead_rows: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None


@dataclass(frozen=True)
class HorizonHolder:
    """Something that keeps vacuum from removing row versions.

    ``kind`` is ``"session"`` (a connection inside a transaction or a
    long statement; ``ident`` is its process id), ``"replication slot"``
    (``ident`` its name) or ``"prepared transaction"`` (``ident`` its
    global id). ``age`` is in transactions: how many have begun since the
    oldest one it may still see. ``held_s`` is the seconds since its
    transaction began (the slot's: ``None``). ``state``, ``query_start``,
    ``application_name`` and ``query`` are the session's, ``None`` for the
    other kinds (``query`` is cut to 200 characters).
    """

    kind: str
    ident: str
    age: int
    held_s: float | None
    xact_start: datetime | None
    state: str | None
    query_start: datetime | None
    application_name: str | None
    query: str | None


@dataclass(frozen=True)
class VacuumReport:
    """The store's tables (by name) and what holds the horizon, oldest
    first (at most five)."""

    tables: tuple[TableVacuum, ...]
    holders: tuple[HorizonHolder, ...]


@runtime_checkable
class VacuumReporting(Protocol):
    """A store that can say what keeps dead row versions in its tables."""

    def vacuum_report(self) -> VacuumReport:
        """The report (one read of the server's statistics).

        Raises
        ------
        EngineError
            If the database fails.
        """
        ...
