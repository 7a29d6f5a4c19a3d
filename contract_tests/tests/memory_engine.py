"""An in-process engine built on the suite's model, for the meta-tests.

It serves ``memory://NAME`` URLs: stores opened on one name share one
database held in this process (so it cannot serve child processes). Every
operation takes one lock around the model, which makes it trivially atomic.
It exists to show that the suite passes on a correct engine that is not
SQLite, and that the harness capabilities skip what such an engine cannot do.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

import alkstore
from alkstore import (
    Job,
    JobHandle,
    ListedState,
    Queue,
    QueueOpts,
    QueueStats,
    Schedule,
    Store,
    Subscription,
    SweepResult,
    ThroughputPoint,
    WorkerInfo,
)
from alkstore.engine import (
    SCHEDULE_COLUMNS,
    EncodedPayload,
    Resolved,
    UnreadableSchedule,
    WakeLatch,
    check_engine_options,
    check_schema_version,
    read_schedule,
    schedule_to_values,
)
from alkstore.errors import EngineError, ValidationError
from alkstore_contract_tests import EngineHarness, StoreTarget
from alkstore_contract_tests.harness import JOB_INSERT_FAULT
from alkstore_contract_tests.model import ModelHandle, ModelJob, ModelResolution, ModelStore


@dataclass
class _Database:
    lock: threading.Lock = field(default_factory=threading.Lock)
    model: ModelStore = field(default_factory=ModelStore)
    payloads: dict[int, EncodedPayload] = field(default_factory=dict)
    next_id: int = 1
    migrated: bool = False
    latches: dict[str, list[WakeLatch]] = field(default_factory=dict)
    #: per schedule name: its stored columns (SCHEDULE_COLUMNS)
    schedules: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: queues whose inserts fail (the harness's job_inserts_fail)
    failing_queues: set[str] = field(default_factory=set)
    #: whether writes on live rows fail (the harness's job_writes_fail)
    writes_fail: bool = False
    #: per maintenance task: the instant its next turn may be taken
    maintenance_last: dict[str, datetime] = field(default_factory=dict)
    maintenance_locks: dict[str, threading.Lock] = field(default_factory=dict)
    #: the workers registry, by worker id
    workers: dict[str, WorkerInfo] = field(default_factory=dict)
    #: per (queue, minute): [completed, retried, dead]
    throughput: dict[tuple[str, datetime], list[int]] = field(default_factory=dict)

    def insert(
        self,
        queue: str,
        resolved: Resolved,
        payloads: Sequence[EncodedPayload],
        unique_keys: Sequence[str | None] | None = None,
    ) -> list[int]:
        """Insert rows (the caller holds :attr:`lock`); return their ids."""
        if queue in self.failing_queues:
            raise EngineError(f"memory engine: {JOB_INSERT_FAULT}")
        ids = list(range(self.next_id, self.next_id + len(payloads)))
        self.next_id += len(payloads)
        result = self.model.insert(
            queue, ids, [None] * len(ids), ModelResolution(**vars(resolved)), unique_keys
        )
        self.payloads.update(zip(ids, payloads, strict=True))
        return result

    def check_write(self) -> None:
        """Raise the injected fault of ``job_writes_fail`` (the caller holds
        :attr:`lock` and is about to change live rows)."""
        if self.writes_fail:
            raise EngineError("memory engine: injected job-write failure")

    def wake(self, queue: str) -> None:
        """Wake the queue's subscribers (call outside :attr:`lock`)."""
        with self.lock:
            latches = list(self.latches.get(queue, []))
        for latch in latches:
            latch.set()


_DATABASES: dict[str, _Database] = {}
_DATABASES_LOCK = threading.Lock()


def _database(url: str) -> _Database:
    with _DATABASES_LOCK:
        return _DATABASES.setdefault(url, _Database())


