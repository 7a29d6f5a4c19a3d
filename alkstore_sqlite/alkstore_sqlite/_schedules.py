"""Schedules in SQLite (docs/schedules.md): the rows of
``_alkstore_schedules`` and the guard that fires each boundary once.

A schedule is stored as the core's flat columns
(:data:`alkstore.contract.schedule.SCHEDULE_COLUMNS`, which are also the column
names), instants as microseconds since the epoch like every other instant
of the engine (:mod:`alkstore_sqlite._rows`).

Firing is a compare-and-set on ``(revision, next_run_at)`` inside one
``BEGIN IMMEDIATE`` transaction: SQLite's write lock serialises the ticks of
every process, so of several ticks that read the same schedule the first to
write moves ``next_run_at`` and inserts the job, and the others find the
guard false and write nothing. A replaced schedule has a new revision, so a
tick that read the old one fires nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from alkstore.engine import (
    SCHEDULE_COLUMNS,
    EncodedPayload,
    Resolved,
    Schedule,
    UnreadableSchedule,
    read_schedule,
    schedule_from_values,
    schedule_to_values,
)
from alkstore_sqlite._connection import fetchall, rowcount
from alkstore_sqlite._queue import insert_one, job_row
from alkstore_sqlite._rows import from_us, to_us
from alkstore_sqlite._wake import notify

if TYPE_CHECKING:
    from alkstore_sqlite._store import SqliteStore

__all__ = [
    "LIST_DUE",
    "delete_schedule",
    "fire_schedule",
    "list_schedules",
    "put_schedule",
    "skip_schedule",
]

#: The columns that hold instants.
_INSTANTS = frozenset({"created_at", "next_run_at", "last_run_at"})

_COLUMNS = ", ".join(SCHEDULE_COLUMNS)
# A replacement takes every column from the new schedule but the name and
# the revision, which counts up from the stored one.
_REPLACED = ", ".join(
    f"{column} = excluded.{column}"
    for column in SCHEDULE_COLUMNS
    if column not in ("name", "revision")
)
_PUT = f"""
    INSERT INTO _alkstore_schedules ({_COLUMNS})
    VALUES ({", ".join(f":{column}" for column in SCHEDULE_COLUMNS)})
    ON CONFLICT (name) DO UPDATE SET
        {_REPLACED},
        revision = _alkstore_schedules.revision + 1
    RETURNING {_COLUMNS}
"""
_DELETE = "DELETE FROM _alkstore_schedules WHERE name = ?"
_LIST_ALL = f"SELECT {_COLUMNS} FROM _alkstore_schedules ORDER BY name"
#: A range of the (next_run_at, name) index, in its order.
LIST_DUE = f"""
    SELECT {_COLUMNS} FROM _alkstore_schedules
    WHERE next_run_at <= ? ORDER BY next_run_at, name
"""
#: The exactly-once guard: the schedule as the tick read it.
_GUARD = "name = :name AND revision = :revision AND next_run_at = :expected"
_ADVANCE = f"""
    UPDATE _alkstore_schedules SET next_run_at = :next_run_at, last_run_at = :boundary
    WHERE {_GUARD}
"""
_SKIP = f"UPDATE _alkstore_schedules SET next_run_at = :next_run_at WHERE {_GUARD}"
_SET_LAST_JOB = "UPDATE _alkstore_schedules SET last_job_id = :job_id WHERE name = :name"


def _to_row(schedule: Schedule, revision: int) -> dict[str, Any]:
    row = dict(zip(SCHEDULE_COLUMNS, schedule_to_values(schedule), strict=True))
    for column in _INSTANTS:
        instant = row[column]
        row[column] = None if instant is None else to_us(instant)
    row["revision"] = revision
    return row


def _values(row: Sequence[Any]) -> list[Any]:
    """A stored row as the core's column values (instants as datetimes)."""
    return [
        from_us(value) if column in _INSTANTS and value is not None else value
        for column, value in zip(SCHEDULE_COLUMNS, row, strict=True)
    ]


def put_schedule(store: SqliteStore, schedule: Schedule) -> Schedule:
    """``Store._put_schedule``: insert at revision 1 or replace (revision +
    1), one statement; return the stored row."""
    # fetchall: the statement runs to its end, which commits it.
    (row,) = store._pool.run(fetchall, _PUT, _to_row(schedule, revision=1))
    return schedule_from_values(_values(row))


def delete_schedule(store: SqliteStore, name: str) -> bool:
    """``Store._delete_schedule``."""
    return store._pool.run(rowcount, _DELETE, (name,)) == 1


def list_schedules(
    store: SqliteStore, due_at: datetime | None
) -> list[Schedule | UnreadableSchedule]:
    """``Store._list_schedules``: all by name, or the due ones by
    ``next_run_at`` then name; a row this version cannot read as an
    :class:`UnreadableSchedule`."""
    if due_at is None:
        rows = store._pool.run(fetchall, _LIST_ALL, ())
    else:
        rows = store._pool.run(fetchall, LIST_DUE, (to_us(due_at),))
    return [read_schedule(_values(row)) for row in rows]


def _guard(schedule: Schedule, next_run_at: datetime) -> dict[str, Any]:
    """The guard's parameters: the schedule as the tick read it, and its new
    ``next_run_at``."""
    return {
        "name": schedule.name,
        "revision": schedule.revision,
        "expected": to_us(schedule.next_run_at),
        "next_run_at": to_us(next_run_at),
    }


def fire_schedule(
    store: SqliteStore,
    schedule: Schedule,
    *,
    boundary: datetime,
    next_run_at: datetime,
    resolved: Resolved,
    payload: EncodedPayload,
) -> int | None:
    """``Store._fire_schedule``: the guard, the job (as ``Queue._insert``
    writes it) and ``last_job_id`` in one ``BEGIN IMMEDIATE`` transaction,
    then the enqueue's wake; ``None`` (nothing written) when the guard
    fails."""
    params = _guard(schedule, next_run_at)
    params["boundary"] = to_us(boundary)
    job = job_row(schedule.queue, resolved, payload)
    job_id = store._pool.transaction(_fire, params, job)
    if job_id is not None:
        notify(store._wake_key, schedule.queue, job_id)
    return job_id


def skip_schedule(store: SqliteStore, schedule: Schedule, next_run_at: datetime) -> bool:
    """``Store._skip_schedule``: the guard alone, advancing ``next_run_at``;
    one statement."""
    return store._pool.run(rowcount, _SKIP, _guard(schedule, next_run_at)) == 1


# -- run on a borrowed connection ------------------------------------------------


def _fire(conn: sqlite3.Connection, params: dict[str, Any], job: tuple[Any, ...]) -> int | None:
    if conn.execute(_ADVANCE, params).rowcount != 1:
        return None  # the transaction commits with nothing written
    job_id = insert_one(conn, job)
    conn.execute(_SET_LAST_JOB, {"name": params["name"], "job_id": job_id})
    return job_id
