"""The SQLite :class:`~alkstore.Queue`: enqueue, claim and the queue-wide
operations (docs/contract.md §3); the operator's (pause, dead letters) are in
:mod:`alkstore_sqlite._operations`."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from alkstore import (
    Job,
    JobHandle,
    ListedState,
    Queue,
    QueueOpts,
    QueueStats,
    SweepResult,
    ThroughputPoint,
)
from alkstore.engine import (
    EXPIRED,
    MAX_ATTEMPTS_EXCEEDED,
    EncodedPayload,
    Resolved,
    duration_us,
)
from alkstore.errors import ValidationError
from alkstore_sqlite import _operations, _workers
from alkstore_sqlite._connection import engine_error, fetchone, rowcount, run_in_transaction
from alkstore_sqlite._handle import SqliteJobHandle, ack_each
from alkstore_sqlite._rows import (
    COMPLETE_CLAIMS,
    COMPLETED_COLUMNS,
    DEAD_COLUMNS,
    LIVE_COLUMNS,
    bury_sql,
    complete_sql,
    job_from_row,
    jobs_from_rows,
    to_us,
)
from alkstore_sqlite._wake import notify

if TYPE_CHECKING:
    from alkstore_sqlite._store import SqliteStore

__all__ = ["SqliteQueue", "insert_keyed", "insert_one", "job_row"]

# SQLite integers are signed 64-bit; a larger id cannot exist and would not
# even bind as a parameter.
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_INSERT = """
    INSERT INTO _alkstore_jobs (
        queue, state, payload, content_type, priority, run_at, expires_at,
        enqueued_at, attempts, max_attempts, visibility_timeout_s,
        backoff_base_s, backoff_cap_s)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?)
"""
# A job with a unique key (docs/contract.md §3 "Unique keys"): the partial
# unique index on (queue, unique_key) decides, so two enqueues of one key
# can never both store a row, whatever runs at once. Stored nothing: the
# live row holding the key is found by the same index, in the same write
# transaction (so it cannot have gone in between).
_INSERT_UNIQUE = """
    INSERT INTO _alkstore_jobs (
        queue, state, payload, content_type, priority, run_at, expires_at,
        enqueued_at, attempts, max_attempts, visibility_timeout_s,
        backoff_base_s, backoff_cap_s, unique_key)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?)
    ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
