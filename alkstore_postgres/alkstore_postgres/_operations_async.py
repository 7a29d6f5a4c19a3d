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
    from alkstore_postgres._queue_async import AsyncPostgresQueue
    from alkstore_postgres._store_async import AsyncPostgresStore

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


async def set_paused(queue: AsyncPostgresQueue, paused: bool) -> bool:
    """``Queue._set_paused``: ``True`` if this call changed the flag."""
    store = queue._pg_store
    params = {"queue": queue.name, "channel": queue.channel}
    async with store._db.connection() as conn:
        if paused:
            return await (await conn.execute(store.sql(PAUSE), params)).fetchone() is not None
        row = await (await conn.execute(store.sql(RESUME), params)).fetchone()
    assert row is not None
    return bool(row[0])


async def is_paused(queue: AsyncPostgresQueue) -> bool:
    """``Queue._is_paused``."""
    store = queue._pg_store
    async with store._db.connection() as conn:
        row = await (await conn.execute(store.sql(IS_PAUSED), {"queue": queue.name})).fetchone()
    assert row is not None
    return bool(row[0])


async def dead_jobs(queue: AsyncPostgresQueue, limit: int, after_id: int | None) -> list[Job]:
    """``Queue._dead_jobs``: a page of the queue's dead rows by id."""
    lower = dead_jobs_lower(after_id)
    if lower is None:
        return []  # no bigint above after_id
    store = queue._pg_store
    query = dead_jobs_query(store.schema, queue.name, lower, limit)
    async with store._db.connection() as conn:
        rows = await (await conn.execute(query, prepare=False, binary=True)).fetchall()
    return [job_from_row(row) for row in rows]


async def jobs(
    queue: AsyncPostgresQueue, state: ListedState, limit: int, after_id: int | None, now: datetime
) -> list[Job]:
    """``Queue._jobs``: a page of the queue's rows in a live or completed
    state by id."""
    lower = dead_jobs_lower(after_id)
    if lower is None:
        return []  # no bigint above after_id
    store = queue._pg_store
    query = jobs_query(store.schema, queue.name, state, (lower, limit), now)
    async with store._db.connection() as conn:
        rows = await (await conn.execute(query, prepare=False, binary=True)).fetchall()
    return [job_from_row(row) for row in rows]


async def completed_count(queue: AsyncPostgresQueue) -> int:
    """``Queue._completed_count``."""
    store = queue._pg_store
    async with store._db.connection() as conn:
        cursor = await conn.execute(store.sql(COMPLETED_COUNT), {"queue": queue.name})
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def requeue(queue: AsyncPostgresQueue, job_id: int, now: datetime, run_at: datetime) -> bool:
    """``Queue._requeue``: move a dead row back to the live table."""
    params = requeue_params(job_id, queue.name, queue.channel, now, run_at)
    if params is None:
        return False
    store = queue._pg_store
    async with store._db.connection() as conn:
        row = await (await conn.execute(store.sql(REQUEUE), params, binary=True)).fetchone()
    assert row is not None
    return bool(row[0])


async def run_now(queue: AsyncPostgresQueue, job_id: int, now: datetime) -> bool:
    """``Queue._run_now``: make a waiting job due now, waking on commit."""
    if not INT64_MIN <= job_id <= INT64_MAX:
        return False
    store = queue._pg_store
    params = {"id": job_id, "queue": queue.name, "now": now, "channel": queue.channel}
    async with store._db.connection() as conn:
        row = await (await conn.execute(store.sql(RUN_NOW), params, binary=True)).fetchone()
    assert row is not None
    return bool(row[0])


async def purge_dead(queue: AsyncPostgresQueue, cutoff: datetime | None) -> int:
    """``Queue._purge_dead``: delete dead rows with ``died_at <= cutoff``."""
    store = queue._pg_store
    params = {"queue": queue.name, "cutoff": cutoff}
    async with store._db.connection() as conn:
        return (await conn.execute(store.sql(PURGE_DEAD), params, binary=True)).rowcount


async def queue_names(store: AsyncPostgresStore) -> list[str]:
    """``Store._queue_names``, sorted by code point (as Python sorts, not
    by the database's collation)."""
    async with store._db.connection() as conn:
        rows = await (await conn.execute(store.sql(QUEUE_NAMES))).fetchall()
    return sorted(name for (name,) in rows)
