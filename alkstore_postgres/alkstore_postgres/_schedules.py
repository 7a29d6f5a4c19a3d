"""Schedules (docs/schedules.md): the ``schedules`` table's statements and
the exactly-once firing of a boundary.

A schedule is stored as the flat columns of
:data:`alkstore.contract.schedule.SCHEDULE_COLUMNS` (the enqueue options as one
JSON text). Firing a boundary is one transaction: a conditional UPDATE of
the schedule row guarded by its ``revision`` and ``next_run_at``, then the
job's insert through :meth:`PostgresQueue._insert_tx` (the enqueue path's
own statement and wake, sent on commit), then ``last_job_id``; a failed
insert rolls the UPDATE back with it. The UPDATE takes the row's lock with
``SKIP LOCKED``: a tick that finds another transaction holding the row
(another tick firing it, in practice) passes over it instead of waiting,
so a row held by a stuck session never stalls the schedules after it; the
next tick tries it again. A row it can lock is re-checked against the
committed version under READ COMMITTED, so of many processes firing one
boundary one writes and the others match nothing and write nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from psycopg import sql

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
from alkstore_postgres._schema import Statement

if TYPE_CHECKING:
    from alkstore_postgres._store import PostgresStore

__all__ = [
    "delete_schedule",
    "fire_schedule",
    "list_schedules",
    "put_schedule",
    "skip_schedule",
]

_COLUMNS = sql.SQL(", ").join(map(sql.Identifier, SCHEDULE_COLUMNS))
_PLACEHOLDERS = sql.SQL(", ").join(sql.Placeholder(c) for c in SCHEDULE_COLUMNS)
# Replacing a schedule takes every column from the new value but the
# revision, which counts the replacements.
_REPLACE = sql.SQL(", ").join(
    sql.SQL("{0} = excluded.{0}").format(sql.Identifier(c))
    for c in SCHEDULE_COLUMNS
    if c not in ("name", "revision")
)
# Names sort by code point, as Python sorts them, whatever the collation.
_BY_NAME = sql.SQL('name COLLATE "C"')

_FRAGMENTS = {"columns": _COLUMNS, "by_name": _BY_NAME}

PUT = Statement(
    sql.SQL("""
    INSERT INTO {schedules} AS s ({columns}) VALUES ({values})
    ON CONFLICT (name) DO UPDATE SET {replace}, revision = s.revision + 1
    RETURNING {columns}
"""),
    values=_PLACEHOLDERS,
    replace=_REPLACE,
    **_FRAGMENTS,
)

DELETE = sql.SQL("DELETE FROM {schedules} WHERE name = %(name)s")

LIST_ALL = Statement(
    sql.SQL("SELECT {columns} FROM {schedules} ORDER BY {by_name}"),
    **_FRAGMENTS,
)

# The due end of schedules_due.
LIST_DUE = Statement(
    sql.SQL("""
    SELECT {columns} FROM {schedules}
    WHERE next_run_at <= %(due_at)s
    ORDER BY next_run_at, {by_name}
"""),
    **_FRAGMENTS,
)

# The exactly-once guard (module docstring): the row as the tick read it,
# locked only if no other transaction holds it.
_GUARD = """
    name = %(name)s AND revision = %(revision)s AND next_run_at = %(expected)s
    AND name IN (
        SELECT name FROM {schedules}
        WHERE name = %(name)s AND revision = %(revision)s AND next_run_at = %(expected)s
        FOR UPDATE SKIP LOCKED
    )
"""

ADVANCE = sql.SQL(
    "UPDATE {schedules} SET next_run_at = %(next_run_at)s, last_run_at = %(boundary)s WHERE"
    + _GUARD
)

SKIP = sql.SQL("UPDATE {schedules} SET next_run_at = %(next_run_at)s WHERE" + _GUARD)

# The row is locked by ADVANCE, in the same transaction.
SET_LAST_JOB = sql.SQL("UPDATE {schedules} SET last_job_id = %(job_id)s WHERE name = %(name)s")


def _values(row: Sequence[Any]) -> list[Any]:
    """A stored row as the core's column values (instants in UTC)."""
    return [v.astimezone(UTC) if isinstance(v, datetime) else v for v in row]


def put_schedule(store: PostgresStore, schedule: Schedule) -> Schedule:
    """``Store._put_schedule``: insert at revision 1 or replace, one statement."""
    params = dict(zip(SCHEDULE_COLUMNS, schedule_to_values(schedule), strict=True))
    params["revision"] = 1
    with store._db.connection() as conn:
        row = conn.execute(store.sql(PUT), params, binary=True).fetchone()
    assert row is not None
    return schedule_from_values(_values(row))


def delete_schedule(store: PostgresStore, name: str) -> bool:
    """``Store._delete_schedule``."""
    with store._db.connection() as conn:
        return conn.execute(store.sql(DELETE), {"name": name}).rowcount == 1


def list_schedules(
    store: PostgresStore, due_at: datetime | None
) -> list[Schedule | UnreadableSchedule]:
    """``Store._list_schedules``: all by name, or the due ones by
    ``next_run_at`` then name; a row this version cannot read as an
    :class:`UnreadableSchedule`."""
    with store._db.connection() as conn:
        if due_at is None:
            rows = conn.execute(store.sql(LIST_ALL), binary=True).fetchall()
        else:
            rows = conn.execute(store.sql(LIST_DUE), {"due_at": due_at}, binary=True).fetchall()
    return [read_schedule(_values(row)) for row in rows]


def _guard(schedule: Schedule, next_run_at: datetime) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "revision": schedule.revision,
        "expected": schedule.next_run_at,
        "next_run_at": next_run_at,
    }


def fire_schedule(
    store: PostgresStore,
    schedule: Schedule,
    *,
    boundary: datetime,
    next_run_at: datetime,
    resolved: Resolved,
    payload: EncodedPayload,
) -> int | None:
    """``Store._fire_schedule``: the guard, the job and ``last_job_id`` in
    one transaction; ``None`` (nothing written) when the guard fails."""
    queue = store._open_queue(schedule.queue, schedule.queue_opts)
    params = _guard(schedule, next_run_at)
    params["boundary"] = boundary
    with store._db.connection() as conn, conn.transaction():
        if conn.execute(store.sql(ADVANCE), params).rowcount != 1:
            return None  # the transaction ends with nothing written
        job_id = queue._insert_tx(conn, resolved, payload)
        conn.execute(store.sql(SET_LAST_JOB), {"job_id": job_id, "name": schedule.name})
    return job_id


def skip_schedule(store: PostgresStore, schedule: Schedule, next_run_at: datetime) -> bool:
    """``Store._skip_schedule``: the guard alone, advancing ``next_run_at``."""
    with store._db.connection() as conn:
        return conn.execute(store.sql(SKIP), _guard(schedule, next_run_at)).rowcount == 1
