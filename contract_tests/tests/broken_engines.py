"""Deliberately broken engines: the SQLite engine with one fault each.

The meta-tests run the contract suite against them and expect it to fail
(a contract that cannot fail proves nothing). Each engine subclasses the
SQLite engine's classes and breaks exactly one rule; importing this module
registers them in-process under their URL schemes, so a spawned child that
imports it (the harness's ``child_process_imports``) can open them too.

The faults are written as SQL of their own over the SQLite engine's tables
and row helpers (``_alkstore_jobs``, ``bury_sql``, ``job_from_row``), so
they do not depend on how the engine words its own statements; store-wide
faults (an unguarded schedule fire, a maintenance turn for everyone) wrap
the engine's own primitives. The broken async facades plug in through the
native-async hook (the factory's ``open_async``) over the correct SQLite
engine. The meta-test
``test_the_sqlite_engine_passes_the_same_selection`` is the control.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, ParamSpec, TypeVar

import pytest

import alkstore
from alkstore import (
    AlkstoreError,
    JobHandle,
    QueueOpts,
    QueueStats,
    Schedule,
    SweepResult,
    ValidationError,
    WorkerInfo,
    enqueue_options,
    resolve,
)
from alkstore.contract.threaded import ThreadedAsyncQueue, ThreadedAsyncStore
from alkstore.engine import (
    EXPIRED,
    MAX_ATTEMPTS_EXCEEDED,
    EncodedPayload,
    Resolved,
    check_engine_options,
)
from alkstore_contract_tests import StoreTarget
from alkstore_sqlite import ENGINE_OPTIONS, SqliteJobHandle, SqliteQueue, SqliteStore, parse_url
from alkstore_sqlite._rows import LIVE_COLUMNS, bury_sql, job_from_row, to_us
from alkstore_sqlite._wake import notify_wake, record_wake

P = ParamSpec("P")
T = TypeVar("T")

_HARNESS_PATH = Path(__file__).resolve().parents[2] / "alkstore_sqlite" / "tests" / "harness.py"


def _load_sqlite_harness() -> type[Any]:
    # The SQLite tests folder is not a package; load its harness by path
    # under a name of its own.
    spec = importlib.util.spec_from_file_location("alkstore_sqlite_test_harness", _HARNESS_PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    harness: type[Any] = module.SqliteHarness
    return harness


SqliteHarness = _load_sqlite_harness()


def _claim_params(queue: SqliteQueue, worker_id: str, n: int) -> dict[str, Any]:
    return {
        "queue": queue.name,
        "worker": worker_id,
        "now": to_us(queue.store._now()),
        "n": n,
        "error": MAX_ATTEMPTS_EXCEEDED,
    }


# -- (a) claim order inverted ------------------------------------------------

# The SQLite engine keeps private row states: 'scheduled' is a pending row
# not yet due, 'lapsed' and 'expired' are rows its claim has moved aside.
_EXHAUSTED = (
    "queue = :queue AND state IN ('processing', 'lapsed') AND attempts >= max_attempts "
    "AND claim_deadline <= :now"
)
_DUE = "queue = :queue AND state IN ('pending', 'scheduled') AND run_at <= :now " + (
    "AND (expires_at IS NULL OR expires_at > :now)"
)
_ELIGIBLE = (
    "queue = :queue AND (expires_at IS NULL OR expires_at > :now) AND ("
    "(state IN ('pending', 'scheduled') AND run_at <= :now) OR (state IN ('processing', 'lapsed') "
    "AND claim_deadline <= :now AND attempts < max_attempts))"
)
_WRONG_ORDER_CLAIM = f"""
    UPDATE _alkstore_jobs
    SET state = 'processing', attempts = attempts + 1, worker_id = :worker,
        claim_deadline = :now + max(1, CAST(round(visibility_timeout_s * 1e6) AS INTEGER))
    WHERE id IN (
        SELECT id FROM _alkstore_jobs WHERE {_ELIGIBLE}
        ORDER BY priority ASC, run_at, id LIMIT :n)
    RETURNING {LIVE_COLUMNS}
