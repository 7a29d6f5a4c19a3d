"""Compaction: the jobs table emptied of its dead row versions with
``TRUNCATE`` when it holds few live rows and many dead ones
(docs/decisions.md D29, docs/operations.md "Long transactions").

Every claim updates a row out of ``jobs_pending`` and every ack deletes
it, so each job leaves dead index entries at the head of the claim's walk
(and, once its deadline passes, in the lapsed end of ``jobs_processing``).
VACUUM removes them only once no transaction can still see them: while a
transaction anywhere in the database holds the xmin horizon, every claim
walks all of them and visits the heap for each (25x the claim's cost
after 100,000 jobs, bench/_horizon.py). ``TRUNCATE`` removes them whatever
the horizon, as PgQ's rotating tables do, so when at most
:data:`LIVE_MAX` rows are live the table is rewritten with only those:

1. after a claim that was slow (:data:`SLOW_CLAIM_S`), at most once per
   :data:`CHECK_INTERVAL_S` per store (:class:`Compactor`), the store reads the server's
   live and dead row counts of the table (two counters, no scan) and the
   age of the oldest transaction of the database that holds the xmin
   horizon, and goes on only with at least :data:`DEAD_MIN` dead, at most
   :data:`LIVE_MAX` live, and that transaction open for at least
   :data:`HORIZON_MIN_S` (else vacuum can do the work);
2. one transaction, every lock wait bounded by ``lock_timeout``
   (:data:`LOCK_TIMEOUT_MS`), so it never queues claims behind it for
   longer than that: it takes the store-wide turn (the ``maintenance``
   row ``compact``, at most one per :data:`CHECK_INTERVAL_S` of server
   time); then ``ACCESS EXCLUSIVE`` on the table, which it gets only when
   no transaction holds any lock on it (an open ``enqueue_tx``, a
   statement in progress, a reader's transaction), else it gives up the
   turn; then it counts the live rows exactly (and their bytes, at most
   :data:`LIVE_BYTES_MAX`), copies them out
   (``COPY ... TO STDOUT``, binary), ``TRUNCATE``\\s the table (new, empty
   files for it and every index) and copies them back with the same
   values, ids included.

No other session can see the table in between: every statement on it
waits for the lock, then (read committed) takes its snapshot and finds
every live row as it was. The exception is a transaction that took its
snapshot before and reads the table after: ``TRUNCATE`` is not MVCC-safe,
so it sees none of the rows (docs/operations.md says so).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from alkstore.errors import EngineError, StoreClosedError

if TYPE_CHECKING:
    from alkstore_postgres._store import PostgresStore

__all__ = [
    "CHECK_INTERVAL_S",
    "DEAD_MIN",
    "HORIZON_MIN_S",
    "LIVE_BYTES_MAX",
    "LIVE_MAX",
    "SLOW_CLAIM_PER_JOB_S",
    "SLOW_CLAIM_S",
    "Compactor",
    "compact",
]

#: Seconds between two looks at the counters by one store, and between two
#: compactions of one schema by all stores (the server's clock).
CHECK_INTERVAL_S = 0.5
#: Seconds of a claim, plus seconds per job it asked for, that make it
#: look at the counters (see Compactor).
SLOW_CLAIM_S = 0.001
SLOW_CLAIM_PER_JOB_S = 0.00005
#: Dead row versions (the server's count) that make compaction worth it.
DEAD_MIN = 2_000
#: Seconds a transaction holding the xmin horizon must have been open for
#: vacuum to be taken as held back: below it, vacuum is left to do the work.
HORIZON_MIN_S = 5.0
#: Live rows at most that are copied out and back under the lock.
LIVE_MAX = 2_000
#: Bytes of live rows at most (their stored size): they pass through this
#: process's memory while the lock is held.
LIVE_BYTES_MAX = 64 * 1024 * 1024
#: How long a compaction waits for any lock before giving up its turn.
LOCK_TIMEOUT_MS = 10

# The table's counters, and for how many seconds the oldest transaction
# of this database that holds the xmin horizon has been open (with vacuum
# able to work, transactions are short).
COUNTERS = sql.SQL("""
    SELECT pg_stat_get_live_tuples(%(jobs)s::regclass),
           pg_stat_get_dead_tuples(%(jobs)s::regclass),
           (SELECT coalesce(extract(epoch FROM clock_timestamp() - min(xact_start)), 0)::float8
            FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid()
              AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
              AND backend_type <> 'autovacuum worker')
