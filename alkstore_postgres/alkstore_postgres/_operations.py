# WARNING: generated from _operations_async.py by tools/async_to_sync.py.
# Do not edit: change _operations_async.py, then run `python tools/async_to_sync.py`.
"""The operator's operations (docs/operations.md): pause and resume, the
dead-letter pages, the job pages by state, requeue and purge, and the
queue listing.

Each operation is one statement on an autocommit pool connection, as in
:mod:`alkstore_postgres._queue`; a wake is a ``pg_notify`` in the same
statement, so only a commit sends it (to every process listening). The
statements are in :mod:`alkstore_postgres._sql.operations` (``IS_PAUSED``,
``QUEUE_NAMES`` and ``dead_jobs_query`` are re-exported here).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from alkstore import Job, ListedState
from alkstore_postgres._rows import job_from_row
from alkstore_postgres._sql.operations import (
    COMPLETED_COUNT,
    IS_PAUSED,
    PAUSE,
    PURGE_DEAD,
    QUEUE_NAMES,
    REQUEUE,
    RESUME,
    RUN_NOW,
    dead_jobs_lower,
    dead_jobs_query,
    jobs_query,
    requeue_params,
)
from alkstore_postgres._sql.queue import INT64_MAX, INT64_MIN

if TYPE_CHECKING:
    from alkstore_postgres._queue import PostgresQueue
    from alkstore_postgres._store import PostgresStore

__all__ = [
    "IS_PAUSED",
    "QUEUE_NAMES",
    "completed_count",
    "dead_jobs",
    "dead_jobs_query",
    "is_paused",
    "jobs",
    "purge_dead",
    "queue_names",
    "requeue",
    "set_paused",
]


def set_paused(queue: PostgresQueue, paused: bool) -> bool:
    """``Queue._set_paused``: ``True`` if this call changed the flag."""
    store = queue._pg_store
    params = {"queue": queue.name, "channel": queue.channel}
    with store._db.connection() as conn:
        if paused:
            return conn.execute(store.sql(PAUSE), params).fetchone() is not None
        row = conn.execute(store.sql(RESUME), params).fetchone()
    assert row is not None
    return bool(row[0])


def is_paused(queue: PostgresQueue) -> bool:
    """``Queue._is_paused``."""
    store = queue._pg_store
    with store._db.connection() as conn:
        row = conn.execute(store.sql(IS_PAUSED), {"queue": queue.name}).fetchone()
    assert row is not None
    return bool(row[0])


def dead_jobs(queue: PostgresQueue, limit: int, after_id: int | None) -> list[Job]:
    """``Queue._dead_jobs``: a page of the queue's dead rows by id."""
    lower = dead_jobs_lower(after_id)
    if lower is None:
        return []  # no bigint above after_id
    store = queue._pg_store
    query = dead_jobs_query(store.schema, queue.name, lower, limit)
    with store._db.connection() as conn:
        rows = conn.execute(query, prepare=False, binary=True).fetchall()
    return [job_from_row(row) for row in rows]


def jobs(
    queue: PostgresQueue, state: ListedState, limit: int, after_id: int | None, now: datetime
) -> list[Job]:
    """``Queue._jobs``: a page of the queue's rows in a live or completed
    state by id."""
    lower = dead_jobs_lower(after_id)
    if lower is None:
        return []  # no bigint above after_id
    store = queue._pg_store
    query = jobs_query(store.schema, queue.name, state, (lower, limit), now)
    with store._db.connection() as conn:
        rows = conn.execute(query, prepare=False, binary=True).fetchall()
    return [job_from_row(row) for row in rows]


def completed_count(queue: PostgresQueue) -> int:
    """``Queue._completed_count``."""
    store = queue._pg_store
    with store._db.connection() as conn:
        cursor = conn.execute(store.sql(COMPLETED_COUNT), {"queue": queue.name})
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def requeue(queue: PostgresQueue, job_id: int, now: datetime, run_at: datetime) -> bool:
    """``Queue._requeue``: move a dead row back to the live table."""
    params = requeue_params(job_id, queue.name, queue.channel, now, run_at)
    if params is None:
        return False
    store = queue._pg_store
    with store._db.connection() as conn:
        row = conn.execute(store.sql(REQUEUE), params, binary=True).fetchone()
    assert row is not None
    return bool(row[0])


def run_now(queue: PostgresQueue, job_id: int, now: datetime) -> bool:
    """``Queue._run_now``: make a waiting job due now, waking on commit."""
    if not INT64_MIN <= job_id <= INT64_MAX:
        return False
    store = queue._pg_store
    params = {"id": job_id, "queue": queue.name, "now": now, "channel": queue.channel}
    with store._db.connection() as conn:
        row = conn.execute(store.sql(RUN_NOW), params, binary=True).fetchone()
    assert row is not None
    return bool(row[0])


def purge_dead(queue: PostgresQueue, cutoff: datetime | None) -> int:
    """``Queue._purge_dead``: delete dead rows with ``died_at <= cutoff``."""
    store = queue._pg_store
    params = {"queue": queue.name, "cutoff": cutoff}
    with store._db.connection() as conn:
        return conn.execute(store.sql(PURGE_DEAD), params, binary=True).rowcount


def queue_names(store: PostgresStore) -> list[str]:
    """``Store._queue_names``, sorted by code point (as Python sorts, not
    by the database's collation)."""
    with store._db.connection() as conn:
        rows = conn.execute(store.sql(QUEUE_NAMES)).fetchall()
    return sorted(name for (name,) in rows)