"""


def _claim_inverted(conn: sqlite3.Connection, params: dict[str, Any]) -> list[Any]:
    conn.execute(bury_sql(_EXHAUSTED), params)
    conn.execute(f"DELETE FROM _alkstore_jobs WHERE {_EXHAUSTED}", params)
    rows: list[Any] = conn.execute(_WRONG_ORDER_CLAIM, params).fetchall()
    return rows


class WrongOrderQueue(SqliteQueue):
    """Claims the lowest priority first (``priority ASC``)."""

    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        params = _claim_params(self, worker_id, n)
        rows = self._store._pool.transaction(_claim_inverted, params)
        rows.sort(key=lambda row: (row[5], row[6], row[0]))
        return [SqliteJobHandle(self, job_from_row(row)) for row in rows]


# -- (b) a stale handle is accepted ------------------------------------------


class StaleHandle(SqliteJobHandle):
    """Forgets the claim's identity: it acts with the row's current attempt
    count, so the validity predicate ignores whose claim it is."""

    def _params(self, **extra: Any) -> dict[str, Any]:
        params = super()._params(**extra)
        current = self._queue._get_job(self._job.id)
        if current is not None:
            params["attempts"] = current.attempts
        return params


class StaleQueue(SqliteQueue):
    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        return [StaleHandle(self, handle.job) for handle in super()._claim(worker_id, n)]


class AckManyByIdQueue(SqliteQueue):
    """``ack_many`` acks by job id, as ``ack_batch`` does: a stale handle's
    ack deletes the job another claim now holds."""

    def _ack_many(self, handles: list[JobHandle]) -> list[bool]:
        return [self._ack_batch([handle.id]) == 1 for handle in handles]


# -- (c) a claim that reads, then updates without a lock ----------------------

_PEEK = f"""
    SELECT id FROM _alkstore_jobs WHERE {_DUE}
    ORDER BY priority DESC, run_at, id LIMIT :n
"""
_TAKE = f"""
    UPDATE _alkstore_jobs
    SET state = 'processing', attempts = attempts + 1, worker_id = :worker,
        claim_deadline = :now + CAST(round(visibility_timeout_s * 1e6) AS INTEGER)
    WHERE id = :id
    RETURNING {LIVE_COLUMNS}
