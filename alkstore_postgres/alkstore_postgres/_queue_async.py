"""The PostgreSQL :class:`~alkstore.AsyncQueue`: enqueue, claim and the
queue-wide operations (docs/contract.md §3).

Every operation is one statement on an autocommit pool connection: one
round trip, one transaction. Each takes one reading of the store's clock
(the injected one, or the server's, see :mod:`alkstore_postgres._clock`)
and passes it as the parameter ``now``, so a statement never reads a clock
of its own. The statements and their parameters are in
:mod:`alkstore_postgres._sql.queue` (``CLAIM`` and ``LAPSED_CLAIMS`` are
re-exported here).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from alkstore import (
    AsyncJobHandle,
    AsyncQueue,
    Job,
    ListedState,
    QueueOpts,
    QueueStats,
    SweepResult,
    ThroughputPoint,
)
from alkstore.engine import EncodedPayload, Resolved
from alkstore.errors import EngineError, ValidationError
from alkstore_postgres import _operations_async, _workers_async
from alkstore_postgres._connection import check_tx_connection, wrap_errors
from alkstore_postgres._database_async import AsyncConn, database_identity
from alkstore_postgres._handle_async import AsyncPostgresJobHandle
from alkstore_postgres._rows import job_from_row
from alkstore_postgres._schema import Statement
from alkstore_postgres._sql.queue import (
    ACK_BATCH,
    ACK_MANY,
    CANCEL,
    CLAIM,
    COMPLETE_BATCH,
    COMPLETE_MANY,
    DEADLOCK_ATTEMPTS,
    GET_JOB,
    INT64_MAX,
    INT64_MIN,
    LAPSED_CLAIMS,
    STATS,
    SWEEP_EXPIRED,
    UNIQUE_ATTEMPTS,
    claim_is_prepared,
    claim_order,
    claim_query,
    insert,
    insert_unique,
    inserted_ids,
    sweep_params,
    sweep_result,
)
from alkstore_postgres._wake import channel_name

if TYPE_CHECKING:
    from alkstore_postgres._store_async import AsyncPostgresStore

__all__ = ["CLAIM", "LAPSED_CLAIMS", "AsyncPostgresQueue"]


class AsyncPostgresQueue(AsyncQueue):
    """A handle on one named queue of a :class:`AsyncPostgresStore` (docs/contract.md §2).

    ``enqueue_tx`` takes a ``psycopg.AsyncConnection`` (3.x) to the store's
    database, inside an open transaction.
    """

    def __init__(self, store: AsyncPostgresStore, name: str, opts: QueueOpts) -> None:
        super().__init__(store, name, opts)
        self._pg_store = store
        self._channel = channel_name(store.schema, name)

    @property
    def channel(self) -> str:
        """The NOTIFY channel that wakes this queue's subscribers."""
        return self._channel

    # -- engine primitives ---------------------------------------------------

    async def _insert(
        self,
        resolved: Resolved,
        payloads: Sequence[EncodedPayload],
        unique_keys: Sequence[str | None] | None,
    ) -> list[int]:
        store = self._pg_store
        if unique_keys is not None:
            # One statement per job, in one transaction when there are
            # several: each sees the rows the ones before it inserted.
            async with store._db.connection() as conn:
                if len(payloads) == 1:
                    return [await self._insert_on(conn, resolved, payloads[0], unique_keys[0])]
                async with conn.transaction():
                    return [
                        await self._insert_on(conn, resolved, payload, key)
                        for payload, key in zip(payloads, unique_keys, strict=True)
                    ]
        statement, params = insert(self._name, self._channel, resolved, payloads)
        # Prepared on each pooled connection after its first use, parameters
        # and results in binary: psycopg's own fast path.
        async with store._db.connection() as conn:
            cur = await conn.execute(store.sql(statement), params, prepare=True, binary=True)
            row = await cur.fetchone()
        return inserted_ids(row, len(payloads))

    async def _insert_tx(
        self, conn: Any, resolved: Resolved, payload: EncodedPayload, unique_key: str | None
    ) -> int:
        check_tx_connection(conn, psycopg.AsyncConnection)
        store = self._pg_store
        with wrap_errors():
            theirs = await database_identity(conn)
            if not await store._is_own_database(theirs):
                where = "another server" if theirs[1] == store._database[1] else repr(theirs[1])
                raise ValidationError(
                    f"enqueue_tx needs a connection to the store's database "
                    f"({store._database[1]!r} of {store._url}); this one is on {where}"
                )
            return await self._insert_on(conn, resolved, payload, unique_key)

    async def _insert_on(
        self,
        conn: AsyncConn,
        resolved: Resolved,
        payload: EncodedPayload,
        unique_key: str | None = None,
    ) -> int:
        """The insert of ``_insert_tx`` in ``conn``'s open transaction, with
        no check of ``conn``: for a connection the engine already knows is
        its database's (a schedule's firing borrows one from the pool; the
        identity check would borrow a second after a restart, which a pool
        of one never has). Never commits or rolls back. With a
        ``unique_key``, the id of the live job holding it if there is one
        (``INSERT_UNIQUE``)."""
        sql_text = self._pg_store.sql
        # The caller's connection may have its own row factory and cursor
        # class (Django's client-side cursors): a cursor of our own.
        async with psycopg.AsyncCursor(conn, row_factory=tuple_row) as cur:
            if unique_key is None:
                statement, params = insert(self._name, self._channel, resolved, [payload])
                row = await (await cur.execute(sql_text(statement), params)).fetchone()
                return inserted_ids(row, 1)[0]
            statement, params = insert_unique(
                self._name, self._channel, resolved, payload, unique_key
            )
            for _ in range(UNIQUE_ATTEMPTS):
                row = await (await cur.execute(sql_text(statement), params)).fetchone()
                if row is not None:
                    job_id: int = row[0]
                    return job_id
        raise EngineError(
            f"enqueue with unique key {unique_key!r} in queue {self._name!r}: the key changed "
            f"hands {UNIQUE_ATTEMPTS} times while the enqueue ran; try again"
        )

    async def _claim(self, worker_id: str, n: int) -> list[AsyncJobHandle]:
        store = self._pg_store
        # LIMIT takes a bigint; no table holds more rows than that anyway.
        n = min(n, INT64_MAX)
        # Another n is sent unprepared: planned at its call, knowing its LIMIT.
        prepare = claim_is_prepared(n)
        query = claim_query(store.schema, n)
        begun = time.monotonic()
        async with store._db.connection() as conn, psycopg.AsyncRawCursor(conn) as cur:
            # Read once the connection is at hand (AsyncPostgresStore._now_on).
            params = (self._name, await store._now_on(conn), worker_id)
            await cur.execute(query, params, prepare=prepare, binary=True)
            rows = await cur.fetchall()
        # A slow claim may be walking dead rows that vacuum cannot remove (a
        # long transaction elsewhere): compaction takes them out (_compact).
        await store._compactor.after_claim(time.monotonic() - begun, n)
        jobs = sorted(map(job_from_row, rows), key=claim_order)
        return [AsyncPostgresJobHandle(self, job) for job in jobs]

    async def _ack_batch(self, job_ids: list[int]) -> int:
        ids = [i for i in job_ids if INT64_MIN <= i <= INT64_MAX]
        if not ids:
            return 0
        count, _ = await self._delete_acked(ACK_BATCH, {"ids": ids, "queue": self._name})
        return count

    async def _ack_many(self, handles: list[AsyncJobHandle]) -> list[bool]:
        # One statement for the batch, each claim judged by its identity
        # (docs/contract.md §3 "ack_many(handles)"). Ids come from claims,
        # so they are in range.
        params: dict[str, Any] = {
            "ids": [h.id for h in handles],
            "attempts": [h.attempts for h in handles],
            "queue": self._name,
        }
        _, rows = await self._delete_acked(ACK_MANY, params)
        acked = {(i, a) for i, a in rows}
        return [(h.id, h.attempts) in acked for h in handles]

    async def _complete_batch(self, job_ids: list[int]) -> int:
        ids = [i for i in job_ids if INT64_MIN <= i <= INT64_MAX]
        if not ids:
            return 0
        count, _ = await self._delete_acked(COMPLETE_BATCH, {"ids": ids, "queue": self._name})
        return count

    async def _complete_many(
        self, handles: list[AsyncJobHandle], results: list[bytes | None]
    ) -> list[bool]:
        params: dict[str, Any] = {
            "ids": [h.id for h in handles],
            "attempts": [h.attempts for h in handles],
            "results": results,
            "queue": self._name,
        }
        _, rows = await self._delete_acked(COMPLETE_MANY, params)
        completed = {(i, a) for i, a in rows}
        return [(h.id, h.attempts) in completed for h in handles]

    async def _delete_acked(
        self, statement: Statement | sql.SQL, params: dict[str, Any]
    ) -> tuple[int, list[tuple[Any, ...]]]:
        # The count of deleted rows, and the rows the statement returns.
        store = self._pg_store
        for attempt in range(DEADLOCK_ATTEMPTS):
            try:
                async with store._db.connection() as conn:
                    # Read once the connection is at hand (AsyncPostgresStore._now_on).
                    params["now"] = await store._now_on(conn)
                    cur = await conn.execute(store.sql(statement), params, prepare=True)
                    rows = await cur.fetchall() if cur.description is not None else []
                    return cur.rowcount, rows
            except EngineError as error:
                # Two batches waiting for each other's rows: PostgreSQL
                # aborted this one, so nothing was acked; acking is
                # idempotent, so run it again.
                deadlock = isinstance(error.__cause__, psycopg.errors.DeadlockDetected)
                if not deadlock or attempt == DEADLOCK_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _cancel(self, job_id: int) -> bool:
        if not INT64_MIN <= job_id <= INT64_MAX:
            return False
        store = self._pg_store
        params = {"id": job_id, "queue": self._name}
        async with store._db.connection() as conn:
            return (await conn.execute(store.sql(CANCEL), params, prepare=True)).rowcount == 1

    async def _get_job(self, job_id: int) -> Job | None:
        if not INT64_MIN <= job_id <= INT64_MAX:
            return None
        store = self._pg_store
        params = {"id": job_id, "queue": self._name}
        async with store._db.connection() as conn:
            cur = await conn.execute(store.sql(GET_JOB), params, prepare=True, binary=True)
            row = await cur.fetchone()
        return None if row is None else job_from_row(row)

    async def _sweep_expired(
        self, retention_s: float | None, keep_completed_s: float | None
    ) -> SweepResult:
        store = self._pg_store
        params = sweep_params(self._name, await store._now(), retention_s, keep_completed_s)
        async with store._db.connection() as conn:
            cur = await conn.execute(store.sql(SWEEP_EXPIRED), params, binary=True)
            row = await cur.fetchone()
        return sweep_result(row, params)

    async def _stats(self) -> QueueStats:
        return QueueStats(*await self._count(STATS))

    async def _lapsed_claims(self) -> int:
        return int((await self._count(LAPSED_CLAIMS))[0])

    async def _count(self, statement: sql.SQL) -> tuple[Any, ...]:
        store = self._pg_store
        params = {"queue": self._name, "now": await store._now()}
        async with store._db.connection() as conn:
            row = await (await conn.execute(store.sql(statement), params, binary=True)).fetchone()
        assert row is not None
        return row

    # -- pause and dead letters (docs/operations.md); the SQL is in
    # _sql.operations.

    async def _set_paused(self, paused: bool) -> bool:
        return await _operations_async.set_paused(self, paused)

    async def _is_paused(self) -> bool:
        return await _operations_async.is_paused(self)

    async def _dead_jobs(self, limit: int, after_id: int | None) -> list[Job]:
        return await _operations_async.dead_jobs(self, limit, after_id)

    async def _jobs(
        self, state: ListedState, limit: int, after_id: int | None, now: datetime
    ) -> list[Job]:
        return await _operations_async.jobs(self, state, limit, after_id, now)

    async def _completed_count(self) -> int:
        return await _operations_async.completed_count(self)

    async def _add_throughput(
        self, minute: datetime, completed: int, retried: int, dead: int, prune_before: datetime
    ) -> None:
        await _workers_async.add_throughput(self, minute, (completed, retried, dead), prune_before)

    async def _throughput(self, since: datetime) -> list[ThroughputPoint]:
        return await _workers_async.throughput(self, since)

    async def _requeue(self, job_id: int, now: datetime, run_at: datetime) -> bool:
        return await _operations_async.requeue(self, job_id, now, run_at)

    async def _run_now(self, job_id: int, now: datetime) -> bool:
        return await _operations_async.run_now(self, job_id, now)

    async def _purge_dead(self, cutoff: datetime | None) -> int:
        return await _operations_async.purge_dead(self, cutoff)
