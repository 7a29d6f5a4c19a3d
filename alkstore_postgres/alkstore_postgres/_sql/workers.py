"""The workers registry's and the throughput's statements
(:mod:`alkstore_postgres._workers`; docs/contract.md §11).

Each is one statement on an autocommit pool connection: a refresh upserts
the worker's row and deletes the records silent past their own ``ttl_s``;
a throughput report adds to the minute's row (``ON CONFLICT DO UPDATE``
takes the row's lock, so concurrent reports of one minute all count) and
deletes the queue's minutes past the retention.
"""

from __future__ import annotations

from psycopg import sql

__all__ = [
    "ADD_THROUGHPUT",
    "DELETE_WORKER",
    "LIST_WORKERS",
    "PUT_WORKER",
    "THROUGHPUT",
]

# The prune skips the row being written (its expires_at is in the future).
PUT_WORKER = sql.SQL("""
    WITH put AS (
        INSERT INTO {workers} AS w (id, host, pid, queues, concurrency, started_at,
            last_seen_at, running, ttl_s, expires_at)
        VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(started_at)s,
            %(last_seen_at)s, %(running)s, %(ttl_s)s,
            %(last_seen_at)s + make_interval(secs => %(ttl_s)s))
        ON CONFLICT (id) DO UPDATE SET
            host = excluded.host, pid = excluded.pid, queues = excluded.queues,
            concurrency = excluded.concurrency, started_at = excluded.started_at,
            last_seen_at = excluded.last_seen_at, running = excluded.running,
            ttl_s = excluded.ttl_s, expires_at = excluded.expires_at
        RETURNING 1
    ), pruned AS (
        DELETE FROM {workers} WHERE expires_at <= %(last_seen_at)s AND id <> %(id)s
    )
    SELECT count(*) FROM put
""")

DELETE_WORKER = sql.SQL("DELETE FROM {workers} WHERE id = %(id)s")

LIST_WORKERS = sql.SQL("""
    SELECT id, host, pid, queues, concurrency, started_at, last_seen_at, running, ttl_s
    FROM {workers} WHERE expires_at > %(now)s ORDER BY started_at, id
""")

ADD_THROUGHPUT = sql.SQL("""
    WITH added AS (
        INSERT INTO {throughput} AS t (queue, minute, completed, retried, dead)
        VALUES (%(queue)s, %(minute)s, %(completed)s, %(retried)s, %(dead)s)
        ON CONFLICT (queue, minute) DO UPDATE SET
            completed = t.completed + excluded.completed,
            retried = t.retried + excluded.retried,
            dead = t.dead + excluded.dead
        RETURNING 1
    ), pruned AS (
        DELETE FROM {throughput} WHERE queue = %(queue)s AND minute < %(before)s
    )
    SELECT count(*) FROM added
""")

THROUGHPUT = sql.SQL("""
    SELECT minute, completed, retried, dead FROM {throughput}
    WHERE queue = %(queue)s AND minute >= %(since)s ORDER BY minute
""")
