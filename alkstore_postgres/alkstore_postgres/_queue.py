"""The PostgreSQL :class:`~alkstore.Queue`: enqueue, claim and the
queue-wide operations (SPEC §3).

Every operation is one statement on an autocommit pool connection: one
round trip, one transaction. Each takes one reading of the store's clock
(the injected one, or the server's, see :mod:`alkstore_postgres._clock`)
and passes it as the parameter ``now``, so a statement never reads a clock
of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from alkstore import Job, JobHandle, Queue, QueueOpts, QueueStats, SweepResult
from alkstore.engine import EXPIRED, MAX_ATTEMPTS_EXCEEDED, EncodedPayload, Resolved
from alkstore.errors import EngineError, ValidationError
from alkstore_postgres._connection import wrap_errors
from alkstore_postgres._handle import PostgresJobHandle
from alkstore_postgres._rows import DEAD_COLUMNS, LIVE_COLUMNS, MOVED_COLUMNS, job_from_row
from alkstore_postgres._schema import Statement
from alkstore_postgres._wake import channel_name

if TYPE_CHECKING:
    from alkstore_postgres._store import PostgresStore

__all__ = ["PostgresQueue"]

# Job ids are bigint: a larger int cannot name a job (and would not bind).
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
# How many times ack_batch runs when PostgreSQL aborts it as a deadlock victim.
_DEADLOCK_ATTEMPTS = 3

_COLUMNS = sql.SQL(
    "queue, state, payload, content_type, priority, run_at, expires_at, enqueued_at, "
    "max_attempts, visibility_timeout_s, backoff_base_s, backoff_cap_s"
)

# The wake is sent in the enqueueing transaction, so only a commit wakes
# anyone, and it carries no job body (SPEC §3 "Wake"). The ``wake`` CTE has a
# volatile function, so PostgreSQL evaluates it exactly once.
INSERT = Statement(
    sql.SQL("""
    WITH ins AS (
        INSERT INTO {jobs} ({columns})
        VALUES (%(queue)s, %(state)s, %(payload)s, %(content_type)s, %(priority)s,
                %(run_at)s, %(expires_at)s::timestamptz, %(enqueued_at)s,
                %(max_attempts)s, %(visibility_timeout_s)s, %(backoff_base_s)s,
                %(backoff_cap_s)s)
        RETURNING id
    ), wake AS (
        SELECT pg_notify(%(channel)s, '')
    )
    SELECT ins.id FROM ins, wake
"""),
    columns=_COLUMNS,
)

# One round trip for any number of jobs: the payloads travel as two arrays.
# The identity default is evaluated above the sort on the ordinality, so the
# ids increase in list order.
INSERT_MANY = Statement(
    sql.SQL("""
    WITH ins AS (
        INSERT INTO {jobs} ({columns})
        SELECT %(queue)s, %(state)s, p.payload, p.content_type, %(priority)s,
               %(run_at)s, %(expires_at)s::timestamptz, %(enqueued_at)s,
               %(max_attempts)s, %(visibility_timeout_s)s, %(backoff_base_s)s,
               %(backoff_cap_s)s
        FROM unnest(%(payloads)s::bytea[], %(content_types)s::text[])
             WITH ORDINALITY AS p (payload, content_type, ord)
        ORDER BY p.ord
        RETURNING id
    ), wake AS (
        SELECT pg_notify(%(channel)s, '')
    )
    SELECT ins.id FROM ins, wake
