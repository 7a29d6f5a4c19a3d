"""The operator's statements (docs/operations.md): pause and resume, the
dead-letter pages, requeue and purge, the job pages by state, and the queue
listing.

Resume and requeue make work claimable without a new job id, so each
records a wake in its own transaction (:func:`alkstore_sqlite._wake.
record_wake`), which the file watchers of every process find, and signals
this process's subscriptions once it committed. The claim's side of the
pause (its guard) is in :mod:`alkstore_sqlite._queue`.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import TYPE_CHECKING, Any

from alkstore import Job, ListedState
from alkstore_sqlite._connection import fetchall, fetchone, rowcount
from alkstore_sqlite._rows import (
    COMPLETED_COLUMNS,
    DEAD_COLUMNS,
    LIVE_COLUMNS,
    jobs_from_rows,
    to_us,
)
from alkstore_sqlite._wake import notify_wake, record_wake

if TYPE_CHECKING:
    from alkstore_sqlite._queue import SqliteQueue
    from alkstore_sqlite._store import SqliteStore

__all__ = [
    "QUEUE_NAMES",
    "completed_count",
    "dead_jobs",
    "is_paused",
    "jobs",
    "move_back",
    "purge_dead",
    "queue_names",
    "requeue",
    "run_now",
    "set_paused",
]

# SQLite integers are signed 64-bit; a larger id cannot exist and would not
# even bind as a parameter.
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# -- pause ---------------------------------------------------------------------

# Counts a row only when this call changed the flag.
_PAUSE = """
    INSERT INTO _alkstore_queues (name, paused) VALUES (?, 1)
    ON CONFLICT (name) DO UPDATE SET paused = 1 WHERE paused = 0
"""
_RESUME = "UPDATE _alkstore_queues SET paused = 0 WHERE name = ? AND paused = 1"
_IS_PAUSED = "SELECT EXISTS (SELECT 1 FROM _alkstore_queues WHERE name = ? AND paused = 1)"

# -- dead letters --------------------------------------------------------------

#: A page of dead rows: a range of the dead table's ``(queue)`` index, whose
#: entries are in id (rowid) order within a queue.
DEAD_PAGE = f"""
    SELECT {DEAD_COLUMNS} FROM _alkstore_dead
    WHERE queue = ? AND id > ? ORDER BY id LIMIT ?
"""
# -- pages by state (Queue.jobs) -------------------------------------------------

# Which private states (alkstore_sqlite._schema) are in each public listing
# state, split at now as _STATS splits them: an 'expired' row (waiting for
# the sweep) is pending or scheduled without a claim, processing with one.
_WAITING = "(state IN ('pending', 'scheduled') OR (state = 'expired' AND claim_deadline IS NULL))"
_LISTED = {
    "pending": f"{_WAITING} AND run_at <= :now",
    "scheduled": f"{_WAITING} AND run_at > :now",
    "processing": (
        "(state IN ('processing', 'lapsed') OR (state = 'expired' AND claim_deadline IS NOT NULL))"
    ),
}
#: A page of a listing state: the rowid (id) order within the queue.
_PAGES = {
    state: f"""
        SELECT {LIVE_COLUMNS} FROM _alkstore_jobs
        WHERE queue = :queue AND id > :after AND {condition} ORDER BY id LIMIT :limit
    """
    for state, condition in _LISTED.items()
}
_PAGES["completed"] = f"""
    SELECT {COMPLETED_COLUMNS} FROM _alkstore_completed
    WHERE queue = :queue AND id > :after ORDER BY id LIMIT :limit
