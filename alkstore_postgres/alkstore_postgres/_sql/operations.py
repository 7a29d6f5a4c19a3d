"""The operator's statements (:mod:`alkstore_postgres._operations`): pause
and resume, the dead-letter pages, the job pages by state, requeue and
purge, and the queue listing.

A wake is a ``pg_notify`` in the same statement, so only a commit sends it
(to every process listening).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import sql

from alkstore_postgres._rows import COMPLETED_COLUMNS, DEAD_COLUMNS, LIVE_COLUMNS
from alkstore_postgres._schema import Statement, render
from alkstore_postgres._sql.queue import INT64_MAX, INT64_MIN

__all__ = [
    "COMPLETED_COUNT",
    "DEAD_JOBS",
    "IS_PAUSED",
    "PAUSE",
    "PURGE_DEAD",
    "QUEUE_NAMES",
    "REQUEUE",
    "RESUME",
    "RUN_NOW",
    "dead_jobs_lower",
    "dead_jobs_query",
    "jobs_query",
    "requeue_params",
]

#: The pause flag, as the claim reads it (``_queue.CLAIM``'s ``paused``).
IS_PAUSED = sql.SQL("SELECT EXISTS (SELECT 1 FROM {queues} WHERE name = %(queue)s AND paused)")

# A row is returned only when this call changed the flag.
PAUSE = sql.SQL("""
    INSERT INTO {queues} AS q (name, paused) VALUES (%(queue)s, true)
    ON CONFLICT (name) DO UPDATE SET paused = true WHERE NOT q.paused
    RETURNING 1
""")

# The wake goes with the commit, and only when this call resumed the queue.
RESUME = sql.SQL("""
    WITH resumed AS (
        UPDATE {queues} SET paused = false WHERE name = %(queue)s AND paused
        RETURNING 1
    ), wake AS (
        SELECT pg_notify(%(channel)s, '') FROM resumed
    )
    SELECT count(*) FROM wake
""")

# A range of dead_queue (queue, id). Its values are literals, never
# parameters: a generic plan (and the pool forces generic plans, D25) knows
# no queue's share of the dead rows, and could walk the primary key through
# another queue's many rows to find a few of this one's; with the values in
# the text the plan is made for them, at each call.
DEAD_JOBS = sql.SQL("""
    SELECT {dead_columns} FROM {dead}
    WHERE queue = {queue} AND id >= {lower}
    ORDER BY id
    LIMIT {limit}
""")

# Which private states (alkstore_postgres._schema) are in each listing state,
# split at now as STATS splits them: an 'expired' row (waiting for the
# sweep) is pending or scheduled without a claim, processing with one. The
# values are literals, as in DEAD_JOBS.
_WAITING = "(state IN ('pending', 'scheduled') OR (state = 'expired' AND claim_deadline IS NULL))"
_LISTED = {
    "pending": f"{_WAITING} AND run_at <= {{now}}",
    "scheduled": f"{_WAITING} AND run_at > {{now}}",
    "processing": (
        "(state IN ('processing', 'lapsed') OR (state = 'expired' AND claim_deadline IS NOT NULL))"
    ),
}
_JOBS_PAGES = {
    state: sql.SQL(
        "SELECT {live_columns} FROM {jobs} WHERE queue = {queue} AND id >= {lower} AND "
        + condition
        + " ORDER BY id LIMIT {limit}"
    )
    for state, condition in _LISTED.items()
}
_JOBS_PAGES["completed"] = sql.SQL(
    "SELECT {completed_columns} FROM {completed} WHERE queue = {queue} AND id >= {lower} "
    "ORDER BY id LIMIT {limit}"
)

# A range of completed_finished (queue, finished_at).
COMPLETED_COUNT = sql.SQL("SELECT count(*) FROM {completed} WHERE queue = %(queue)s")

# One statement: the job leaves the dead table and enters the live one in
# the same commit, so every snapshot sees it in exactly one of them. Its
# row lock makes concurrent requeues of one job wait, then find it gone.
# A job whose unique key a live job holds is not inserted, and so not
# deleted: it stays dead.
# The id is the job's own (OVERRIDING: the identity never hands it out
# again). An expiring job gets its original expiry duration (expires_at -
# enqueued_at, always > 0) again from its new run_at, as exact seconds: an
# interval with days would be added in the session's time zone, across DST
# changes. Its attempts are kept, so no claim of it can repeat an earlier
# claim's (id, attempts) identity, and its budget is renewed by raising
# max_attempts by the attempts it used (D21).
REQUEUE = sql.SQL("""
    WITH found AS (
        SELECT id, queue, payload, content_type, priority, run_at, expires_at,
               enqueued_at, attempts, max_attempts, visibility_timeout_s,
               backoff_base_s, backoff_cap_s, last_error, unique_key
        FROM {dead} WHERE id = %(id)s AND queue = %(queue)s
        FOR UPDATE
    ), ins AS (
        INSERT INTO {jobs} (id, queue, state, payload, content_type, priority, run_at,
            expires_at, enqueued_at, attempts, max_attempts, visibility_timeout_s,
            backoff_base_s, backoff_cap_s, last_error, unique_key)
        OVERRIDING SYSTEM VALUE
        SELECT id, queue, %(state)s, payload, content_type, priority, %(run_at)s,
               %(run_at)s + make_interval(secs => extract(epoch FROM expires_at - enqueued_at)),
               enqueued_at, attempts, least(attempts::bigint + max_attempts, 2147483647),
               visibility_timeout_s, backoff_base_s, backoff_cap_s, last_error, unique_key
        FROM found
        ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
        RETURNING id
    ), moved AS (
        DELETE FROM {dead} WHERE id IN (SELECT id FROM ins)
    ), wake AS (
        SELECT pg_notify(%(channel)s, '') FROM ins
    )
    SELECT count(*) FROM wake