"""),
    columns=_COLUMNS,
)

# One statement, in steps that each touch only rows they act on:
# (1) this queue's lapsed claims on their last allowed attempt move to the
#     dead table (the lapsed end of ``jobs_exhausted``);
# (2) ``came_due`` locks this queue's scheduled rows that came due since the
#     last claim (the due end of ``jobs_scheduled``);
# (3) ``due`` walks ``jobs_pending`` and ``lapsed`` walks ``jobs_reclaim``
#     in claim order, each locking up to n eligible rows and skipping rows
#     other claimers hold;
# (4) the best n of the three are claimed, and the came-due rows not
#     claimed move to pending, where later claims find them in order.
# Every CTE reads the statement's one snapshot, so a row a CTE modified is
# invisible to the others as modified (a second UPDATE of it would be
# silently skipped): the two UPDATEs therefore take disjoint rows, and a
# came-due row is claimed straight from 'scheduled' rather than promoted
# first. Its rows are few (those that came due since the last claim), so
# merging them into the sort costs what moving them does: each row is moved
# once. Rows locked but not picked are released at commit. Row locks plus
# the re-check of the WHERE clause on the newest row version make the
# hand-out exactly-once.
CLAIM = Statement(
    sql.SQL("""
    WITH exhausted AS (
        SELECT id FROM {jobs}
        WHERE queue = %(queue)s AND state = 'processing'
          AND claim_deadline <= %(now)s AND attempts >= max_attempts
        FOR UPDATE SKIP LOCKED
    ), moved AS (
        DELETE FROM {jobs} WHERE id IN (SELECT id FROM exhausted)
        RETURNING {moved}
    ), buried AS (
        INSERT INTO {dead} ({moved}, last_error, died_at)
        SELECT {moved}, {exceeded}, %(now)s FROM moved
    ), came_due AS (
        -- Expired ones too: they move to pending (never claimed) and wait
        -- there for sweep_expired, out of this range.
        SELECT id, priority, run_at, expires_at FROM {jobs}
        WHERE queue = %(queue)s AND state = 'scheduled' AND run_at <= %(now)s
        FOR UPDATE SKIP LOCKED
    ), due AS (
        -- run_at <= now still: version 1 rows, or an injected clock that
        -- moved backwards, may leave future rows here.
        SELECT id, priority, run_at FROM {jobs}
        WHERE queue = %(queue)s AND state = 'pending' AND run_at <= %(now)s
          AND (expires_at IS NULL OR expires_at > %(now)s)
        ORDER BY priority DESC, run_at, id
        LIMIT %(n)s
        FOR UPDATE SKIP LOCKED
    ), lapsed AS (
        SELECT id, priority, run_at FROM {jobs}
        WHERE queue = %(queue)s AND state = 'processing'
          AND claim_deadline <= %(now)s AND attempts < max_attempts
          AND (expires_at IS NULL OR expires_at > %(now)s)
        ORDER BY priority DESC, run_at, id
        LIMIT %(n)s
        FOR UPDATE SKIP LOCKED
    ), picked AS (
        SELECT id FROM (
            SELECT * FROM due
            UNION ALL
            SELECT id, priority, run_at FROM came_due
            WHERE expires_at IS NULL OR expires_at > %(now)s
            UNION ALL
            SELECT * FROM lapsed
        ) AS candidates
        ORDER BY priority DESC, run_at, id
        LIMIT %(n)s
    ), promoted AS (
        -- An array, so that the plan is primary-key probes whatever the
        -- generic plan guesses about came_due's size.
        UPDATE {jobs} SET state = 'pending'
        WHERE id = ANY(ARRAY(
            SELECT id FROM came_due WHERE id NOT IN (SELECT id FROM picked)))
    )
    UPDATE {jobs}
    SET state = 'processing',
        attempts = attempts + 1,
        worker_id = %(worker_id)s,
        -- At least a microsecond, so that a claim never starts lapsed.
        claim_deadline = %(now)s + greatest(
            make_interval(secs => visibility_timeout_s), interval '1 microsecond')
    WHERE id IN (SELECT id FROM picked)
    RETURNING {live}
"""),
    moved=MOVED_COLUMNS,
    live=LIVE_COLUMNS,
    exceeded=sql.Literal(MAX_ATTEMPTS_EXCEEDED),
)

ACK_BATCH = sql.SQL("""
    DELETE FROM {jobs}
    WHERE id = ANY(%(ids)s::bigint[]) AND queue = %(queue)s
      AND state = 'processing' AND claim_deadline > %(now)s
""")

CANCEL = sql.SQL("DELETE FROM {jobs} WHERE id = %(id)s AND queue = %(queue)s")

# One statement, one snapshot: the job is in exactly one of the tables.
GET_JOB = Statement(
    sql.SQL("""
    SELECT {live} FROM {jobs} WHERE id = %(id)s AND queue = %(queue)s
    UNION ALL
    SELECT {dead_columns} FROM {dead} WHERE id = %(id)s AND queue = %(queue)s