"""


def _fetchall(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> list[Any]:
    rows: list[Any] = conn.execute(sql, params).fetchall()
    return rows


def _fetchone(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> Any:
    return conn.execute(sql, params).fetchone()


class RacyClaimQueue(SqliteQueue):
    """Reads the due ids in one statement and takes them in others, without
    re-checking that they are still pending: concurrent claims double up."""

    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        params = _claim_params(self, worker_id, n)
        pool = self._store._pool
        ids = [row[0] for row in pool.run(_fetchall, _PEEK, params)]
        # The scheduling point every read-then-write race has, wide enough
        # that claimers released together still meet in it on a busy machine.
        time.sleep(0.01)
        rows = [row for i in ids for row in pool.run(_fetchall, _TAKE, {**params, "id": i})]
        return [SqliteJobHandle(self, job_from_row(row)) for row in rows]


# -- (d) a dead-letter move in two steps, errors swallowed --------------------


def _rowcount(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> int:
    return conn.execute(sql, params).rowcount


_BURY_VALID = bury_sql(
    "id = :id AND state = 'processing' AND attempts = :attempts AND claim_deadline > :now"
)


class LeakyDeadLetterHandle(SqliteJobHandle):
    """Copies the row to the dead table and deletes it in two separate
    statements, and swallows a failed copy."""

    def _dead_letter(self, error: str) -> bool:
        params = self._params(error=error)
        pool = self._queue._store._pool
        try:
            moved = pool.run(_rowcount, _BURY_VALID, params)
        except AlkstoreError:
            moved = 1  # "the insert probably worked"
        if moved != 1:
            return False
        pool.run(_rowcount, "DELETE FROM _alkstore_jobs WHERE id = :id", params)
        return True


class LeakyDeadLetterQueue(SqliteQueue):
    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        handles = super()._claim(worker_id, n)
        return [LeakyDeadLetterHandle(self, handle.job) for handle in handles]


# -- (e) a requeue that keeps the attempts -------------------------------------


class RequeueResetsAttemptsQueue(SqliteQueue):
    """Requeues a dead job with its attempts reset to 0 and its old budget:
    the claim after the requeue repeats an earlier claim's (id, attempts),
    so a handle from before the job died can act on it."""

    def _requeue(self, job_id: int, now: datetime, run_at: datetime) -> bool:
        dead = self._get_job(job_id)
        if not super()._requeue(job_id, now, run_at):
            return False
        assert dead is not None
        params = {"id": job_id, "max_attempts": dead.max_attempts}
        sql = "UPDATE _alkstore_jobs SET attempts = 0, max_attempts = :max_attempts WHERE id = :id"
        self._store._pool.run(_rowcount, sql, params)
        return True


# -- (e2) a release that undoes the claim ------------------------------------


class ReleaseUndoesClaimHandle(SqliteJobHandle):
    """Gives a claim back by counting its attempt down (the budget kept):
    the next claim repeats this claim's (id, attempts), so the released
    handle can act on it."""

    def _release(self) -> bool:
        sql = (
            "UPDATE _alkstore_jobs SET state = 'pending', worker_id = NULL, "
            "claim_deadline = NULL, attempts = attempts - 1 WHERE id = :id "
            "AND state = 'processing' AND attempts = :attempts AND claim_deadline > :now"
        )
        return self._queue._store._pool.run(_rowcount, sql, self._params()) == 1


class ReleaseUndoesClaimQueue(SqliteQueue):
    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        handles = super()._claim(worker_id, n)
        return [ReleaseUndoesClaimHandle(self, handle.job) for handle in handles]


# -- (e3) a unique key checked before the insert ------------------------------

_HOLDER = "SELECT id FROM _alkstore_jobs WHERE queue = :queue AND unique_key = :key"
_SET_KEY = "UPDATE _alkstore_jobs SET unique_key = :key WHERE id = :id"


class CheckThenInsertQueue(SqliteQueue):
    """Looks for a live job holding each key, then inserts in another
    transaction: enqueues of one key at once all find none, and each
    stores a job (with no unique index to stop them: the store drops it)."""

    def _insert(
        self,
        resolved: Resolved,
        payloads: Sequence[EncodedPayload],
        unique_keys: Sequence[str | None] | None,
    ) -> list[int]:
        if unique_keys is None:
            return super()._insert(resolved, payloads, None)
        pool = self._store._pool
        ids = []
        for payload, key in zip(payloads, unique_keys, strict=True):
            found = {"queue": self.name, "key": key}
            held = None if key is None else pool.run(_fetchone, _HOLDER, found)
            if held is not None:
                ids.append(held[0])
                continue
            time.sleep(0.01)  # the window every check-then-insert has
            (job_id,) = super()._insert(resolved, [payload], None)
            pool.run(_rowcount, _SET_KEY, {"key": key, "id": job_id})
            ids.append(job_id)
        return ids


class CheckThenInsertStore(SqliteStore):
    def _prepare(self, migrate: bool) -> None:
        super()._prepare(migrate)
        self._pool.run(_rowcount, "DROP INDEX IF EXISTS _alkstore_jobs_unique", {})

    def _open_queue(self, name: str, opts: QueueOpts) -> SqliteQueue:
        return CheckThenInsertQueue(self, name, opts)


# -- (e4) completed jobs purged by their age, not by when they finished ------

_PURGE_BY_AGE = """
    DELETE FROM _alkstore_completed WHERE queue = :queue AND enqueued_at <= :cutoff
"""


class CompletedByAgeQueue(SqliteQueue):
    """Purges completed jobs ``keep_completed_s`` after they were enqueued:
    a job that waited or ran long is gone before its retention ends."""

    def _sweep_expired(
        self, retention_s: float | None, keep_completed_s: float | None
    ) -> SweepResult:
        result = super()._sweep_expired(retention_s, None)
        if keep_completed_s is None:
            return result
        cutoff = to_us(self._store._now()) - round(keep_completed_s * 1e6)
        purged = self._store._pool.run(
            _rowcount, _PURGE_BY_AGE, {"queue": self.name, "cutoff": cutoff}
        )
        return SweepResult(result.expired, result.purged + purged)


# -- (e5) throughput added by a read, then a write ----------------------------

_READ_MINUTE = """
    SELECT completed, retried, dead FROM _alkstore_throughput
    WHERE queue = :queue AND minute = :minute