"""
_HOLDER = "SELECT id FROM _alkstore_jobs WHERE queue = ? AND unique_key = ?"

# -- the claim ---------------------------------------------------------------
#
# The claim walks two partial indexes in claim order (priority DESC, run_at,
# id) and stops after n rows: 'pending' (due jobs) and 'lapsed' (reclaimable
# claims). Rows that are not claimable now live elsewhere ('scheduled',
# 'processing', 'expired'; see _schema), so the walk does not pass over
# them, however many there are. Time moves rows between those states without
# any write, so before the walk the claim moves the rows whose status
# changed since the last claim; the read-only look below tells, with one
# index probe per kind of move, whether there is any. Each row is moved once
# per change, so the moves cost O(1) per job over its life, and a claim
# with nothing to move costs the same however many rows wait.

#: Scheduled rows that came due.
_CAME_DUE = "queue = :queue AND state = 'scheduled' AND run_at <= :now"
#: Claims that lapsed.
_LAPSED = "queue = :queue AND state = 'processing' AND claim_deadline <= :now"
#: Claimable rows that expired: they stay pending (or processing) until
#: sweep_expired moves them, but no claim may hand them out.
_NEWLY_EXPIRED = "queue = :queue AND state IN ('pending', 'lapsed') AND expires_at <= :now"
#: Rows set aside as expired that are not (an injected clock moved back).
_NOT_EXPIRED = "queue = :queue AND state = 'expired' AND expires_at > :now"

#: Lapsed claims with attempts exhausted, which the claim dead-letters first.
_EXHAUSTED = f"{_LAPSED} AND attempts >= max_attempts"
_BURY_EXHAUSTED = bury_sql(_EXHAUSTED)
_DELETE_EXHAUSTED = f"DELETE FROM _alkstore_jobs WHERE {_EXHAUSTED}"

_MOVES = (
    # Expired already? Then straight past 'pending'.
    f"""UPDATE _alkstore_jobs SET state = iif(expires_at <= :now, 'expired', 'pending')
        WHERE {_CAME_DUE}""",
    # After the exhausted ones moved to the dead table: attempts remain.
    f"""UPDATE _alkstore_jobs SET state = iif(expires_at <= :now, 'expired', 'lapsed')
        WHERE {_LAPSED}""",
    f"UPDATE _alkstore_jobs SET state = 'expired' WHERE {_NEWLY_EXPIRED}",
    f"""UPDATE _alkstore_jobs SET state = CASE
            WHEN claim_deadline IS NULL THEN iif(run_at > :now, 'scheduled', 'pending')
            WHEN claim_deadline > :now THEN 'processing'
            ELSE 'lapsed' END
        WHERE {_NOT_EXPIRED}""",
)

# Each state's rows are claimable but for an instant that an injected clock
# moved backwards, so the walks still check every instant.
_NOT_EXPIRED_NOW = "(expires_at IS NULL OR expires_at > :now)"
_DUE = f"queue = :queue AND state = 'pending' AND run_at <= :now AND {_NOT_EXPIRED_NOW}"
_RECLAIMABLE = (
    "queue = :queue AND state = 'lapsed' AND claim_deadline <= :now "
    f"AND attempts < max_attempts AND {_NOT_EXPIRED_NOW}"
)

#: A paused queue's claims hand out nothing and write nothing, so every
#: statement of the claim that could write tests this first: one primary-key
#: probe of the small queues table, evaluated once per statement.
_PAUSED = "EXISTS (SELECT 1 FROM _alkstore_queues WHERE name = :queue AND paused = 1)"
_PAUSED_NOW = f"SELECT {_PAUSED}"

#: What :data:`LOOK` answers.
NOTHING, DUE, RECLAIMABLE, BOTH, MOVES = 0, 1, 2, 3, 4

# A claim first looks in a read snapshot, which takes no lock: an empty poll
# never queues for the write lock, and a claim never waits behind another
# connection's open write transaction only to find nothing. The answer also
# picks the cheapest statement that can do the claim. A paused queue has
# nothing to hand out. The probes for moves come next and short-circuit, so
# the walks only run when nothing needs moving, and then stop at their first
# row.
LOOK = f"""
    SELECT CASE
        WHEN {_PAUSED} THEN {NOTHING}
        WHEN EXISTS (SELECT 1 FROM _alkstore_jobs WHERE {_CAME_DUE})
          OR EXISTS (SELECT 1 FROM _alkstore_jobs WHERE {_LAPSED})
          OR EXISTS (SELECT 1 FROM _alkstore_jobs WHERE {_NEWLY_EXPIRED})
          OR EXISTS (SELECT 1 FROM _alkstore_jobs WHERE {_NOT_EXPIRED})
        THEN {MOVES}
        ELSE EXISTS (SELECT 1 FROM _alkstore_jobs WHERE {_DUE})
             + 2 * EXISTS (SELECT 1 FROM _alkstore_jobs WHERE {_RECLAIMABLE})
    END
"""

_CLAIM_SET = """
    UPDATE _alkstore_jobs
    SET state = 'processing',
        attempts = attempts + 1,
        worker_id = :worker,
        claim_deadline = :now + max(1, CAST(round(visibility_timeout_s * 1e6) AS INTEGER)
            - (visibility_timeout_s * 1e6 - CAST(visibility_timeout_s * 1e6 AS INTEGER) = 0.5
               AND CAST(visibility_timeout_s * 1e6 AS INTEGER) % 2 = 0))
"""
# The deadline uses the row's own visibility timeout, at least one
# microsecond so that a claim never starts out lapsed. Its microseconds are
# rounded half to even, as the core's duration_us (Python's round) rounds a
# heartbeat's and PostgreSQL's make_interval (rint) the other engine's
# claims: SQLite's round() takes halves away from zero, so an exact half
# (a timeout of 2.5e-6 s) loses the excess it added. The timeout is > 0. Each statement
# re-selects under the write lock, so rows that others took since the look
# are skipped: a single statement is atomic, and no row is handed out twice.
# For the same reason each tests the pause again: a pause that committed
# since the look stops it.

#: The common claim: only pending rows are eligible. The walk of the pending
#: index in claim order stops after n rows; no sort, no temporary table
#: beyond the n ids.
CLAIM_DUE = f"""
    {_CLAIM_SET}
    WHERE NOT {_PAUSED} AND id IN (
        SELECT id FROM _alkstore_jobs WHERE {_DUE}
        ORDER BY priority DESC, run_at, id
        LIMIT :n)
    RETURNING {LIVE_COLUMNS}
