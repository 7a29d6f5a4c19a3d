# WARNING: generated from _schedules_async.py by tools/async_to_sync.py.
# Do not edit: change _schedules_async.py, then run `python tools/async_to_sync.py`.
"""Schedules (docs/schedules.md): the ``schedules`` table's operations and
the exactly-once firing of a boundary.

A schedule is stored as the flat columns of
:data:`alkstore.contract.schedule.SCHEDULE_COLUMNS` (the enqueue options as one
JSON text). Firing a boundary is one transaction: a conditional UPDATE of
the schedule row guarded by its ``revision`` and ``next_run_at``, then the
job's insert through :meth:`PostgresQueue._insert_on` (the enqueue path's
own statement and wake, sent on commit), then ``last_job_id``; a failed
insert rolls the UPDATE back with it. The UPDATE takes the row's lock with
``SKIP LOCKED``: a tick that finds another transaction holding the row
(another tick firing it, in practice) passes over it instead of waiting,
so a row held by a stuck session never stalls the schedules after it; the
next tick tries it again. A row it can lock is re-checked against the
committed version under READ COMMITTED, so of many processes firing one
boundary one writes and the others match nothing and write nothing. The
statements are in :mod:`alkstore_postgres._sql.schedules`.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from alkstore.engine import (
    EncodedPayload,
    Resolved,
    Schedule,
    UnreadableSchedule,
    read_schedule,
    schedule_from_values,
)
from alkstore_postgres._sql.schedules import (
    ADVANCE,
    DELETE,
    LIST_ALL,
    LIST_DUE,
    PUT,
    SET_LAST_JOB,
    SKIP,
    guard_params,
    put_params,
    schedule_values,
)

if TYPE_CHECKING:
    from alkstore_postgres._store import PostgresStore

__all__ = [
    "delete_schedule",
    "fire_schedule",
    "list_schedules",
    "put_schedule",
    "skip_schedule",
]


def put_schedule(store: PostgresStore, schedule: Schedule) -> Schedule:
    """``Store._put_schedule``: insert at revision 1 or replace, one statement."""
    with store._db.connection() as conn:
        cur = conn.execute(store.sql(PUT), put_params(schedule), binary=True)
        row = cur.fetchone()
    assert row is not None
    return schedule_from_values(schedule_values(row))


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
            cur = conn.execute(store.sql(LIST_ALL), binary=True)
        else:
            cur = conn.execute(store.sql(LIST_DUE), {"due_at": due_at}, binary=True)
        rows = cur.fetchall()
    return [read_schedule(schedule_values(row)) for row in rows]


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
    params = guard_params(schedule, next_run_at)
    params["boundary"] = boundary
    with store._db.connection() as conn, conn.transaction():
        if conn.execute(store.sql(ADVANCE), params).rowcount != 1:
            return None  # the transaction ends with nothing written
        job_id = queue._insert_on(conn, resolved, payload)
        conn.execute(store.sql(SET_LAST_JOB), {"job_id": job_id, "name": schedule.name})
    return job_id


def skip_schedule(store: PostgresStore, schedule: Schedule, next_run_at: datetime) -> bool:
    """``Store._skip_schedule``: the guard alone, advancing ``next_run_at``."""
    params = guard_params(schedule, next_run_at)
    with store._db.connection() as conn:
        return conn.execute(store.sql(SKIP), params).rowcount == 1