"""),
    live=LIVE_COLUMNS,
    dead_columns=DEAD_COLUMNS,
)

# SKIP LOCKED on both steps: sweepers running at once split the rows
# between them and never wait for (or deadlock with) each other. Rows moved
# by this sweep have died_at = now; when the retention is zero they are
# purged at once (not inserted), as "move, then purge" would do.
SWEEP_EXPIRED = Statement(
    sql.SQL("""
    WITH expired AS (
        SELECT id FROM {jobs}
        WHERE queue = %(queue)s AND expires_at <= %(now)s
        FOR UPDATE SKIP LOCKED
    ), moved AS (
        DELETE FROM {jobs} WHERE id IN (SELECT id FROM expired)
        RETURNING {moved}
    ), buried AS (
        INSERT INTO {dead} ({moved}, last_error, died_at)
        SELECT {moved}, {expired}, %(now)s FROM moved WHERE %(keep_moved)s
    ), old AS (
        SELECT id FROM {dead}
        WHERE queue = %(queue)s AND died_at <= %(cutoff)s::timestamptz
        FOR UPDATE SKIP LOCKED
    ), purged AS (
        DELETE FROM {dead} WHERE id IN (SELECT id FROM old)
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM purged)
"""),
    moved=MOVED_COLUMNS,
    expired=sql.Literal(EXPIRED),
)

# Four counts from one snapshot, each an index range where possible. The
# public counts go by the instants, whatever the private state says (rows
# version 1 left pending with a future run_at; an injected clock that moved
# backwards).
STATS = sql.SQL("""
    SELECT
        (SELECT count(*) FROM {jobs}
         WHERE queue = %(queue)s AND state = 'pending' AND run_at <= %(now)s)
        + (SELECT count(*) FROM {jobs}
           WHERE queue = %(queue)s AND state = 'scheduled' AND run_at <= %(now)s),
        (SELECT count(*) FROM {jobs}
         WHERE queue = %(queue)s AND state = 'pending' AND run_at > %(now)s)
        + (SELECT count(*) FROM {jobs}
           WHERE queue = %(queue)s AND state = 'scheduled' AND run_at > %(now)s),
        (SELECT count(*) FROM {jobs} WHERE queue = %(queue)s AND state = 'processing'),
        (SELECT count(*) FROM {dead} WHERE queue = %(queue)s)
