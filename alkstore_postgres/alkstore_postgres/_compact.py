# WARNING: generated from _compact_async.py by tools/async_to_sync.py.
# Do not edit: change _compact_async.py, then run `python tools/async_to_sync.py`.
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

The statements and thresholds are in :mod:`alkstore_postgres._sql.compact`.
One source for two modules (docs/async.md "How the engines do it"):
``_compact_async`` is written by hand, ``_compact`` is generated from it.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from alkstore.errors import EngineError, StoreClosedError
from alkstore_postgres._acompat import Busy
from alkstore_postgres._sql.compact import (
    CHECK_INTERVAL_S,
    COPY_IN,
    COPY_OUT,
    COUNTERS,
    DEAD_MIN,
    HORIZON_MIN_S,
    LIVE,
    LIVE_BYTES_MAX,
    LIVE_MAX,
    LOCK,
    LOCK_TIMEOUT,
    SLOW_CLAIM_PER_JOB_S,
    SLOW_CLAIM_S,
    TAKE,
    TRUNCATE,
)

if TYPE_CHECKING:
    from alkstore_postgres._store import PostgresStore

__all__ = ["Compactor", "compact"]


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
    the constants of :mod:`alkstore_postgres._sql.compact`.

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
                conn.execute(LOCK_TIMEOUT)
                params = {"interval_s": interval_s}
                if conn.execute(store.sql(TAKE), params).fetchone() is None:
                    return False
                try:
                    with conn.transaction():
                        conn.execute(store.sql(LOCK))
                except psycopg.errors.LockNotAvailable:
                    return False  # busy: the turn is spent, the next one tries again
                cur = conn.execute(store.sql(LIVE), {"over": live_max + 1})
                row = cur.fetchone()
                assert row is not None
                if row[0] > live_max or row[1] > LIVE_BYTES_MAX:
                    return False
                with conn.cursor() as cur:
                    with cur.copy(store.sql(COPY_OUT)) as out:
                        data = b"".join([bytes(block) for block in out])
                    cur.execute(store.sql(TRUNCATE))
                    with cur.copy(store.sql(COPY_IN)) as into:
                        into.write(data)
        except psycopg.errors.LockNotAvailable:
            return False  # another compactor holds the turn's row
    return True


class Compactor:
    """A store's trigger for :func:`compact`, called after each claim with
    the seconds it took and the jobs it asked for: a claim slower than
    ``SLOW_CLAIM_S`` plus ``SLOW_CLAIM_PER_JOB_S`` per job asked for (the
    sign of dead entries in its walk: with vacuum working, the first scan
    that finds an entry dead marks it so, and claims stay fast) looks at
    the counters, at most once per ``CHECK_INTERVAL_S``. A store whose
    claims are fast sends the claim alone. One caller at a time looks (the
    others go on at once); it never raises (the claim's jobs are already in
    hand; the next look tries again)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        # The first look comes an interval after the store opened: its
        # first claims on each connection are slow for being planned.
        self._last = time.monotonic()
        self._busy = Busy()

    def after_claim(self, took_s: float, n: int) -> None:
        """Compact now if due (see the class docstring)."""
        if took_s < SLOW_CLAIM_S + n * SLOW_CLAIM_PER_JOB_S:
            return
        if time.monotonic() - self._last < CHECK_INTERVAL_S:
            return
        if not self._busy.take():
            return
        try:
            self._last = time.monotonic()
            with contextlib.suppress(EngineError, StoreClosedError):
                compact(self._store)
        finally:
            self._busy.give()