class MemoryStore(Store):
    def __init__(self, url: str, **options: Any) -> None:
        check_engine_options(options)
        super().__init__(clock=options.get("clock"), rng=options.get("rng"))
        self.db = _database(url)
        self.subscriptions: set[MemorySubscription] = set()
        migrate = options.get("migrate", True)
        check_schema_version(1 if self.db.migrated else None, 1, migrating=migrate)
        if migrate:
            self._migrate()

    def _open_queue(self, name: str, opts: QueueOpts) -> Queue:
        return MemoryQueue(self, name, opts)

    def _open_subscription(self, queue_name: str) -> Subscription:
        subscription = MemorySubscription(self, queue_name)
        self.subscriptions.add(subscription)
        return subscription

    def _migrate(self) -> None:
        self.db.migrated = True

    def _close(self) -> None:
        for subscription in list(self.subscriptions):
            subscription.close()

    def _put_worker(self, info: WorkerInfo) -> None:
        with self.db.lock:
            self.db.workers[info.id] = info
            for worker in list(self.db.workers.values()):
                if worker.last_seen_at + timedelta(seconds=worker.ttl_s) <= info.last_seen_at:
                    del self.db.workers[worker.id]

    def _delete_worker(self, worker_id: str) -> bool:
        with self.db.lock:
            return self.db.workers.pop(worker_id, None) is not None

    def _list_workers(self, now: datetime) -> list[WorkerInfo]:
        with self.db.lock:
            live = [
                w
                for w in self.db.workers.values()
                if w.last_seen_at + timedelta(seconds=w.ttl_s) > now
            ]
        return sorted(live, key=lambda w: (w.started_at, w.id))

    def _queue_names(self) -> list[str]:
        with self.db.lock:
            return self.db.model.queue_names()

    def _put_schedule(self, schedule: Schedule) -> Schedule:
        with self.db.lock:
            old = self.db.schedules.get(schedule.name)
            row = dict(zip(SCHEDULE_COLUMNS, schedule_to_values(schedule), strict=True))
            row["revision"] = 1 if old is None else old["revision"] + 1
            self.db.schedules[schedule.name] = row
        stored = read_schedule(list(row.values()))
        assert isinstance(stored, Schedule)
        return stored

    def _delete_schedule(self, name: str) -> bool:
        with self.db.lock:
            return self.db.schedules.pop(name, None) is not None

    def _list_schedules(self, due_at: datetime | None) -> list[Schedule | UnreadableSchedule]:
        with self.db.lock:
            rows = [dict(row) for row in self.db.schedules.values()]
        if due_at is None:
            rows.sort(key=lambda r: r["name"])
        else:
            rows = [r for r in rows if r["next_run_at"] <= due_at]
            rows.sort(key=lambda r: (r["next_run_at"], r["name"]))
        return [read_schedule(list(row.values())) for row in rows]

    def _guard(self, schedule: Schedule) -> dict[str, Any] | None:
        """The stored row if it is still ``schedule``'s revision at its
        ``next_run_at`` (the caller holds the lock), else ``None``."""
        stored = self.db.schedules.get(schedule.name)
        if (
            stored is None
            or stored["revision"] != schedule.revision
            or stored["next_run_at"] != schedule.next_run_at
        ):
            return None
        return stored

    def _fire_schedule(
        self,
        schedule: Schedule,
        boundary: datetime,
        next_run_at: datetime,
        resolved: Resolved,
        payload: EncodedPayload,
    ) -> int | None:
        with self.db.lock:
            stored = self._guard(schedule)
            if stored is None:
                return None
            (job_id,) = self.db.insert(schedule.queue, resolved, [payload])
            stored.update(next_run_at=next_run_at, last_run_at=boundary, last_job_id=job_id)
        self.db.wake(schedule.queue)
        return job_id

    def _skip_schedule(self, schedule: Schedule, next_run_at: datetime) -> bool:
        with self.db.lock:
            stored = self._guard(schedule)
            if stored is None:
                return False
            stored["next_run_at"] = next_run_at
            return True

    @contextlib.contextmanager
    def _maintenance_turn(self, task: str, interval_s: float) -> Iterator[bool]:
        with self.db.lock:
            held = self.db.maintenance_locks.setdefault(task, threading.Lock())
        if not held.acquire(blocking=False):
            yield False
            return
        try:
            now = self._now()
            with self.db.lock:
                last = self.db.maintenance_last.get(task)
                mine = last is None or now - last >= timedelta(seconds=interval_s)
                if mine:
                    self.db.maintenance_last[task] = now
            yield mine
        finally:
            held.release()


class MemorySubscription(Subscription):
    def __init__(self, store: MemoryStore, queue_name: str) -> None:
        super().__init__(store, queue_name)
        self._db = store.db
        self._latch = WakeLatch()
        with self._db.lock:
            self._db.latches.setdefault(queue_name, []).append(self._latch)

    def _wait(self, timeout_s: float) -> bool:
        return self._latch.wait(timeout_s)

    def _close(self) -> None:
        with self._db.lock:
            self._db.latches[self.queue_name].remove(self._latch)
        self._latch.set()  # release a blocked wait, which then sees the close


