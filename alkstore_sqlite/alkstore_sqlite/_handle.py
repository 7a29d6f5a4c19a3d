"""The SQLite :class:`~alkstore.JobHandle`: one claim of one job (docs/contract.md §3
"Claim identity and handle validity")."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from alkstore import Job, JobHandle
from alkstore.engine import duration_us
from alkstore_sqlite._connection import rowcount
from alkstore_sqlite._rows import bury_sql, complete_sql, to_us
from alkstore_sqlite._wake import notify_wake, record_wake

if TYPE_CHECKING:
    from alkstore_sqlite._queue import SqliteQueue

__all__ = ["SqliteJobHandle", "ack_each"]

# The claim is this handle's while the row is processing, has the attempt
# count this claim gave it, and has not lapsed; every operation tests it in
# the same statement that acts, so no other claim can slip in between.
# The row holds a claim in private state 'processing', or 'lapsed' or
# 'expired' (set aside when found lapsed or expired), which is still valid if
# an injected clock moved back before its deadline: the deadline decides.
# (NOT IN with two values costs two comparisons; IN with three, a temporary
# table per statement.)
_VALID = (
    "id = :id AND state NOT IN ('pending', 'scheduled') "
    "AND attempts = :attempts AND claim_deadline > :now"
)

_ACK = f"DELETE FROM _alkstore_jobs WHERE {_VALID}"
_RETRY = f"""
    UPDATE _alkstore_jobs
    SET state = :state, run_at = :run_at, last_error = :error,
        worker_id = NULL, claim_deadline = NULL
    WHERE {_VALID}
"""
_HEARTBEAT = f"UPDATE _alkstore_jobs SET claim_deadline = :deadline WHERE {_VALID}"
# Claims only count up (attempts kept, so no claim identity repeats); the
# budget grows by the claim given back.
_RELEASE = f"""
    UPDATE _alkstore_jobs
    SET state = :state, worker_id = NULL, claim_deadline = NULL,
        max_attempts = min(max_attempts + 1, 2147483647)
    WHERE {_VALID}
"""
_BURY = bury_sql(_VALID)
_COMPLETE = complete_sql(_VALID)
_DELETE_MOVED = "DELETE FROM _alkstore_jobs WHERE id = :id"


class SqliteJobHandle(JobHandle):
    """A claim of a job in a :class:`~alkstore_sqlite.SqliteStore`; usable
    from any thread (docs/contract.md §2)."""

    _queue: SqliteQueue

    def __init__(self, queue: SqliteQueue, job: Job) -> None:
        super().__init__(queue, job)

    def _params(self, **extra: Any) -> dict[str, Any]:
        # One clock read per operation (docs/contract.md §3 "Time").
        return {
            "id": self._job.id,
            "attempts": self._job.attempts,
            "now": to_us(self._queue._store._now()),
            **extra,
        }

    def _write(self, sql: str, params: dict[str, Any]) -> bool:
        return self._queue._store._pool.run(rowcount, sql, params) == 1

    def _ack(self) -> bool:
        return self._write(_ACK, self._params())

    def _complete(self, result: bytes | None) -> bool:
        params = self._params(result=result)
        return self._queue._store._pool.transaction(_move, _COMPLETE, params)

    def _retry(self, error: str, delay_s: float) -> bool:
        params = self._params(error=error)
        run_at = params["run_at"] = params["now"] + duration_us(delay_s)
        # Out of the claim's walk until due (see _schema).
        params["state"] = "scheduled" if run_at > params["now"] else "pending"
        return self._write(_RETRY, params)

    def _dead_letter(self, error: str) -> bool:
        return self._queue._store._pool.transaction(_bury, self._params(error=error))

    def _heartbeat(self, extend_s: float) -> bool:
        params = self._params()
        params["deadline"] = params["now"] + max(1, duration_us(extend_s))
        return self._write(_HEARTBEAT, params)

    def _release(self) -> bool:
        params = self._params(queue=self._job.queue)
        # As an enqueue: a job not due (an injected clock moved back) stays
        # out of the claim's walk until it is.
        due = to_us(self._job.run_at) <= params["now"]
        params["state"] = "pending" if due else "scheduled"
        store = self._queue._store
        wake_id = store._pool.transaction(_give_back, params)
        if wake_id is None:
            return False
        notify_wake(store._wake_key, self._job.queue, wake_id)
        return True


def ack_each(conn: sqlite3.Connection, claims: list[dict[str, Any]]) -> list[bool]:
    """Ack each claim (``id``, ``attempts``, ``now``) as its handle's ``ack``
    would, inside the caller's transaction; whether each took effect."""
    return [conn.execute(_ACK, claim).rowcount == 1 for claim in claims]


def _move(conn: sqlite3.Connection, copy: str, params: dict[str, Any]) -> bool:
    # Copy then delete, in the caller's write transaction: the job is in
    # exactly one table at every commit.
    if conn.execute(copy, params).rowcount != 1:
        return False
    conn.execute(_DELETE_MOVED, params)
    return True


def _give_back(conn: sqlite3.Connection, params: dict[str, Any]) -> int | None:
    """Inside ``BEGIN IMMEDIATE``: release the claim; the wake id, or
    ``None`` (nothing written) when the claim was not valid."""
    if conn.execute(_RELEASE, params).rowcount != 1:
        return None
    return record_wake(conn, params["queue"])


def _bury(conn: sqlite3.Connection, params: dict[str, Any]) -> bool:
    return _move(conn, _BURY, params)
