# WARNING: generated from _workers_async.py by tools/async_to_sync.py.
# Do not edit: change _workers_async.py, then run `python tools/async_to_sync.py`.
"""The workers registry and the per-minute throughput (docs/contract.md
§11): the ``workers`` and ``throughput`` tables' operations, each one
statement on an autocommit pool connection. The statements are in
:mod:`alkstore_postgres._sql.workers`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from alkstore import ThroughputPoint, WorkerInfo
from alkstore_postgres._sql.workers import (
    ADD_THROUGHPUT,
    DELETE_WORKER,
    LIST_WORKERS,
    PUT_WORKER,
    THROUGHPUT,
)

if TYPE_CHECKING:
    from alkstore_postgres._queue import PostgresQueue
    from alkstore_postgres._store import PostgresStore

__all__ = [
    "add_throughput",
    "delete_worker",
    "list_workers",
    "put_worker",
    "throughput",
]


def put_worker(store: PostgresStore, info: WorkerInfo) -> None:
    """``Store._put_worker``: record or refresh ``info``; drop the silent."""
    params = {
        "id": info.id,
        "host": info.host,
        "pid": info.pid,
        "queues": list(info.queues),
        "concurrency": info.concurrency,
        "started_at": info.started_at,
        "last_seen_at": info.last_seen_at,
        "running": list(info.running),
        "ttl_s": info.ttl_s,
    }
    with store._db.connection() as conn:
        conn.execute(store.sql(PUT_WORKER), params)


def delete_worker(store: PostgresStore, worker_id: str) -> bool:
    """``Store._delete_worker``."""
    with store._db.connection() as conn:
        return conn.execute(store.sql(DELETE_WORKER), {"id": worker_id}).rowcount == 1


def list_workers(store: PostgresStore, now: datetime) -> list[WorkerInfo]:
    """``Store._list_workers``: the live records by ``started_at``, id."""
    with store._db.connection() as conn:
        rows = conn.execute(store.sql(LIST_WORKERS), {"now": now}).fetchall()
    return [
        WorkerInfo(
            id=row[0],
            host=row[1],
            pid=row[2],
            queues=tuple(row[3]),
            concurrency=row[4],
            started_at=row[5].astimezone(UTC),
            last_seen_at=row[6].astimezone(UTC),
            running=tuple(row[7]),
            ttl_s=row[8],
        )
        for row in rows
    ]


def add_throughput(
    queue: PostgresQueue,
    minute: datetime,
    counts: tuple[int, int, int],
    prune_before: datetime,
) -> None:
    """``Queue._add_throughput``: add ``(completed, retried, dead)`` to the
    minute's counts; drop old minutes."""
    completed, retried, dead = counts
    params = {
        "queue": queue.name,
        "minute": minute,
        "completed": completed,
        "retried": retried,
        "dead": dead,
        "before": prune_before,
    }
    store = queue._pg_store
    with store._db.connection() as conn:
        conn.execute(store.sql(ADD_THROUGHPUT), params)


def throughput(queue: PostgresQueue, since: datetime) -> list[ThroughputPoint]:
    """``Queue._throughput``: the minutes from ``since`` on."""
    store = queue._pg_store
    params = {"queue": queue.name, "since": since}
    with store._db.connection() as conn:
        rows = conn.execute(store.sql(THROUGHPUT), params).fetchall()
    return [ThroughputPoint(row[0].astimezone(UTC), row[1], row[2], row[3]) for row in rows]