"""
# A range of the completed table's (queue, finished_at) index.
_COMPLETED_COUNT = "SELECT count(*) FROM _alkstore_completed WHERE queue = ?"

# The dead row back to the live table with its own id (below the
# AUTOINCREMENT mark, so no id is ever handed out twice). The copy and the
# delete share one BEGIN IMMEDIATE transaction: every snapshot sees the job
# in exactly one table, and of concurrent requeues of one job the first
# moves it and the others find no dead row. An expiring job gets its
# original expiry duration (expires_at - enqueued_at, always > 0) again,
# from its new run_at; NULL stays NULL. Its attempts are kept, so no claim
# of it can repeat an earlier claim's (id, attempts) identity, and its
# budget is renewed by raising max_attempts by the attempts it used (D21). A job
# whose unique key a live job holds now stays dead: nothing is inserted,
# so nothing is deleted.
_REQUEUE = """
    INSERT INTO _alkstore_jobs (
        id, queue, state, priority, run_at, expires_at, claim_deadline,
        attempts, max_attempts, visibility_timeout_s, backoff_base_s,
        backoff_cap_s, enqueued_at, worker_id, content_type, last_error,
        payload, unique_key)
    SELECT id, queue, :state, priority, :run_at, :run_at + (expires_at - enqueued_at), NULL,
           attempts, min(attempts + max_attempts, 2147483647), visibility_timeout_s,
           backoff_base_s, backoff_cap_s, enqueued_at, NULL, content_type, last_error,
           payload, unique_key
    FROM _alkstore_dead WHERE id = :id AND queue = :queue
    ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
"""
_DELETE_REQUEUED = "DELETE FROM _alkstore_dead WHERE id = :id"

# A waiting job made due now (docs/contract.md §4 "Run now"): only a pending
# one not due yet and not expired; into the claim's walk.
_RUN_NOW = """
    UPDATE _alkstore_jobs SET run_at = :now, state = 'pending'
    WHERE id = :id AND queue = :queue AND (state = 'pending' OR state = 'scheduled')
      AND run_at > :now AND (expires_at IS NULL OR expires_at > :now)
"""

# Ranges of the dead table's (queue, died_at) and (queue) indexes.
_PURGE_BEFORE = "DELETE FROM _alkstore_dead WHERE queue = ? AND died_at <= ?"
_PURGE_ALL = "DELETE FROM _alkstore_dead WHERE queue = ?"

# -- queue listing -------------------------------------------------------------

# Every index that leads with a queue name, as (table, column, the partial
# index's condition). The live table has no index over all its rows (one
# would cost every enqueue and ack a write), but its partial indexes together
# cover every row: one per state, and the expiry index for the 'expired'
# rows, which always have an expires_at.
_NAME_INDEXES = (
    ("_alkstore_jobs", "queue", "state = 'pending' AND "),
    ("_alkstore_jobs", "queue", "state = 'scheduled' AND "),
    ("_alkstore_jobs", "queue", "state = 'processing' AND "),
    ("_alkstore_jobs", "queue", "state = 'lapsed' AND "),
    ("_alkstore_jobs", "queue", "expires_at IS NOT NULL AND "),
    ("_alkstore_dead", "queue", ""),
    ("_alkstore_completed", "queue", ""),
    ("_alkstore_queues", "name", "paused = 1 AND "),
)
_NEXT_NAMES = " UNION ALL ".join(
    f"SELECT (SELECT {column} FROM {table} WHERE {condition}{column} > names.name "
    f"ORDER BY {column} LIMIT 1) AS next"
    for table, column, condition in _NAME_INDEXES
)
#: The queue listing, a loose index scan: each step seeks, in every one of
#: those indexes, the first name above the previous step's and keeps the
#: smallest, so the cost is a few index seeks per queue, however many jobs
#: wait. '' is below every queue name (names are never empty); min() skips
#: the indexes with nothing above, and the walk ends when none has any.
#: Names are ASCII, so SQLite's binary order is Python's.
QUEUE_NAMES = f"""
    WITH RECURSIVE names (name) AS (
        SELECT ''
        UNION ALL
        SELECT (SELECT min(next) FROM ({_NEXT_NAMES})) FROM names WHERE name IS NOT NULL
    )
    SELECT name FROM names WHERE name > ''
"""


def set_paused(queue: SqliteQueue, paused: bool) -> bool:
    """``Queue._set_paused``: ``True`` if this call changed the flag; a
    resume wakes the queue's subscriptions in every process."""
    store = queue._store
    if paused:
        return store._pool.run(rowcount, _PAUSE, (queue.name,)) == 1
    wake_id = store._pool.transaction(_resume, queue.name)
    if wake_id is None:
        return False
    notify_wake(store._wake_key, queue.name, wake_id)
    return True


def is_paused(queue: SqliteQueue) -> bool:
    """``Queue._is_paused``."""
    row = queue._store._pool.run(fetchone, _IS_PAUSED, (queue.name,))
    return bool(row[0])