""")


class PostgresQueue(Queue):
    """A handle on one named queue of a :class:`PostgresStore` (SPEC §2).

    ``enqueue_tx`` takes a ``psycopg.Connection`` (3.x) to the store's
    database, inside an open transaction.
    """

    def __init__(self, store: PostgresStore, name: str, opts: QueueOpts) -> None:
        super().__init__(store, name, opts)
        self._pg_store = store
        self._channel = channel_name(store.schema, name)

    @property
    def channel(self) -> str:
        """The NOTIFY channel that wakes this queue's subscribers."""
        return self._channel

    def _stamps(self, resolved: Resolved) -> dict[str, Any]:
        return {
            "queue": self._name,
            # The claim's walk never sees a row that is not due yet.
            "state": "scheduled" if resolved.run_at > resolved.enqueued_at else "pending",
            "channel": self._channel,
            "priority": resolved.priority,
            "run_at": resolved.run_at,
            "expires_at": resolved.expires_at,
            "enqueued_at": resolved.enqueued_at,
            "max_attempts": resolved.max_attempts,
            "visibility_timeout_s": resolved.visibility_timeout_s,
            "backoff_base_s": resolved.backoff_base_s,
            "backoff_cap_s": resolved.backoff_cap_s,
        }

    # -- engine primitives ---------------------------------------------------

    def _insert(self, resolved: Resolved, payloads: Sequence[EncodedPayload]) -> list[int]:
        store = self._pg_store
        params = self._stamps(resolved)
        if len(payloads) == 1:
            params["payload"], params["content_type"] = payloads[0]
            query = store.sql(INSERT)
        else:
            params["payloads"] = [p.data for p in payloads]
            params["content_types"] = [p.content_type for p in payloads]
            query = store.sql(INSERT_MANY)
        with store._db.connection() as conn:
            rows = conn.execute(query, params, prepare=True, binary=True).fetchall()
        return sorted(row[0] for row in rows)

    def _insert_tx(self, conn: Any, resolved: Resolved, payload: EncodedPayload) -> int:
        if not isinstance(conn, psycopg.Connection):
            raise ValidationError(
                "enqueue_tx needs a psycopg.Connection (psycopg 3) to the store's "
                f"database, not {type(conn).__name__}"
            )
        status = conn.info.transaction_status
        if status != TransactionStatus.INTRANS:
            state = {
                TransactionStatus.IDLE: "not inside a transaction (BEGIN first, or use "
                "conn.transaction())",
                TransactionStatus.INERROR: "inside a failed transaction",
                TransactionStatus.ACTIVE: "busy running a command",
                TransactionStatus.UNKNOWN: "closed or broken",
            }.get(status, f"in state {status.name}")
            raise ValidationError(f"enqueue_tx: the connection is {state}")
        params = self._stamps(resolved)
        params["payload"], params["content_type"] = payload
        # The caller's connection may have its own row factory; alkstore
        # never commits or rolls it back.
        with wrap_errors(), conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute(self._pg_store.sql(INSERT), params).fetchone()
        assert row is not None
        job_id: int = row[0]
        return job_id

    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        store = self._pg_store
        now = store._now()
        # LIMIT takes a bigint; no table holds more rows than that anyway.
        params = {"queue": self._name, "now": now, "n": min(n, _INT64_MAX), "worker_id": worker_id}
        with store._db.connection() as conn:
            rows = conn.execute(store.sql(CLAIM), params, prepare=True, binary=True).fetchall()
        jobs = sorted(map(job_from_row, rows), key=_claim_order)
        return [PostgresJobHandle(self, job) for job in jobs]

    def _ack_batch(self, job_ids: list[int]) -> int:
        ids = [i for i in job_ids if _INT64_MIN <= i <= _INT64_MAX]
        if not ids:
            return 0
        store = self._pg_store
        params = {"ids": ids, "queue": self._name, "now": store._now()}
        for attempt in range(_DEADLOCK_ATTEMPTS):
            try:
                with store._db.connection() as conn:
                    return conn.execute(store.sql(ACK_BATCH), params, prepare=True).rowcount
            except EngineError as error:
                # Two batches waiting for each other's rows: PostgreSQL
                # aborted this one, so nothing was acked; acking is
                # idempotent, so run it again.
                deadlock = isinstance(error.__cause__, psycopg.errors.DeadlockDetected)
                if not deadlock or attempt == _DEADLOCK_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _cancel(self, job_id: int) -> bool:
        if not _INT64_MIN <= job_id <= _INT64_MAX:
            return False
        store = self._pg_store
        with store._db.connection() as conn:
            cur = conn.execute(store.sql(CANCEL), {"id": job_id, "queue": self._name}, prepare=True)
            return cur.rowcount == 1

    def _get_job(self, job_id: int) -> Job | None:
        if not _INT64_MIN <= job_id <= _INT64_MAX:
            return None
        store = self._pg_store
        with store._db.connection() as conn:
            row = conn.execute(
                store.sql(GET_JOB), {"id": job_id, "queue": self._name}, prepare=True, binary=True
            ).fetchone()
        return None if row is None else job_from_row(row)

    def _sweep_expired(self, retention_s: float | None) -> SweepResult:
        store = self._pg_store
        now = store._now()
        cutoff = None
        if retention_s is not None:
            try:
                cutoff = now - timedelta(seconds=retention_s)
            except OverflowError:
                cutoff = None  # before year 1: nothing can be that old
        params = {
            "queue": self._name,
            "now": now,
            "cutoff": cutoff,
            "keep_moved": cutoff is None or cutoff < now,
        }
        with store._db.connection() as conn:
            row = conn.execute(store.sql(SWEEP_EXPIRED), params, binary=True).fetchone()
        assert row is not None
        expired, purged = row
        if not params["keep_moved"]:
            purged += expired
        return SweepResult(expired, purged)

    def _stats(self) -> QueueStats:
        store = self._pg_store
        params = {"queue": self._name, "now": store._now()}
        with store._db.connection() as conn:
            row = conn.execute(store.sql(STATS), params, binary=True).fetchone()
        assert row is not None
        return QueueStats(*row)


def _claim_order(job: Job) -> tuple[int, Any, int]:
    return (-job.priority, job.run_at, job.id)