"""
_WRITE_MINUTE = """
    INSERT OR REPLACE INTO _alkstore_throughput (queue, minute, completed, retried, dead)
    VALUES (:queue, :minute, :completed, :retried, :dead)
"""


_PRUNE_MINUTES = "DELETE FROM _alkstore_throughput WHERE queue = :queue AND minute < :before"


class ReadThenWriteThroughputQueue(SqliteQueue):
    """Adds a report to the minute's counts by reading them and writing the
    sum in a second statement: two reports at once both read the old counts,
    and one of them is lost."""

    def _add_throughput(
        self, minute: datetime, completed: int, retried: int, dead: int, prune_before: datetime
    ) -> None:
        pool, key = self._store._pool, {"queue": self.name, "minute": to_us(minute)}
        row = pool.run(_fetchone, _READ_MINUTE, key) or (0, 0, 0)
        time.sleep(0.001)  # the scheduling point every read-then-write race has
        counts = {
            "completed": row[0] + completed,
            "retried": row[1] + retried,
            "dead": row[2] + dead,
        }
        pool.run(_rowcount, _WRITE_MINUTE, {**key, **counts})
        prune = {"queue": self.name, "before": to_us(prune_before)}
        pool.run(_rowcount, _PRUNE_MINUTES, prune)


# -- (e6) a workers registry that never lets a silent worker go ----------------


class ImmortalWorkersStore(SqliteStore):
    """Lists every record ever refreshed, however long its worker has been
    silent: a dead worker stays "live" on every dashboard."""

    def _list_workers(self, now: datetime) -> list[WorkerInfo]:
        return super()._list_workers(datetime.min.replace(tzinfo=now.tzinfo))


# -- (f) a paused queue's claim still dead-letters ---------------------------


def _bury_exhausted(conn: sqlite3.Connection, params: dict[str, Any]) -> None:
    conn.execute(bury_sql(_EXHAUSTED), params)
    conn.execute(f"DELETE FROM _alkstore_jobs WHERE {_EXHAUSTED}", params)


class PausedClaimBuriesQueue(SqliteQueue):
    """Checks the pause only after the claim's dead-lettering: a claim on a
    paused queue still moves exhausted lapsed claims to the dead table."""

    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        if self._is_paused():
            self._store._pool.transaction(_bury_exhausted, _claim_params(self, worker_id, n))
        return super()._claim(worker_id, n)


# -- (g) a schedule fired without its guard ----------------------------------


class UnguardedFireStore(SqliteStore):
    """Fires whatever schedule of that name is stored when the fire runs: it
    re-reads the row and hands the fresh one to the guarded primitive, so a
    tick that read the schedule before another tick fired the boundary (or
    before a replacement) fires it again -- the read-then-write race of a
    scheduler without a conditional update."""

    def _fire_schedule(
        self,
        schedule: Schedule,
        boundary: datetime,
        next_run_at: datetime,
        resolved: Resolved,
        payload: EncodedPayload,
    ) -> int | None:
        # The scheduling point every read-then-write race has, wide enough
        # that claimers released together still meet in it on a busy machine.
        time.sleep(0.01)
        current = {s.name: s for s in self._list_schedules(None)}.get(schedule.name)
        if current is None:
            return None
        return super()._fire_schedule(current, boundary, next_run_at, resolved, payload)


# -- (i) a schedule fire in two transactions --------------------------------


class NonAtomicFireStore(SqliteStore):
    """Moves the schedule past its boundary (the guarded update, committed
    on its own) and then inserts the job in a second transaction: a failed
    insert loses the boundary instead of leaving it for the next tick."""

    def _fire_schedule(
        self,
        schedule: Schedule,
        boundary: datetime,
        next_run_at: datetime,
        resolved: Resolved,
        payload: EncodedPayload,
    ) -> int | None:
        if not self._skip_schedule(schedule, next_run_at):
            return None
        (job_id,) = self._open_queue(schedule.queue, schedule.queue_opts)._insert(
            resolved, [payload], None
        )
        return job_id


# -- (h) a maintenance turn for everyone, every time -------------------------


class AlwaysMyTurnStore(SqliteStore):
    """Gives every caller the maintenance turn: no lock, no interval."""

    @contextlib.contextmanager
    def _maintenance_turn(self, task: str, interval_s: float) -> Iterator[bool]:
        yield True


# -- (i) claim order loses its id tie-break between paths to "due" -----------

_PAUSED_NOW = "SELECT EXISTS (SELECT 1 FROM _alkstore_queues WHERE name = :queue AND paused = 1)"
_NOT_EXPIRED = "(expires_at IS NULL OR expires_at > :now)"
#: The claim's three paths to a claimable row, each walked in claim order.
_PATHS = (
    f"state = 'pending' AND run_at <= :now AND {_NOT_EXPIRED}",
    f"state = 'scheduled' AND run_at <= :now AND {_NOT_EXPIRED}",
    f"state IN ('processing', 'lapsed') AND claim_deadline <= :now "
    f"AND attempts < max_attempts AND {_NOT_EXPIRED}",
)
_ANY_TO_CLAIM = " OR ".join(
    f"EXISTS (SELECT 1 FROM _alkstore_jobs WHERE {where})"
    for where in (_EXHAUSTED, *(f"queue = :queue AND {path}" for path in _PATHS))
)
# The deadline's microseconds rounded half to even, as the engine's are.
_TAKE_ONE = f"""
    UPDATE _alkstore_jobs
    SET state = 'processing', attempts = attempts + 1, worker_id = :worker,
        claim_deadline = :now + max(1, CAST(round(visibility_timeout_s * 1e6) AS INTEGER)
            - (visibility_timeout_s * 1e6 - CAST(visibility_timeout_s * 1e6 AS INTEGER) = 0.5
               AND CAST(visibility_timeout_s * 1e6 AS INTEGER) % 2 = 0))
    WHERE id = :id
    RETURNING {LIVE_COLUMNS}