"""
#: ``CLAIM_DUE`` for one row: a scalar subquery needs no temporary table.
CLAIM_DUE_ONE = f"""
    {_CLAIM_SET}
    WHERE NOT {_PAUSED} AND id = (
        SELECT id FROM _alkstore_jobs WHERE {_DUE}
        ORDER BY priority DESC, run_at, id
        LIMIT 1)
    RETURNING {LIVE_COLUMNS}
"""
#: When lapsed claims are eligible too: each branch walks its own index in
#: claim order and stops after n rows, and the outer sort merges at most 2n
#: rows. Its temporary sorter costs more than the plain walk, so it runs
#: only when a reclaim is possible.
CLAIM_ANY = f"""
    {_CLAIM_SET}
    WHERE NOT {_PAUSED} AND id IN (
        SELECT id FROM (
            SELECT id, priority, run_at FROM (
                SELECT id, priority, run_at FROM _alkstore_jobs WHERE {_DUE}
                ORDER BY priority DESC, run_at, id
                LIMIT :n)
            UNION ALL
            SELECT id, priority, run_at FROM (
                SELECT id, priority, run_at FROM _alkstore_jobs WHERE {_RECLAIMABLE}
                ORDER BY priority DESC, run_at, id
                LIMIT :n)
            ORDER BY priority DESC, run_at, id
            LIMIT :n))
    RETURNING {LIVE_COLUMNS}
"""

# NOT INDEXED keeps the planner on rowid lookups for the listed ids instead
# of walking the processing index. The validity test is the handle's
# (_handle._VALID) without the attempt count.
_ACK_BATCH = """
    DELETE FROM _alkstore_jobs NOT INDEXED
    WHERE id IN (SELECT value FROM json_each(?))
      AND queue = ? AND state NOT IN ('pending', 'scheduled') AND claim_deadline > ?
"""
# The same rows, moved to the completed table (docs/contract.md §3
# "Completed jobs"): the copy, then the delete of what it copied, in one
# write transaction.
_VALID_BATCH = """
    id IN (SELECT value FROM json_each(:ids))
    AND queue = :queue AND state NOT IN ('pending', 'scheduled') AND claim_deadline > :now
"""
_COMPLETE_BATCH = complete_sql(_VALID_BATCH).replace(
    "FROM _alkstore_jobs WHERE", "FROM _alkstore_jobs NOT INDEXED WHERE"
)
_DELETE_COMPLETED_BATCH = f"DELETE FROM _alkstore_jobs NOT INDEXED WHERE {_VALID_BATCH}"
_DELETE_TAKEN = "DELETE FROM _alkstore_jobs WHERE id IN (SELECT value FROM json_each(?))"
_CANCEL = "DELETE FROM _alkstore_jobs WHERE id = ? AND queue = ?"
_GET_JOB = f"""
    SELECT {LIVE_COLUMNS} FROM _alkstore_jobs WHERE id = :id AND queue = :queue
    UNION ALL
    SELECT {DEAD_COLUMNS} FROM _alkstore_dead WHERE id = :id AND queue = :queue
    UNION ALL
    SELECT {COMPLETED_COLUMNS} FROM _alkstore_completed WHERE id = :id AND queue = :queue