class MemoryQueue(Queue):
    _store: MemoryStore

    @property
    def db(self) -> _Database:
        return self._store.db

    def _job(self, row: ModelJob) -> Job:
        data = self.db.payloads[row.id]
        return Job(
            id=row.id,
            queue=row.queue,
            state=row.state,
            payload_bytes=data.data,
            content_type=data.content_type,
            priority=row.priority,
            run_at=row.run_at,
            expires_at=row.expires_at,
            enqueued_at=row.enqueued_at,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            visibility_timeout_s=row.visibility_timeout_s,
            backoff_base_s=row.backoff_base_s,
            backoff_cap_s=row.backoff_cap_s,
            worker_id=row.worker_id,
            claim_deadline=row.claim_deadline,
            last_error=row.last_error,
            died_at=row.died_at,
            unique_key=row.unique_key,
            finished_at=row.finished_at,
            result_bytes=row.result_bytes,
        )

    def _insert(
        self,
        resolved: Resolved,
        payloads: Sequence[EncodedPayload],
        unique_keys: Sequence[str | None] | None,
    ) -> list[int]:
        with self.db.lock:
            ids = self.db.insert(self.name, resolved, payloads, unique_keys)
        self.db.wake(self.name)
        return ids

    def _insert_tx(
        self, conn: Any, resolved: Resolved, payload: EncodedPayload, unique_key: str | None
    ) -> int:
        raise ValidationError("the memory engine has no application connections")

    def _claim(self, worker_id: str, n: int) -> list[JobHandle]:
        now = self._store._now()
        with self.db.lock:
            if self.db.writes_fail and copy.deepcopy(self.db.model).claim(
                self.name, worker_id, n, now
            ):
                self.db.check_write()  # as a trigger: only a claim that changes rows fails
            claims = self.db.model.claim(self.name, worker_id, n, now)
            return [MemoryHandle(self, self._job(c.snapshot), c) for c in claims]

    def _ack_batch(self, job_ids: list[int]) -> int:
        now = self._store._now()
        with self.db.lock:
            self.db.check_write()
            return self.db.model.ack_batch(self.name, job_ids, now)

    def _complete_batch(self, job_ids: list[int]) -> int:
        now = self._store._now()
        with self.db.lock:
            self.db.check_write()
            return self.db.model.ack_batch(self.name, job_ids, now, keep=True)

    def _cancel(self, job_id: int) -> bool:
        with self.db.lock:
            return self.db.model.cancel(self.name, job_id)

    def _get_job(self, job_id: int) -> Job | None:
        with self.db.lock:
            row = self.db.model.get_job(self.name, job_id)
            return None if row is None else self._job(row)

    def _sweep_expired(
        self, retention_s: float | None, keep_completed_s: float | None
    ) -> SweepResult:
        now = self._store._now()
        with self.db.lock:
            model = self.db.model
            return SweepResult(*model.sweep_expired(self.name, retention_s, now, keep_completed_s))

    def _stats(self) -> QueueStats:
        now = self._store._now()
        with self.db.lock:
            return QueueStats(*self.db.model.stats(self.name, now))

    def _lapsed_claims(self) -> int:
        now = self._store._now()
        with self.db.lock:
            return self.db.model.lapsed_claims(self.name, now)

    def _set_paused(self, paused: bool) -> bool:
        with self.db.lock:
            changed = self.db.model.set_paused(self.name, paused)
        if changed and not paused:
            self.db.wake(self.name)
        return changed

    def _is_paused(self) -> bool:
        with self.db.lock:
            return self.name in self.db.model.paused

    def _dead_jobs(self, limit: int, after_id: int | None) -> list[Job]:
        with self.db.lock:
            return [self._job(row) for row in self.db.model.dead_jobs(self.name, limit, after_id)]

    def _requeue(self, job_id: int, now: datetime, run_at: datetime) -> bool:
        with self.db.lock:
            moved = self.db.model.requeue(self.name, job_id, run_at)
        if moved:
            self.db.wake(self.name)
        return moved

    def _run_now(self, job_id: int, now: datetime) -> bool:
        with self.db.lock:
            made_due = self.db.model.run_now(self.name, job_id, now)
        if made_due:
            self.db.wake(self.name)
        return made_due

    def _jobs(
        self, state: ListedState, limit: int, after_id: int | None, now: datetime
    ) -> list[Job]:
        with self.db.lock:
            rows = self.db.model.jobs(self.name, state, limit, after_id, now)
            return [self._job(row) for row in rows]

    def _completed_count(self) -> int:
        with self.db.lock:
            return sum(r.queue == self.name for r in self.db.model.completed.values())

    def _add_throughput(
        self, minute: datetime, completed: int, retried: int, dead: int, prune_before: datetime
    ) -> None:
        with self.db.lock:
            counts = self.db.throughput.setdefault((self.name, minute), [0, 0, 0])
            for i, n in enumerate((completed, retried, dead)):
                counts[i] += n
            for queue, at in list(self.db.throughput):
                if queue == self.name and at < prune_before:
                    del self.db.throughput[queue, at]

    def _throughput(self, since: datetime) -> list[ThroughputPoint]:
        with self.db.lock:
            return [
                ThroughputPoint(at, *counts)
                for (queue, at), counts in sorted(self.db.throughput.items())
                if queue == self.name and at >= since
            ]

    def _purge_dead(self, cutoff: datetime | None) -> int:
        with self.db.lock:
            if cutoff is None:
                return self.db.model.purge_dead(self.name, None, datetime.min)
            # died_at <= cutoff is died_at + 0 <= cutoff
            return self.db.model.purge_dead(self.name, 0, cutoff)


