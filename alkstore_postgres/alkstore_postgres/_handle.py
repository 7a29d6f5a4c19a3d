# WARNING: generated from _handle_async.py by tools/async_to_sync.py.
# Do not edit: change _handle_async.py, then run `python tools/async_to_sync.py`.
"""The PostgreSQL :class:`~alkstore.JobHandle` (docs/contract.md §3 "Claim identity
and handle validity").

A claim is identified by the job id and its post-claim attempt count. Every
operation is one statement whose ``WHERE`` clause is the whole validity
predicate (a row holding a claim, this claim's attempt count, not lapsed at
``now``), so a stale handle can never touch a newer claim, and a concurrent
reclaim or sweep either runs before (the predicate fails) or after (the row
is gone or changed) under the row lock.

A row holds a claim in private state ``processing``, or ``lapsed`` or
``expired`` (set aside by a claim that found it lapsed or expired), which is
still valid if an injected clock moved back before its deadline: the
deadline decides, as in the SQLite engine. A ``scheduled`` row, like a
``pending`` one, holds no claim. The statements are in
:mod:`alkstore_postgres._sql.handle`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg import sql

from alkstore import Job, JobHandle
from alkstore.engine import duration
from alkstore_postgres._schema import Statement
from alkstore_postgres._sql.handle import (
    ACK,
    COMPLETE,
    DEAD_LETTER,
    HEARTBEAT,
    MICROSECOND,
    RELEASE,
    RETRY,
)

if TYPE_CHECKING:
    from alkstore_postgres._queue import PostgresQueue

__all__ = ["PostgresJobHandle"]


class PostgresJobHandle(JobHandle):
    """One claim of one job on PostgreSQL (the sync handle may be used from
    any thread, the async one from its store's event loop)."""

    def __init__(self, queue: PostgresQueue, job: Job) -> None:
        super().__init__(queue, job)
        self._pg_queue = queue

    def _run(
        self,
        statement: Statement | sql.SQL,
        at: Callable[[datetime], dict[str, Any]] | None = None,
        **params: Any,
    ) -> bool:
        # The instant is read once the connection is at hand (see
        # PostgresStore._now_on); ``at`` derives the other instants from it.
        store = self._pg_queue._pg_store
        params.update(id=self._job.id, attempts=self._job.attempts)
        with store._db.connection() as conn:
            now = params["now"] = store._now_on(conn)
            if at is not None:
                params.update(at(now))
            return conn.execute(store.sql(statement), params, prepare=True).rowcount == 1

    def _ack(self) -> bool:
        return self._run(ACK)

    def _complete(self, result: bytes | None) -> bool:
        return self._run(COMPLETE, result=result)

    def _retry(self, error: str, delay_s: float) -> bool:
        delay = duration(delay_s)

        def at(now: datetime) -> dict[str, Any]:
            run_at = now + delay
            return {"run_at": run_at, "state": "scheduled" if run_at > now else "pending"}

        return self._run(RETRY, at, error=error)

    def _dead_letter(self, error: str) -> bool:
        return self._run(DEAD_LETTER, error=error)

    def _heartbeat(self, extend_s: float) -> bool:
        # At least a microsecond, as at claim time: a heartbeat that took
        # effect never leaves the claim already lapsed.
        extend = max(duration(extend_s), MICROSECOND)
        return self._run(HEARTBEAT, lambda now: {"deadline": now + extend})

    def _release(self) -> bool:
        # As an enqueue: a job not due (an injected clock moved back) stays
        # out of the claim's walk until it is.
        def at(now: datetime) -> dict[str, Any]:
            return {"state": "pending" if self._job.run_at <= now else "scheduled"}

        return self._run(RELEASE, at, channel=self._pg_queue.channel)