def dead_jobs(queue: SqliteQueue, limit: int, after_id: int | None) -> list[Job]:
    """``Queue._dead_jobs``: a page of the queue's dead rows by id."""
    after = _INT64_MIN if after_id is None else after_id
    rows = queue._store._pool.run(fetchall, DEAD_PAGE, (queue.name, after, limit))
    return jobs_from_rows(rows)


def jobs(
    queue: SqliteQueue, state: ListedState, limit: int, after_id: int | None, now: datetime
) -> list[Job]:
    """``Queue._jobs``: a page of the queue's rows in a live or completed
    state by id."""
    params = {
        "queue": queue.name,
        "after": _INT64_MIN if after_id is None else after_id,
        "limit": limit,
        "now": to_us(now),
    }
    return jobs_from_rows(queue._store._pool.run(fetchall, _PAGES[state], params))


def completed_count(queue: SqliteQueue) -> int:
    """``Queue._completed_count``."""
    row = queue._store._pool.run(fetchone, _COMPLETED_COUNT, (queue.name,))
    return int(row[0])


def requeue(queue: SqliteQueue, job_id: int, now: datetime, run_at: datetime) -> bool:
    """``Queue._requeue``: move a dead row back to the live table and wake
    the queue's subscriptions in every process."""
    if not _INT64_MIN <= job_id <= _INT64_MAX:
        return False
    store = queue._store
    run_at_us = to_us(run_at)
    params = {
        "id": job_id,
        "queue": queue.name,
        "run_at": run_at_us,
        # As an enqueue: a job not due yet stays out of the claim's walk.
        "state": "scheduled" if run_at_us > to_us(now) else "pending",
    }
    wake_id = store._pool.transaction(move_back, params)
    if wake_id is None:
        return False
    notify_wake(store._wake_key, queue.name, wake_id)
    return True


def run_now(queue: SqliteQueue, job_id: int, now: datetime) -> bool:
    """``Queue._run_now``: make a waiting job due now and wake the queue's
    subscriptions in every process."""
    if not _INT64_MIN <= job_id <= _INT64_MAX:
        return False
    store = queue._store
    params = {"id": job_id, "queue": queue.name, "now": to_us(now)}
    wake_id = store._pool.transaction(_make_due, params)
    if wake_id is None:
        return False
    notify_wake(store._wake_key, queue.name, wake_id)
    return True


def purge_dead(queue: SqliteQueue, cutoff: datetime | None) -> int:
    """``Queue._purge_dead``: delete dead rows with ``died_at <= cutoff``
    (all of the queue's when ``None``)."""
    pool = queue._store._pool
    if cutoff is None:
        return pool.run(rowcount, _PURGE_ALL, (queue.name,))
    return pool.run(rowcount, _PURGE_BEFORE, (queue.name, to_us(cutoff)))


def queue_names(store: SqliteStore) -> list[str]:
    """``Store._queue_names``, in order."""
    return [name for (name,) in store._pool.run(fetchall, QUEUE_NAMES, ())]


# -- run on a borrowed connection ------------------------------------------------


def _resume(conn: sqlite3.Connection, queue: str) -> int | None:
    """Inside ``BEGIN IMMEDIATE``: resume ``queue``; the wake id if it was
    paused, else ``None`` (nothing written)."""
    if conn.execute(_RESUME, (queue,)).rowcount != 1:
        return None
    return record_wake(conn, queue)


def _make_due(conn: sqlite3.Connection, params: dict[str, Any]) -> int | None:
    """Inside ``BEGIN IMMEDIATE``: make the waiting job due now; the wake
    id, or ``None`` (nothing written) when there is no such job."""
    if conn.execute(_RUN_NOW, params).rowcount != 1:
        return None
    return record_wake(conn, params["queue"])


def move_back(conn: sqlite3.Connection, params: dict[str, Any]) -> int | None:
    """Inside ``BEGIN IMMEDIATE``: move the dead row ``params["id"]`` of
    ``params["queue"]`` back; the wake id, or ``None`` (nothing written)
    when there is no such dead row."""
    if conn.execute(_REQUEUE, params).rowcount != 1:
        return None
    conn.execute(_DELETE_REQUEUED, params)
    return record_wake(conn, params["queue"])
