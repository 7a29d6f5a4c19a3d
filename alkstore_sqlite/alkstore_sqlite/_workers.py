"""The workers registry and the per-minute throughput in SQLite
(docs/contract.md §11): the rows of ``_alkstore_workers`` and
``_alkstore_throughput``.

A refresh is one upsert and one delete of the records silent past their own
``ttl_s``, in one ``BEGIN IMMEDIATE`` transaction; a throughput report is
one upsert that adds to the minute's counts (so reports of many workers in
one minute all count) and one delete of the minutes past the retention.
Instants are microseconds since the epoch, as everywhere in the engine.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from typing import TYPE_CHECKING, Any

from alkstore import ThroughputPoint, WorkerInfo
from alkstore.engine import duration_us
from alkstore_sqlite._connection import fetchall, rowcount
from alkstore_sqlite._rows import from_us, to_us

if TYPE_CHECKING:
    from alkstore_sqlite._queue import SqliteQueue
    from alkstore_sqlite._store import SqliteStore

__all__ = [
    "add_throughput",
    "delete_worker",
    "list_workers",
    "put_worker",
    "throughput",
]

_PUT = """
    INSERT INTO _alkstore_workers (
        id, host, pid, queues, concurrency, started_at, last_seen_at, running,
        ttl_s, expires_at)
    VALUES (:id, :host, :pid, :queues, :concurrency, :started_at, :last_seen_at,
            :running, :ttl_s, :expires_at)
    ON CONFLICT (id) DO UPDATE SET
        host = excluded.host, pid = excluded.pid, queues = excluded.queues,
        concurrency = excluded.concurrency, started_at = excluded.started_at,
        last_seen_at = excluded.last_seen_at, running = excluded.running,
        ttl_s = excluded.ttl_s, expires_at = excluded.expires_at
"""
_PRUNE = "DELETE FROM _alkstore_workers WHERE expires_at <= :last_seen_at"
_DELETE = "DELETE FROM _alkstore_workers WHERE id = ?"
_LIST = """
    SELECT id, host, pid, queues, concurrency, started_at, last_seen_at, running, ttl_s
    FROM _alkstore_workers WHERE expires_at > ? ORDER BY started_at, id
"""

_ADD = """
    INSERT INTO _alkstore_throughput (queue, minute, completed, retried, dead)
    VALUES (:queue, :minute, :completed, :retried, :dead)
    ON CONFLICT (queue, minute) DO UPDATE SET
        completed = completed + excluded.completed,
        retried = retried + excluded.retried,
        dead = dead + excluded.dead
"""
_PRUNE_MINUTES = "DELETE FROM _alkstore_throughput WHERE queue = :queue AND minute < :before"
_POINTS = """
    SELECT minute, completed, retried, dead FROM _alkstore_throughput
    WHERE queue = ? AND minute >= ? ORDER BY minute
"""


def put_worker(store: SqliteStore, info: WorkerInfo) -> None:
    """``Store._put_worker``: record or refresh ``info``; drop the silent."""
    last_seen = to_us(info.last_seen_at)
    params = {
        "id": info.id,
        "host": info.host,
        "pid": info.pid,
        "queues": json.dumps(info.queues),
        "concurrency": info.concurrency,
        "started_at": to_us(info.started_at),
        "last_seen_at": last_seen,
        "running": json.dumps(info.running),
        "ttl_s": info.ttl_s,
        "expires_at": last_seen + duration_us(info.ttl_s),
    }
    store._pool.transaction(_put, params)


def delete_worker(store: SqliteStore, worker_id: str) -> bool:
    """``Store._delete_worker``."""
    return store._pool.run(rowcount, _DELETE, (worker_id,)) == 1


def list_workers(store: SqliteStore, now: datetime) -> list[WorkerInfo]:
    """``Store._list_workers``: the live records by ``started_at``, id."""
    rows = store._pool.run(fetchall, _LIST, (to_us(now),))
    return [
        WorkerInfo(
            id=row[0],
            host=row[1],
            pid=row[2],
            queues=tuple(json.loads(row[3])),
            concurrency=row[4],
            started_at=from_us(row[5]),
            last_seen_at=from_us(row[6]),
            running=tuple(json.loads(row[7])),
            ttl_s=row[8],
        )
        for row in rows
    ]


def add_throughput(
    queue: SqliteQueue, minute: datetime, counts: tuple[int, int, int], prune_before: datetime
) -> None:
    """``Queue._add_throughput``: add ``(completed, retried, dead)`` to the
    minute's counts; drop old minutes."""
    completed, retried, dead = counts
    params = {
        "queue": queue.name,
        "minute": to_us(minute),
        "completed": completed,
        "retried": retried,
        "dead": dead,
        "before": to_us(prune_before),
    }
    queue._store._pool.transaction(_add, params)


def throughput(queue: SqliteQueue, since: datetime) -> list[ThroughputPoint]:
    """``Queue._throughput``: the minutes from ``since`` on."""
    rows = queue._store._pool.run(fetchall, _POINTS, (queue.name, to_us(since)))
    return [ThroughputPoint(from_us(row[0]), row[1], row[2], row[3]) for row in rows]


# -- run on a borrowed connection ------------------------------------------------


def _put(conn: sqlite3.Connection, params: dict[str, Any]) -> None:
    conn.execute(_PUT, params)
    conn.execute(_PRUNE, params)


def _add(conn: sqlite3.Connection, params: dict[str, Any]) -> None:
    conn.execute(_ADD, params)
    conn.execute(_PRUNE_MINUTES, params)