"""
# Every state, so that the expiry index answers with one range per state.
_EXPIRED = (
    "queue = :queue AND expires_at <= :now AND state IN "
    "('pending', 'scheduled', 'processing', 'lapsed', 'expired')"
)
_BURY_EXPIRED = bury_sql(_EXPIRED)
_DELETE_EXPIRED = f"DELETE FROM _alkstore_jobs WHERE {_EXPIRED}"
_PURGE = "DELETE FROM _alkstore_dead WHERE queue = ? AND died_at <= ?"
_PURGE_COMPLETED = "DELETE FROM _alkstore_completed WHERE queue = ? AND finished_at <= ?"
# One statement reads one snapshot, so the four counts agree. The public
# counts go by the instants, whatever the private state says (an injected
# clock may have moved back since it was set); each term counts one state
# through its own index (every 'expired' row has an expires_at, which lets
# the expiry index serve it).
_STATS = """
    SELECT
        (SELECT count(*) FROM _alkstore_jobs
         WHERE queue = :queue AND state = 'pending' AND run_at <= :now)
        + (SELECT count(*) FROM _alkstore_jobs
           WHERE queue = :queue AND state = 'scheduled' AND run_at <= :now)
        + (SELECT count(*) FROM _alkstore_jobs
           WHERE queue = :queue AND state = 'expired' AND expires_at IS NOT NULL
             AND claim_deadline IS NULL
             AND run_at <= :now),
        (SELECT count(*) FROM _alkstore_jobs
         WHERE queue = :queue AND state = 'pending' AND run_at > :now)
        + (SELECT count(*) FROM _alkstore_jobs
           WHERE queue = :queue AND state = 'scheduled' AND run_at > :now)
        + (SELECT count(*) FROM _alkstore_jobs
           WHERE queue = :queue AND state = 'expired' AND expires_at IS NOT NULL
             AND claim_deadline IS NULL
             AND run_at > :now),
        (SELECT count(*) FROM _alkstore_jobs
         WHERE queue = :queue AND state = 'processing')
        + (SELECT count(*) FROM _alkstore_jobs
           WHERE queue = :queue AND state = 'lapsed')
        + (SELECT count(*) FROM _alkstore_jobs
           WHERE queue = :queue AND state = 'expired' AND expires_at IS NOT NULL
             AND claim_deadline IS NOT NULL),
        (SELECT count(*) FROM _alkstore_dead WHERE queue = :queue)
"""

# The processing rows whose claim has lapsed, in every private state that
# holds a claim (the claim moves lapsed ones to 'lapsed' and expired ones to
# 'expired' only when it next runs); each term by the instants, as _STATS.
# 'processing' is a range of its claim_deadline index; 'lapsed' and
# 'expired' rows are counted from their own index ranges.
_LAPSED_CLAIMS = """
    SELECT
        (SELECT count(*) FROM _alkstore_jobs
         WHERE queue = :queue AND state = 'processing' AND claim_deadline <= :now)
        + (SELECT count(*) FROM _alkstore_jobs
           WHERE queue = :queue AND state = 'lapsed' AND claim_deadline <= :now)
        + (SELECT count(*) FROM _alkstore_jobs
           WHERE queue = :queue AND state = 'expired' AND expires_at IS NOT NULL
             AND claim_deadline <= :now)