"""


def _claim_by_paths(conn: sqlite3.Connection, params: dict[str, Any]) -> list[Any]:
    if conn.execute(_PAUSED_NOW, params).fetchone()[0]:
        return []
    conn.execute(bury_sql(_EXHAUSTED), params)
    conn.execute(f"DELETE FROM _alkstore_jobs WHERE {_EXHAUSTED}", params)
    candidates = [
        row
        for where in _PATHS
        for row in conn.execute(
            f"SELECT id, priority, run_at FROM _alkstore_jobs WHERE queue = :queue AND {where} "
            "ORDER BY priority DESC, run_at, id LIMIT :n",
            params,
        )
    ]
    # A stable merge by (priority, run_at) alone: a tie between paths goes
    # to the path listed first, whatever the ids.
    candidates.sort(key=lambda row: (-row[1], row[2]))
    picked = candidates[: params["n"]]
    return [conn.execute(_TAKE_ONE, {**params, "id": row[0]}).fetchone() for row in picked]


class TiesByPathQueue(SqliteQueue):
    """Merges the claim's paths (due, came due, lapsed) by priority and
    ``run_at`` only, and hands out in that order: among equals, due jobs
    come before jobs that just came due, and both before reclaims."""

    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        params = _claim_params(self, worker_id, min(n, 2**63 - 1))
        pool = self._store._pool
        # Looked for first, so that a claim with nothing to do takes no
        # write lock (as the engine's own claim looks before it locks).
        if not pool.run(_fetchone, f"SELECT {_ANY_TO_CLAIM}", params)[0]:
            return []
        rows = pool.transaction(_claim_by_paths, params)
        return [SqliteJobHandle(self, job_from_row(row)) for row in rows]


# -- (j) stats leaves out lapsed claims a claim has set aside ----------------

#: Counts each row by its claim fields and instants, as the engine does,
#: but processing by the private state 'processing' (and an expired row's
#: claim), which leaves out the lapsed claims a claim set aside for reclaim.
_STATS_WITHOUT_LAPSED = """
    SELECT
        (SELECT count(*) FROM _alkstore_jobs
         WHERE queue = :queue AND claim_deadline IS NULL AND run_at <= :now),
        (SELECT count(*) FROM _alkstore_jobs
         WHERE queue = :queue AND claim_deadline IS NULL AND run_at > :now),
        (SELECT count(*) FROM _alkstore_jobs
         WHERE queue = :queue AND state IN ('processing', 'expired')
           AND claim_deadline IS NOT NULL),
        (SELECT count(*) FROM _alkstore_dead WHERE queue = :queue)