""")

# A waiting job made due now (docs/contract.md §4 "Run now"): only a pending
# one not due yet and not expired; into the claim's walk. The wake goes
# with the commit, and only when a row changed.
RUN_NOW = sql.SQL("""
    WITH due AS (
        UPDATE {jobs} SET run_at = %(now)s, state = 'pending'
        WHERE id = %(id)s AND queue = %(queue)s AND state IN ('pending', 'scheduled')
          AND run_at > %(now)s AND (expires_at IS NULL OR expires_at > %(now)s)
        RETURNING 1
    ), wake AS (
        SELECT pg_notify(%(channel)s, '') FROM due
    )
    SELECT count(*) FROM wake
""")

# A range of dead_died (queue, died_at).
PURGE_DEAD = sql.SQL("""
    DELETE FROM {dead}
    WHERE queue = %(queue)s AND died_at <= coalesce(%(cutoff)s::timestamptz, 'infinity')
""")


def _loose_scan(name: str, table: str, where: str) -> str:
    # The first name, then repeatedly the next one above it: each step is
    # one descent of an index whose leading column is ``queue``.
    return f"""
    {name} (queue) AS (
        (SELECT queue FROM {table} WHERE {where} ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT queue FROM {table} WHERE {where} AND queue > {name}.queue
                ORDER BY queue LIMIT 1)
        FROM {name} WHERE {name}.queue IS NOT NULL
    )"""


_SCANS = (
    ("q_pending", "{jobs}", "state = 'pending'"),
    ("q_scheduled", "{jobs}", "state = 'scheduled'"),
    ("q_processing", "{jobs}", "state = 'processing'"),
    ("q_lapsed", "{jobs}", "state = 'lapsed'"),
    # Every 'expired' row has an expires_at: jobs_expiry holds them all.
    ("q_expiring", "{jobs}", "expires_at IS NOT NULL"),
    ("q_dead", "{dead}", "true"),
    ("q_completed", "{completed}", "true"),
)

#: The queue listing: a loose index scan of each live state's partial index
#: and of ``jobs_expiry`` (together every live row), of ``dead_queue`` and
#: ``completed_finished``, and the paused queues.
QUEUE_NAMES = sql.SQL(
    "WITH RECURSIVE"
    + ",".join(_loose_scan(*scan) for scan in _SCANS)
    + "".join(
        f"\n    SELECT queue FROM {name} WHERE queue IS NOT NULL UNION" for name, _, _ in _SCANS
    )
    + "\n    SELECT name FROM {queues} WHERE paused\n"
)


def dead_jobs_lower(after_id: int | None) -> int | None:
    """The lowest id of a dead-jobs page after ``after_id`` (``None``: from
    the lowest); ``None`` when no bigint is above it."""
    if after_id is not None and after_id >= INT64_MAX:
        return None
    return INT64_MIN if after_id is None else after_id + 1


def dead_jobs_query(schema: str, queue: str, lower: int, limit: int) -> bytes:
    """:data:`DEAD_JOBS` with its values written in."""
    statement = Statement(
        DEAD_JOBS,
        dead_columns=DEAD_COLUMNS,
        queue=sql.Literal(queue),
        lower=sql.Literal(lower),
        limit=sql.Literal(limit),
    )
    return render(statement, schema)


def jobs_query(
    schema: str, queue: str, state: str, bounds: tuple[int, int], now: datetime
) -> bytes:
    """A page of the live or completed rows of ``queue`` in ``state`` (a
    :data:`alkstore.ListedState` but ``"dead"``), ``bounds`` being the
    lowest id and the page size, with its values written in."""
    lower, limit = bounds
    statement = Statement(
        _JOBS_PAGES[state],
        live_columns=LIVE_COLUMNS,
        completed_columns=COMPLETED_COLUMNS,
        queue=sql.Literal(queue),
        lower=sql.Literal(lower),
        limit=sql.Literal(limit),
        now=sql.Literal(now),
    )
    return render(statement, schema)


def requeue_params(
    job_id: int, queue: str, channel: str, now: datetime, run_at: datetime
) -> dict[str, Any] | None:
    """:data:`REQUEUE`'s parameters, ``None`` for an id no bigint can hold."""
    if not INT64_MIN <= job_id <= INT64_MAX:
        return None
    return {
        "id": job_id,
        "queue": queue,
        "channel": channel,
        "run_at": run_at,
        # As an enqueue: a job not due yet stays out of the claim's path.
        "state": "scheduled" if run_at > now else "pending",
    }