""")

# The store-wide turn: a row only when the last one was long enough ago
# (server time: this is about the server's load, not about the jobs).
TAKE = sql.SQL("""
    INSERT INTO {maintenance} AS m (task, last_run_at) VALUES ('compact', statement_timestamp())
    ON CONFLICT (task) DO UPDATE SET last_run_at = excluded.last_run_at
    WHERE m.last_run_at <= statement_timestamp() - make_interval(secs => %(interval_s)s)
    RETURNING 1
""")

LOCK = sql.SQL("LOCK TABLE {jobs} IN ACCESS EXCLUSIVE MODE")
LIVE = sql.SQL("""
    SELECT count(*), coalesce(sum(pg_column_size(live.*)), 0)::bigint
    FROM (SELECT * FROM {jobs} LIMIT %(over)s) AS live
""")
COPY_OUT = sql.SQL("COPY {jobs} TO STDOUT (FORMAT BINARY)")
TRUNCATE = sql.SQL("TRUNCATE {jobs}")
# COPY writes the given ids into the identity column (as INSERT ...
# OVERRIDING SYSTEM VALUE would); the sequence is untouched.
COPY_IN = sql.SQL("COPY {jobs} FROM STDIN (FORMAT BINARY)")


def compact(
    store: PostgresStore,
    *,
    dead_min: int = DEAD_MIN,
    live_max: int = LIVE_MAX,
    interval_s: float = CHECK_INTERVAL_S,
    horizon_min_s: float = HORIZON_MIN_S,
) -> bool:
    """Compact the store's jobs table if it is worth it and the turn and
    the lock can be had at once (module docstring); return whether it was
    rewritten. ``dead_min``, ``live_max`` (rows), ``interval_s`` (the
    store-wide turn, seconds) and ``horizon_min_s`` (seconds) default to
    the module's constants.

    Raises
    ------
    EngineError
        If the database fails.
    """
    name = sql.Identifier(store.schema, "jobs").as_string(None)
    with store._db.connection() as conn:
        counters = conn.execute(store.sql(COUNTERS), {"jobs": name}).fetchone()
        assert counters is not None
        live, dead, horizon = counters
        if dead < dead_min or live > live_max or horizon < horizon_min_s:
            return False
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                params = {"interval_s": interval_s}
                if conn.execute(store.sql(TAKE), params).fetchone() is None:
                    return False
                try:
                    with conn.transaction():
                        conn.execute(store.sql(LOCK))
                except psycopg.errors.LockNotAvailable:
                    return False  # busy: the turn is spent, the next one tries again
                row = conn.execute(store.sql(LIVE), {"over": live_max + 1}).fetchone()
                assert row is not None
                if row[0] > live_max or row[1] > LIVE_BYTES_MAX:
                    return False
                with conn.cursor() as cur:
                    with cur.copy(store.sql(COPY_OUT)) as out:
                        data = b"".join(bytes(block) for block in out)
                    cur.execute(store.sql(TRUNCATE))
                    with cur.copy(store.sql(COPY_IN)) as into:
                        into.write(data)
        except psycopg.errors.LockNotAvailable:
            return False  # another compactor holds the turn's row
    return True


class Compactor:
    """A store's trigger for :func:`compact`, called after each claim with
    the seconds it took and the jobs it asked for: a claim slower than
    :data:`SLOW_CLAIM_S` plus :data:`SLOW_CLAIM_PER_JOB_S` per job asked
    for (the sign of dead entries in its walk: with vacuum working, the
    first scan that finds an entry dead marks it so, and claims stay fast)
    looks at the counters, at most once per :data:`CHECK_INTERVAL_S`. A
    store whose claims are fast sends the claim alone. One thread at a
    time looks; it never raises (the claim's jobs are already in hand; the
    next look tries again)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        # The first look comes an interval after the store opened: its
        # first claims on each connection are slow for being planned.
        self._last = time.monotonic()
        self._busy = threading.Lock()

    def after_claim(self, took_s: float, n: int) -> None:
        """Compact now if due (see the class docstring)."""
        if took_s < SLOW_CLAIM_S + n * SLOW_CLAIM_PER_JOB_S:
            return
        if time.monotonic() - self._last < CHECK_INTERVAL_S:
            return
        if not self._busy.acquire(blocking=False):
            return
        try:
            self._last = time.monotonic()
            with contextlib.suppress(EngineError, StoreClosedError):
                compact(self._store)
        finally:
            self._busy.release()