"""


def job_row(queue: str, resolved: Resolved, payload: EncodedPayload) -> tuple[Any, ...]:
    """The values of the job insert (:func:`insert_one`) for one new job of
    ``queue``, as ``Queue._insert`` stamps it."""
    expires_at = resolved.expires_at
    return (
        queue,
        # The claim's walk never sees a row that is not due yet.
        "scheduled" if resolved.run_at > resolved.enqueued_at else "pending",
        payload.data,
        payload.content_type,
        resolved.priority,
        to_us(resolved.run_at),
        None if expires_at is None else to_us(expires_at),
        to_us(resolved.enqueued_at),
        resolved.max_attempts,
        resolved.visibility_timeout_s,
        resolved.backoff_base_s,
        resolved.backoff_cap_s,
    )


def _claim_order(row: Sequence[Any]) -> tuple[int, int, int]:
    # priority DESC, run_at ASC, id ASC over LIVE_COLUMNS positions.
    return (-row[5], row[6], row[0])


def _begins_implicitly(conn: sqlite3.Connection) -> bool:
    """Whether the sqlite3 module opens a transaction by itself before the
    insert (its default, legacy transaction control with an
    ``isolation_level``): the insert then starts the caller's transaction,
    which the caller commits, as its own first write would."""
    legacy = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)
    return getattr(conn, "autocommit", legacy) == legacy and conn.isolation_level is not None


class SqliteQueue(Queue):
    """A queue of a :class:`~alkstore_sqlite.SqliteStore` (docs/contract.md §2, §3).

    ``enqueue_tx`` takes a ``sqlite3.Connection`` to the store's database
    file, inside an open transaction.
    """

    _store: SqliteStore

    def __init__(self, store: SqliteStore, name: str, opts: QueueOpts) -> None:
        super().__init__(store, name, opts)

    # -- enqueue -------------------------------------------------------------

    def _insert(
        self,
        resolved: Resolved,
        payloads: Sequence[EncodedPayload],
        unique_keys: Sequence[str | None] | None,
    ) -> list[int]:
        pool = self._store._pool
        newest: int | None
        if unique_keys is not None:
            rows = [job_row(self._name, resolved, p) for p in payloads]
            ids, newest = pool.transaction(insert_keyed, rows, unique_keys)
        elif len(payloads) == 1:
            ids = [pool.run(insert_one, job_row(self._name, resolved, payloads[0]))]
            newest = ids[0]
        else:
            first = job_row(self._name, resolved, payloads[0])
            rows = [(*first[:2], p.data, p.content_type, *first[4:]) for p in payloads]
            ids = pool.transaction(_insert_many, rows)
            newest = ids[-1]
        # With the newest id, so the file watcher recognises the commit as
        # delivered when it sees the same rows.
        if newest is not None:
            notify(self._store._wake_key, self._name, newest)
        return ids

    def _insert_tx(
        self, conn: Any, resolved: Resolved, payload: EncodedPayload, unique_key: str | None
    ) -> int:
        cursor = self._tx_cursor(conn)
        # The caller's connection, not the pool's: ask the guard here.
        self._store._pool.guard.check()
        row = job_row(self._name, resolved, payload)
        try:
            if unique_key is None:
                # One statement is atomic: if it fails, the caller's
                # transaction is left as it was.
                job_id = cursor.execute(_INSERT, row).lastrowid
            else:
                # The insert (or not) and the read of the holder are in the
                # caller's write transaction: nobody else writes in between.
                job_id = insert_keyed(cursor.connection, [row], [unique_key])[0][0]
        except sqlite3.Error as error:
            raise engine_error(error) from error
        assert job_id is not None
        return job_id

    def _tx_cursor(self, conn: object) -> sqlite3.Cursor:
        """Check ``enqueue_tx``'s connection with reads only; return a cursor
        on it that yields plain tuples."""
        if not isinstance(conn, sqlite3.Connection):
            raise ValidationError(
                "enqueue_tx needs a sqlite3.Connection to the store's database "
                f"{self._store.path!r}, not {type(conn).__module__}.{type(conn).__qualname__}"
            )
        try:
            in_transaction = conn.in_transaction
            cursor = conn.cursor()
            # The caller's row_factory must not change how we read rows.
            cursor.row_factory = None
            databases = cursor.execute("PRAGMA database_list").fetchall()
        except sqlite3.ProgrammingError as error:
            # Closed, or created in another thread with check_same_thread.
            hint = (
                " (a connection used from another thread, as an async store's "
                "enqueue_tx uses it from one of its threads, must be opened with "
                "sqlite3.connect(..., check_same_thread=False); docs/async.md)"
                if "thread" in str(error)
                else ""
            )
            refused = f"enqueue_tx cannot use this connection: {error}{hint}"
            raise ValidationError(refused) from error
        except sqlite3.Error as error:
            raise engine_error(error) from error
        main = next((os.fsdecode(row[2]) for row in databases if row[1] == "main"), "")
        if not main or not _same_file(main, self._store.path):
            raise ValidationError(
                f"enqueue_tx needs a connection to the store's database "
                f"{self._store.path!r}; this one is on {main or 'a temporary database'!r}"
            )
        if not in_transaction and not _begins_implicitly(conn):
            raise ValidationError(
                "enqueue_tx needs the connection inside an open transaction "
                "(execute BEGIN first); alkstore never commits it"
            )
        return cursor

    # -- claim ---------------------------------------------------------------

    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        params = {
            "queue": self._name,
            "worker": worker_id,
            "now": to_us(self._store._now()),
            # No table holds more rows than SQLite's largest integer, which
            # is also the largest LIMIT it binds.
            "n": min(n, _INT64_MAX),
            "error": MAX_ATTEMPTS_EXCEEDED,
        }
        rows = self._store._pool.run(_claim_rows, params)
        if len(rows) > 1:
            rows.sort(key=_claim_order)
        return [SqliteJobHandle(self, job) for job in jobs_from_rows(rows)]

    # -- other operations ----------------------------------------------------

    def _ack_batch(self, job_ids: list[int]) -> int:
        ids = [i for i in job_ids if _INT64_MIN <= i <= _INT64_MAX]
        if not ids:
            return 0
        now = to_us(self._store._now())
        return self._store._pool.run(rowcount, _ACK_BATCH, (json.dumps(ids), self._name, now))

    def _ack_many(self, handles: list[JobHandle]) -> list[bool]:
        # Each claim by the handle's own statement, one transaction, one
        # clock read (docs/contract.md §3 "ack_many(handles)").
        now = to_us(self._store._now())
        claims = [{"id": h.id, "attempts": h.attempts, "now": now} for h in handles]
        return self._store._pool.transaction(ack_each, claims)

    def _complete_batch(self, job_ids: list[int]) -> int:
        ids = [i for i in job_ids if _INT64_MIN <= i <= _INT64_MAX]
        if not ids:
            return 0
        now = to_us(self._store._now())
        params = {"ids": json.dumps(ids), "queue": self._name, "now": now, "result": None}
        return self._store._pool.transaction(_complete_batch, params)

    def _complete_many(self, handles: list[JobHandle], results: list[bytes | None]) -> list[bool]:
        # Two statements for the batch, one clock read (docs/contract.md §3
        # "Completed jobs"): a JSON result is UTF-8 text, and travels as such.
        claims = [
            [h.id, h.attempts, None if result is None else result.decode()]
            for h, result in zip(handles, results, strict=True)
        ]
        params = {
            "claims": json.dumps(claims, ensure_ascii=False),
            "queue": self._name,
            "now": to_us(self._store._now()),
        }
        taken = self._store._pool.transaction(_complete_claims, params)
        return [(h.id, h.attempts) in taken for h in handles]

    def _cancel(self, job_id: int) -> bool:
        if not _INT64_MIN <= job_id <= _INT64_MAX:
            return False
        return self._store._pool.run(rowcount, _CANCEL, (job_id, self._name)) == 1

    def _get_job(self, job_id: int) -> Job | None:
        if not _INT64_MIN <= job_id <= _INT64_MAX:
            return None
        row = self._store._pool.run(fetchone, _GET_JOB, {"id": job_id, "queue": self._name})
        return None if row is None else job_from_row(row)

    def _sweep_expired(
        self, retention_s: float | None, keep_completed_s: float | None
    ) -> SweepResult:
        now = to_us(self._store._now())
        purge_before = None if retention_s is None else now - duration_us(retention_s)
        finished_before = None if keep_completed_s is None else now - duration_us(keep_completed_s)
        return self._store._pool.transaction(_sweep, self._name, now, purge_before, finished_before)

    def _stats(self) -> QueueStats:
        now = to_us(self._store._now())
        row = self._store._pool.run(fetchone, _STATS, {"queue": self._name, "now": now})
        assert row is not None
        return QueueStats(*row)

    def _lapsed_claims(self) -> int:
        now = to_us(self._store._now())
        row = self._store._pool.run(fetchone, _LAPSED_CLAIMS, {"queue": self._name, "now": now})
        assert row is not None
        return int(row[0])

    # -- the operator's (_operations) ----------------------------------------

    def _set_paused(self, paused: bool) -> bool:
        return _operations.set_paused(self, paused)

    def _is_paused(self) -> bool:
        return _operations.is_paused(self)

    def _dead_jobs(self, limit: int, after_id: int | None) -> list[Job]:
        return _operations.dead_jobs(self, limit, after_id)

    def _requeue(self, job_id: int, now: datetime, run_at: datetime) -> bool:
        return _operations.requeue(self, job_id, now, run_at)

    def _run_now(self, job_id: int, now: datetime) -> bool:
        return _operations.run_now(self, job_id, now)

    def _purge_dead(self, cutoff: datetime | None) -> int:
        return _operations.purge_dead(self, cutoff)

    def _jobs(
        self, state: ListedState, limit: int, after_id: int | None, now: datetime
    ) -> list[Job]:
        return _operations.jobs(self, state, limit, after_id, now)

    def _completed_count(self) -> int:
        return _operations.completed_count(self)

    # -- the workers' reports (_workers) -------------------------------------

    def _add_throughput(
        self, minute: datetime, completed: int, retried: int, dead: int, prune_before: datetime
    ) -> None:
        _workers.add_throughput(self, minute, (completed, retried, dead), prune_before)

    def _throughput(self, since: datetime) -> list[ThroughputPoint]:
        return _workers.throughput(self, since)


# -- operations run on a borrowed connection ---------------------------------


def insert_one(conn: sqlite3.Connection, row: tuple[Any, ...]) -> int:
    """Insert the job of :func:`job_row`; return its id. On an autocommit
    connection the one statement is its own transaction."""
    job_id = conn.execute(_INSERT, row).lastrowid
    assert job_id is not None
    return job_id


def insert_keyed(
    conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]], keys: Sequence[str | None]
) -> tuple[list[int], int | None]:
    """Insert the jobs of :func:`job_row` with their unique keys, one by one
    in list order, inside the caller's write transaction: a job whose key a
    live row holds (one of the earlier ones included) is not inserted and
    gets that row's id. Returns the ids and the newest id inserted (``None``
    when every job was already there)."""
    ids: list[int] = []
    newest: int | None = None
    for row, key in zip(rows, keys, strict=True):
        cursor = conn.execute(_INSERT_UNIQUE, (*row, key))
        if cursor.rowcount == 1:
            assert cursor.lastrowid is not None
            newest = cursor.lastrowid
            ids.append(newest)
        else:
            ids.append(conn.execute(_HOLDER, (row[0], key)).fetchone()[0])
    return ids, newest


def _insert_many(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> list[int]:
    conn.executemany(_INSERT, rows)
    # AUTOINCREMENT under the write lock hands out consecutive ids.
    last: int = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
    return list(range(last - len(rows) + 1, last + 1))


def _claim_rows(conn: sqlite3.Connection, params: dict[str, Any]) -> list[Any]:
    found = conn.execute(LOOK, params).fetchone()[0]
    rows: list[Any]
    if found == MOVES:
        # The moves (and the dead-letter step) and the claim share one write
        # transaction.
        rows = run_in_transaction(conn, _move_and_claim, params)
    elif found == DUE:
        sql = CLAIM_DUE_ONE if params["n"] == 1 else CLAIM_DUE
        rows = conn.execute(sql, params).fetchall()
    elif found in (RECLAIMABLE, BOTH):
        rows = conn.execute(CLAIM_ANY, params).fetchall()
    else:
        assert found == NOTHING
        rows = []
    return rows


def _move_and_claim(conn: sqlite3.Connection, params: dict[str, Any]) -> list[Any]:
    # Paused since the look: no dead-lettering, no moves, no claim.
    if conn.execute(_PAUSED_NOW, params).fetchone()[0]:
        return []
    if conn.execute(_BURY_EXHAUSTED, params).rowcount:
        conn.execute(_DELETE_EXHAUSTED, params)
    for sql in _MOVES:
        conn.execute(sql, params)
    rows: list[Any] = conn.execute(CLAIM_ANY, params).fetchall()
    return rows


def _sweep(
    conn: sqlite3.Connection,
    queue: str,
    now: int,
    purge_before: int | None,
    finished_before: int | None,
) -> SweepResult:
    params = {"queue": queue, "now": now, "error": EXPIRED}
    expired = conn.execute(_BURY_EXPIRED, params).rowcount
    if expired:
        conn.execute(_DELETE_EXPIRED, params)
    purged = 0
    if purge_before is not None:
        purged = conn.execute(_PURGE, (queue, purge_before)).rowcount
    if finished_before is not None:
        purged += conn.execute(_PURGE_COMPLETED, (queue, finished_before)).rowcount
    return SweepResult(expired, purged)


def _complete_claims(conn: sqlite3.Connection, params: dict[str, Any]) -> set[tuple[int, int]]:
    # Inside BEGIN IMMEDIATE: the copy, then the delete of what it took.
    taken = {(row[0], row[1]) for row in conn.execute(COMPLETE_CLAIMS, params)}
    if taken:
        ids = json.dumps([job_id for job_id, _ in taken])
        conn.execute(_DELETE_TAKEN, (ids,))
    return taken


def _complete_batch(conn: sqlite3.Connection, params: dict[str, Any]) -> int:
    # Inside BEGIN IMMEDIATE: the delete's predicate matches exactly the
    # rows the copy took.
    moved = conn.execute(_COMPLETE_BATCH, params).rowcount
    if moved:
        conn.execute(_DELETE_COMPLETED_BATCH, params)
    return moved


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