"""


class LapsedUncountedQueue(SqliteQueue):
    """``stats().processing`` leaves out lapsed claims not yet reclaimed."""

    def _stats(self) -> QueueStats:
        params = {"queue": self.name, "now": to_us(self._store._now())}
        return QueueStats(*self._store._pool.run(_fetchone, _STATS_WITHOUT_LAPSED, params))


# -- (k) moves between the tables in two committed statements ---------------

#: How long a move in two steps leaves its job in both tables: the gap
#: every such move has, wide enough that a reader or an ack running beside
#: it meets the gap on a busy machine.
_MOVE_GAP_S = 0.01

_EXPIRED_NOW = "queue = :queue AND expires_at <= :now"
_REQUEUE_COPY = """
    INSERT INTO _alkstore_jobs (
        id, queue, state, priority, run_at, expires_at, claim_deadline, attempts,
        max_attempts, visibility_timeout_s, backoff_base_s, backoff_cap_s, enqueued_at,
        worker_id, content_type, last_error, payload)
    SELECT id, queue, :state, priority, :run_at, :run_at + (expires_at - enqueued_at), NULL,
           attempts, min(attempts + max_attempts, 2147483647), visibility_timeout_s,
           backoff_base_s, backoff_cap_s, enqueued_at, NULL, content_type, last_error, payload
    FROM _alkstore_dead WHERE id = :id AND queue = :queue