class MemoryHandle(JobHandle):
    _queue: MemoryQueue

    def __init__(self, queue: MemoryQueue, job: Job, claim: ModelHandle) -> None:
        super().__init__(queue, job)
        self._claim = claim

    def _now_and_db(self) -> Any:
        return self._queue.store._now(), self._queue.db

    def _ack(self) -> bool:
        now, db = self._now_and_db()
        with db.lock:
            db.check_write()
            return bool(db.model.ack(self._claim, now))

    def _complete(self, result: bytes | None) -> bool:
        now, db = self._now_and_db()
        with db.lock:
            db.check_write()
            return bool(db.model.ack(self._claim, now, keep=True, result=result))

    def _retry(self, error: str, delay_s: float) -> bool:
        now, db = self._now_and_db()
        with db.lock:
            db.check_write()
            return bool(db.model.retry(self._claim, error, now, delay_s))

    def _dead_letter(self, error: str) -> bool:
        now, db = self._now_and_db()
        with db.lock:
            db.check_write()
            return bool(db.model.fail(self._claim, error, now))

    def _heartbeat(self, extend_s: float) -> bool:
        now, db = self._now_and_db()
        with db.lock:
            db.check_write()
            return bool(db.model.heartbeat(self._claim, extend_s, now))

    def _release(self) -> bool:
        now, db = self._now_and_db()
        with db.lock:
            db.check_write()
            released = bool(db.model.release(self._claim, now))
        if released:
            db.wake(self._queue.name)
        return released


alkstore.register("memory", MemoryStore)


class MemoryHarness(EngineHarness):
    """A fresh in-process database per test; no application connection, no
    dead-letter fault injection, no child processes."""

    spawned_processes_can_open = False

    @pytest.fixture
    def alkstore_target(self) -> Iterator[StoreTarget]:
        url = f"memory://{uuid.uuid4().hex}"
        yield StoreTarget(url, {})
        with _DATABASES_LOCK:
            _DATABASES.pop(url, None)

    @contextlib.contextmanager
    def job_inserts_fail(self, target: StoreTarget, queue: str) -> Iterator[None]:
        db = _database(target.url)
        with db.lock:
            db.failing_queues.add(queue)
        try:
            yield
        finally:
            with db.lock:
                db.failing_queues.discard(queue)

    def overwrite_schedule_column(
        self, target: StoreTarget, name: str, column: str, value: str | bytes
    ) -> None:
        db = _database(target.url)
        with db.lock:
            db.schedules[name][column] = value

    @contextlib.contextmanager
    def job_writes_fail(self, target: StoreTarget) -> Iterator[None]:
        db = _database(target.url)
        with db.lock:
            db.writes_fail = True
        try:
            yield
        finally:
            with db.lock:
                db.writes_fail = False