"""


def _copy_back(conn: sqlite3.Connection, params: dict[str, Any]) -> int | None:
    if conn.execute(_REQUEUE_COPY, params).rowcount != 1:
        return None
    return record_wake(conn, params["queue"])


class TwoStepMoveHandle(SqliteJobHandle):
    """``fail`` and ``retry`` at the budget copy the row to the dead table
    and delete it from the live one in two transactions."""

    def _dead_letter(self, error: str) -> bool:
        params = self._params(error=error)
        pool = self._queue._store._pool
        if pool.run(_rowcount, _BURY_VALID, params) != 1:
            return False
        time.sleep(_MOVE_GAP_S)
        pool.run(_rowcount, "DELETE FROM _alkstore_jobs WHERE id = :id", params)
        return True


class TwoStepMoveQueue(SqliteQueue):
    """Every move between the tables in two transactions, copy first: the
    claim's dead-lettering, the expiry sweep and requeue here, the handle's
    in :class:`TwoStepMoveHandle`."""

    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        params = _claim_params(self, worker_id, n)
        pool = self._store._pool
        # Looked for first, so that a claim with nothing to move takes no
        # write lock (as the engine's own claim looks before it locks).
        look = f"SELECT EXISTS (SELECT 1 FROM _alkstore_jobs WHERE {_EXHAUSTED})"
        exhausted = pool.run(_fetchone, look, params)[0] and not self._is_paused()
        if exhausted and pool.run(_rowcount, bury_sql(_EXHAUSTED), params):
            time.sleep(_MOVE_GAP_S)
            pool.run(_rowcount, f"DELETE FROM _alkstore_jobs WHERE {_EXHAUSTED}", params)
        handles = super()._claim(worker_id, n)
        return [TwoStepMoveHandle(self, handle.job) for handle in handles]

    def _sweep_expired(
        self, retention_s: float | None, keep_completed_s: float | None
    ) -> SweepResult:
        params = {"queue": self.name, "now": to_us(self._store._now()), "error": EXPIRED}
        pool = self._store._pool
        expired = pool.run(_rowcount, bury_sql(_EXPIRED_NOW), params)
        if expired:
            time.sleep(_MOVE_GAP_S)
            pool.run(_rowcount, f"DELETE FROM _alkstore_jobs WHERE {_EXPIRED_NOW}", params)
        purged = super()._sweep_expired(retention_s, keep_completed_s).purged
        return SweepResult(expired, purged)

    def _requeue(self, job_id: int, now: datetime, run_at: datetime) -> bool:
        if not -(2**63) <= job_id < 2**63:
            return False
        params = {
            "id": job_id,
            "queue": self.name,
            "run_at": to_us(run_at),
            "state": "scheduled" if run_at > now else "pending",
        }
        pool = self._store._pool
        wake_id = pool.transaction(_copy_back, params)
        if wake_id is None:
            return False
        time.sleep(_MOVE_GAP_S)
        pool.run(_rowcount, "DELETE FROM _alkstore_dead WHERE id = :id", params)
        notify_wake(self._store._file_key, self.name, wake_id)
        return True


# -- (l) async facades: the loop blocked, or validation skipped ---------------


class LoopBlockingAsyncStore(ThreadedAsyncStore):
    """Runs each sync primitive right on the event loop, inside the
    coroutine: the loop is blocked for every database wait and never turns
    during an operation."""

    async def _run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return fn(*args, **kwargs)


class UncheckedEnqueueQueue(ThreadedAsyncQueue):
    """``AsyncQueue.enqueue`` that skips validation: what it cannot check,
    it writes anyway, with the queue's defaults and the payload's ``repr``
    as bytes, where the contract raises ``ValidationError`` before any
    write."""

    async def enqueue(self, payload: object, **options: Any) -> int:
        try:
            return await super().enqueue(payload, **options)
        except ValidationError:
            resolved = resolve(await self._store._now(), self._opts, enqueue_options())
            unchecked = EncodedPayload(repr(payload).encode(), "application/octet-stream")
            return (await self._insert(resolved, [unchecked], None))[0]


class UncheckedEnqueueAsyncStore(ThreadedAsyncStore):
    def _open_queue(self, name: str, opts: QueueOpts) -> ThreadedAsyncQueue:
        return UncheckedEnqueueQueue(self, name, opts, self._sync._open_queue(name, opts))


def _async_factory(async_store_class: type[ThreadedAsyncStore]) -> Any:
    """The SQLite engine, with a native-async hook (the factory's
    ``open_async``, docs/async.md) that wraps it in ``async_store_class``."""
    open_sync = _store_factory(SqliteStore)

    async def open_async(url: str, **options: Any) -> ThreadedAsyncStore:
        return async_store_class(await asyncio.to_thread(open_sync, url, **options))

    open_sync.open_async = open_async
    return open_sync


# -- registration --------------------------------------------------------------

QUEUE_CLASSES: dict[str, type[SqliteQueue]] = {
    "broken-order": WrongOrderQueue,
    "broken-stale": StaleQueue,
    "broken-ack-many": AckManyByIdQueue,
    "broken-claim": RacyClaimQueue,
    "broken-dead": LeakyDeadLetterQueue,
    "broken-requeue": RequeueResetsAttemptsQueue,
    "broken-release": ReleaseUndoesClaimQueue,
    "broken-completed": CompletedByAgeQueue,
    "broken-throughput": ReadThenWriteThroughputQueue,
    "broken-pause": PausedClaimBuriesQueue,
    "broken-ties": TiesByPathQueue,
    "broken-stats": LapsedUncountedQueue,
    "broken-moves": TwoStepMoveQueue,
}
STORE_CLASSES: dict[str, type[SqliteStore]] = {
    "broken-fire": UnguardedFireStore,
    "broken-turn": AlwaysMyTurnStore,
    "broken-half-fire": NonAtomicFireStore,
    "broken-unique": CheckThenInsertStore,
    "broken-workers": ImmortalWorkersStore,
}
ASYNC_STORE_CLASSES: dict[str, type[ThreadedAsyncStore]] = {
    "broken-async-blocks": LoopBlockingAsyncStore,
    "broken-async-unchecked": UncheckedEnqueueAsyncStore,
}


def _store_factory(store_class: type[SqliteStore]) -> Any:
    def open_broken(url: str, **options: Any) -> SqliteStore:
        check_engine_options(options, ENGINE_OPTIONS)
        return store_class(parse_url("sqlite" + url[url.index("://") :]), **options)

    return open_broken


def _factory(queue_class: type[SqliteQueue]) -> Any:
    class BrokenStore(SqliteStore):
        def _open_queue(self, name: str, opts: QueueOpts) -> SqliteQueue:
            return queue_class(self, name, opts)

    return _store_factory(BrokenStore)


for _scheme, _queue_class in QUEUE_CLASSES.items():
    alkstore.register(_scheme, _factory(_queue_class))
for _scheme, _store_class in STORE_CLASSES.items():
    alkstore.register(_scheme, _store_factory(_store_class))
for _scheme, _async_class in ASYNC_STORE_CLASSES.items():
    alkstore.register(_scheme, _async_factory(_async_class))


def _as_sqlite(target: StoreTarget) -> StoreTarget:
    return StoreTarget("sqlite" + target.url[target.url.index("://") :], target.options)


class _BrokenHarness(SqliteHarness):  # type: ignore[misc, valid-type]
    scheme: ClassVar[str]
    child_process_imports = ("broken_engines",)

    @pytest.fixture
    def alkstore_target(self, tmp_path: Path) -> Iterator[StoreTarget]:
        yield StoreTarget(f"{self.scheme}:///{tmp_path / 'alkstore.db'}", {})  # noqa: PT022

    def app_connection(self, target: StoreTarget) -> contextlib.AbstractContextManager[Any]:
        connection: contextlib.AbstractContextManager[Any] = super().app_connection(
            _as_sqlite(target)
        )
        return connection

    def dead_letter_inserts_fail(
        self, target: StoreTarget
    ) -> contextlib.AbstractContextManager[None]:
        faults: contextlib.AbstractContextManager[None] = super().dead_letter_inserts_fail(
            _as_sqlite(target)
        )
        return faults

    def job_inserts_fail(
        self, target: StoreTarget, queue: str
    ) -> contextlib.AbstractContextManager[None]:
        faults: contextlib.AbstractContextManager[None] = super().job_inserts_fail(
            _as_sqlite(target), queue
        )
        return faults

    def overwrite_schedule_column(
        self, target: StoreTarget, name: str, column: str, value: str | bytes
    ) -> None:
        super().overwrite_schedule_column(_as_sqlite(target), name, column, value)


class WrongOrderHarness(_BrokenHarness):
    scheme = "broken-order"


class StaleHandleHarness(_BrokenHarness):
    scheme = "broken-stale"


class RacyClaimHarness(_BrokenHarness):
    scheme = "broken-claim"


class LeakyDeadLetterHarness(_BrokenHarness):
    scheme = "broken-dead"


class RequeueResetsAttemptsHarness(_BrokenHarness):
    scheme = "broken-requeue"


class ReleaseUndoesClaimHarness(_BrokenHarness):
    scheme = "broken-release"


class CompletedByAgeHarness(_BrokenHarness):
    scheme = "broken-completed"


class CheckThenInsertHarness(_BrokenHarness):
    scheme = "broken-unique"


class ReadThenWriteThroughputHarness(_BrokenHarness):
    scheme = "broken-throughput"


class ImmortalWorkersHarness(_BrokenHarness):
    scheme = "broken-workers"


class PausedClaimBuriesHarness(_BrokenHarness):
    scheme = "broken-pause"


class UnguardedFireHarness(_BrokenHarness):
    scheme = "broken-fire"


class AlwaysMyTurnHarness(_BrokenHarness):
    scheme = "broken-turn"


class NonAtomicFireHarness(_BrokenHarness):
    scheme = "broken-half-fire"


class TiesByPathHarness(_BrokenHarness):
    scheme = "broken-ties"


class LapsedUncountedHarness(_BrokenHarness):
    scheme = "broken-stats"


class TwoStepMoveHarness(_BrokenHarness):
    scheme = "broken-moves"


class AckManyByIdHarness(_BrokenHarness):
    scheme = "broken-ack-many"


class LoopBlockingHarness(_BrokenHarness):
    scheme = "broken-async-blocks"


class UncheckedEnqueueHarness(_BrokenHarness):
    scheme = "broken-async-unchecked"
