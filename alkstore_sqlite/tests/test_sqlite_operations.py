"""Pause and resume, dead-letter requeue, schedules, queue listing and
maintenance turns: the SQLite side (schema version 3).

The shared contract suite covers the public semantics; these tests cover
what only this engine can get wrong: the claim's pause guard writing
nothing, wakes that carry no new job id reaching other processes, the
write lock as the exactly-once guard, the plans, and the upgrade from
version 2.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlite_children

from alkstore import QueueOpts, QueueStats
from alkstore.contract.schedule import Schedule
from alkstore.engine import EncodedPayload, WakeLatch
from alkstore.errors import EngineError
from alkstore.logic.resolution import EnqueueOptions, resolve
from alkstore_contract_tests import T0, ManualClock
from alkstore_sqlite import (
    SCHEMA_VERSION,
    SqliteStore,
    _maintenance,
    _operations,
    _queue,
    _schema,
    _wake,
    open_store,
)
from alkstore_sqlite._connection import run_in_transaction
from alkstore_sqlite._rows import to_us
from alkstore_sqlite._schedules import LIST_DUE


def _rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the job tables and the queue tables, as stored."""
    with sqlite3.connect(path) as conn:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in (
                "_alkstore_jobs",
                "_alkstore_dead",
                "_alkstore_queues",
                "_alkstore_wakes",
                "sqlite_sequence",
            )
        }


def _state(path: Path, job_id: int) -> tuple[str, ...]:
    """Where the job is: its private state in the live table, 'dead', both or
    neither, read in one snapshot."""
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT (SELECT state FROM _alkstore_jobs WHERE id = :id), "
            "       (SELECT 'dead' FROM _alkstore_dead WHERE id = :id)",
            {"id": job_id},
        ).fetchone()
    return tuple(v for v in row if v is not None)


def _kill(store: SqliteStore, queue_name: str, payload: object = "doomed", **opts: Any) -> int:
    """A dead job of ``queue_name``: enqueued, claimed and failed."""
    queue = store.queue(queue_name, QueueOpts(**opts))
    job_id = queue.enqueue(payload)
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.id == job_id
    assert handle.fail("boom")
    return job_id


# -- pause ---------------------------------------------------------------------


def _exhausted_claim(store: SqliteStore, clock: ManualClock) -> int:
    """A lapsed claim on its last attempt: the next claim dead-letters it."""
    queue = store.queue("q", QueueOpts(visibility_timeout_s=5, max_attempts=1))
    job_id = queue.enqueue("last", priority=9)
    handle = queue.claim_one("gone")
    assert handle is not None
    clock.advance(10)
    return job_id


def test_a_paused_claim_hands_out_nothing_and_writes_nothing(
    store: SqliteStore, db_path: Path, clock: ManualClock
) -> None:
    queue = store.queue("q")
    queue.enqueue("came due", delay=5)  # a move for the claim to make
    exhausted = _exhausted_claim(store, clock)
    queue.enqueue("due")
    assert queue.pause()
    assert not queue.pause()
    assert queue.is_paused()
    before = _rows(db_path)
    with sqlite3.connect(db_path) as watcher:
        version = watcher.execute("PRAGMA data_version").fetchone()[0]
        assert queue.claim_batch("w", 10) == []
        assert queue.claim_one("w") is None
        # No commit by any other connection: nothing was written.
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == version
    assert _rows(db_path) == before
    # The exhausted claim was not dead-lettered.
    assert _state(db_path, exhausted) == ("processing",)
    # Enqueues still land; other queues are not paused.
    queue.enqueue("while paused")
    assert not store.queue("other").is_paused()
    store.queue("other").enqueue("x")
    assert store.queue("other").claim_one("w") is not None

    assert queue.resume()
    assert not queue.resume()
    assert not queue.is_paused()
    claimed = queue.claim_batch("w", 10)
    assert [h.payload for h in claimed] == ["came due", "due", "while paused"]
    assert _state(db_path, exhausted) == ("dead",)


def test_a_pause_after_the_look_stops_the_claim_statements(
    store: SqliteStore, db_path: Path, clock: ManualClock
) -> None:
    """The look runs in a read snapshot; a pause that commits between it and
    the claim's write must still stop the write."""
    queue = store.queue("q")
    _exhausted_claim(store, clock)
    queue.enqueue("due")
    queue.pause()
    params = {
        "queue": "q",
        "worker": "w",
        "now": to_us(clock()),
        "n": 5,
        "error": "max attempts exceeded",
    }
    before = _rows(db_path)
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        assert conn.execute(_queue.LOOK, params).fetchone()[0] == _queue.NOTHING
        for sql in (_queue.CLAIM_DUE_ONE, _queue.CLAIM_DUE, _queue.CLAIM_ANY):
            assert conn.execute(sql, params).fetchall() == []
        assert run_in_transaction(conn, _queue._move_and_claim, params) == []
    finally:
        conn.close()
    assert _rows(db_path) == before


def test_pause_is_durable_and_shared(open_sqlite: Callable[..., SqliteStore]) -> None:
    first, second = open_sqlite(), open_sqlite()
    first.queue("q").enqueue(1)
    assert first.queue("q").pause()
    assert second.queue("q").is_paused()
    assert second.queue("q").claim_one("w") is None
    assert not second.queue("q").pause()
    assert second.queue("q").resume()
    assert not first.queue("q").is_paused()
    assert first.queue("q").claim_one("w") is not None


def test_a_resume_wakes_this_process_at_once_and_only_once(store: SqliteStore) -> None:
    queue = store.queue("q")
    queue.pause()
    with store.listen("q") as sub, store.listen("other") as other:
        assert not queue.pause()
        assert not sub.wait(0)
        assert queue.resume()
        assert sub.wait(0)
        # The watcher sees the same commit later: it must not wake again.
        assert not sub.wait(0.05)
        assert not other.wait(0)
        # Resuming a queue that runs wakes nobody.
        assert not queue.resume()
        assert not sub.wait(0.05)


def _wait_in_thread(sub: Any, barrier: Any) -> tuple[threading.Thread, list[bool]]:
    woke: list[bool] = []

    def wait_for_wake() -> None:
        barrier.wait()
        woke.append(sub.wait(sqlite_children.CHILD_TIMEOUT_S))

    waiter = threading.Thread(target=wait_for_wake)
    waiter.start()
    return waiter, woke


def test_a_resume_in_another_process_wakes(db_url: str, store: SqliteStore) -> None:
    queue = store.queue("q")
    queue.enqueue("waiting")
    queue.pause()
    barrier = sqlite_children.barrier(2)
    with store.listen("q") as sub:
        assert not sub.wait(0)
        waiter, woke = _wait_in_thread(sub, barrier)
        (resumed,) = sqlite_children.run_children(
            sqlite_children.resume_after, [(db_url, barrier, "q")]
        )
        waiter.join()
    assert resumed is True
    assert woke == [True]
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.payload == "waiting"


# -- requeue -------------------------------------------------------------------


def test_a_requeue_in_another_process_wakes(db_url: str, db_path: Path, store: SqliteStore) -> None:
    job_id = _kill(store, "q")
    # A newer job id exists: the requeued job's id is below what the
    # watcher has looked at.
    newer = store.queue("elsewhere").enqueue("newer")
    assert newer > job_id
    barrier = sqlite_children.barrier(2)
    with store.listen("q") as sub:
        assert not sub.wait(0)
        waiter, woke = _wait_in_thread(sub, barrier)
        (requeued,) = sqlite_children.run_children(
            sqlite_children.requeue_after, [(db_url, barrier, "q", job_id)]
        )
        waiter.join()
    assert requeued is True
    assert woke == [True]
    handle = store.queue("q").claim_one("w")
    assert handle is not None
    assert (handle.id, handle.payload, handle.attempts) == (job_id, "doomed", 2)


def test_a_requeue_wakes_this_process_at_once(store: SqliteStore, db_path: Path) -> None:
    first, second = _kill(store, "q"), _kill(store, "q")
    with store.listen("q") as sub:
        assert store.queue("q").requeue(first)
        assert sub.wait(0)
        assert not sub.wait(0.05)
        assert not store.queue("q").requeue(first)
        assert not sub.wait(0.05)
        assert store.queue("q").requeue(second)
        assert sub.wait(0)
    # The wake record keeps one row per queue, its id renewed by each wake.
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT id, queue FROM _alkstore_wakes").fetchall() == [(2, "q")]


def test_a_late_subscription_gets_wakes_the_watcher_passed(store: SqliteStore) -> None:
    job_id = _kill(store, "b")
    with store.listen("a"):
        (watch,) = _wake._registry.watches.values()
        jobs_before, wakes_before = watch.looked_up_to, watch.wakes_looked_up_to
        assert jobs_before is not None
        assert wakes_before is not None
        conn = sqlite3.connect(store.path, isolation_level=None)
        try:
            # Another connection's requeue: only the watcher can see it.
            conn.execute("BEGIN IMMEDIATE")
            assert _operations.move_back(
                conn, {"id": job_id, "queue": "b", "run_at": to_us(T0), "state": "pending"}
            )
            conn.execute("COMMIT")
        finally:
            conn.close()
        for _ in range(5000):
            if watch.wakes_looked_up_to != wakes_before:
                break
            threading.Event().wait(0.001)
        assert watch.wakes_looked_up_to == wakes_before + 1
        latch = WakeLatch()
        _wake.subscribe(
            store._wake_key,
            "b",
            latch,
            jobs_before,
            wakes_before,
            opened=store._opened,
            poll_interval_s=0.001,
            busy_timeout_s=5,
        )
        try:
            assert latch.wait(5)
        finally:
            _wake.unsubscribe(store._wake_key, "b", latch)


def test_requeue_restores_the_row_with_its_old_id(
    store: SqliteStore, db_path: Path, clock: ManualClock
) -> None:
    opts = QueueOpts(visibility_timeout_s=7.5, backoff_base_s=3, backoff_cap_s=90, max_attempts=4)
    queue = store.queue("q", opts)
    job_id = queue.enqueue(b"\x00bytes", priority=3, expires=100)
    handle = queue.claim_one("w")
    assert handle is not None
    clock.advance(5)
    assert handle.fail("it broke")
    dead = queue.get_job(job_id)
    assert dead is not None
    assert dead.state == "dead"
    clock.advance(25)
    with sqlite3.connect(db_path) as conn:
        (seq_before,) = conn.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = '_alkstore_jobs'"
        ).fetchone()

    # Due later: out of the claim's walk until then.
    assert queue.requeue(job_id, delay=30)
    assert _state(db_path, job_id) == ("scheduled",)
    job = queue.get_job(job_id)
    assert job is not None
    run_at = T0 + timedelta(seconds=60)
    assert job.state == "pending"
    assert (job.id, job.queue, job.payload, job.priority) == (job_id, "q", b"\x00bytes", 3)
    assert (job.attempts, job.max_attempts) == (1, 5)  # kept, and 4 more allowed
    assert (job.visibility_timeout_s, job.backoff_base_s, job.backoff_cap_s) == (7.5, 3, 90)
    assert (job.run_at, job.expires_at) == (run_at, run_at + timedelta(seconds=100))
    assert (job.enqueued_at, job.last_error) == (T0, "it broke")
    assert (job.worker_id, job.claim_deadline, job.died_at) == (None, None, None)
    assert queue.stats() == QueueStats(pending=0, scheduled=1, processing=0, dead=0)
    assert queue.claim_one("w") is None
    clock.advance(30)
    again = queue.claim_one("w")
    assert again is not None
    assert (again.id, again.attempts) == (job_id, 2)
    # The id is not handed out again: new jobs go on above the old high mark.
    with sqlite3.connect(db_path) as conn:
        (seq_after,) = conn.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = '_alkstore_jobs'"
        ).fetchone()
    assert seq_after == seq_before
    assert queue.enqueue("next") == seq_before + 1


def test_requeue_now_is_pending_and_never_expiring_stays_so(
    store: SqliteStore, db_path: Path
) -> None:
    job_id = _kill(store, "q")
    assert not store.queue("other").requeue(job_id)
    assert store.queue("q").requeue(job_id)
    assert _state(db_path, job_id) == ("pending",)
    job = store.queue("q").get_job(job_id)
    assert job is not None
    assert job.expires_at is None
    # Live now: not a dead job any more.
    assert not store.queue("q").requeue(job_id)
    assert not store.queue("q").requeue(2**63)
    assert not store.queue("q").requeue(10**30)


def test_requeue_races_exactly_one_wins(open_sqlite: Callable[..., SqliteStore]) -> None:
    threads = 8
    stores = [open_sqlite() for _ in range(threads)]
    rounds = 30
    ids = [_kill(stores[0], "q", i) for i in range(rounds)]
    barrier = threading.Barrier(threads)
    wins: list[list[bool]] = [[] for _ in range(rounds)]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def racer(i: int) -> None:
        try:
            queue = stores[i].queue("q")
            for r, job_id in enumerate(ids):
                barrier.wait()
                won = queue.requeue(job_id)
                with lock:
                    wins[r].append(won)
        except BaseException as error:
            errors.append(error)
            barrier.abort()

    workers = [threading.Thread(target=racer, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors, errors
    assert [w.count(True) for w in wins] == [1] * rounds
    assert stores[0].queue("q").stats() == QueueStats(
        pending=rounds, scheduled=0, processing=0, dead=0
    )


def test_a_job_is_in_exactly_one_table_while_it_is_requeued(store: SqliteStore) -> None:
    job_id = _kill(store, "q")
    stop = threading.Event()
    seen: set[tuple[str, ...]] = set()

    def observe() -> None:
        while not stop.is_set():
            seen.add(tuple(s if s == "dead" else "live" for s in _state(Path(store.path), job_id)))

    observer = threading.Thread(target=observe)
    observer.start()
    try:
        queue = store.queue("q")
        for _ in range(100):
            assert queue.requeue(job_id)
            handle = queue.claim_one("w")
            assert handle is not None
            assert handle.fail("again")
    finally:
        stop.set()
        observer.join()
    assert seen <= {("live",), ("dead",)}


def test_a_failed_requeue_leaves_the_dead_row(store: SqliteStore, db_path: Path) -> None:
    job_id = _kill(store, "q")
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "CREATE TRIGGER fail_requeue BEFORE DELETE ON _alkstore_dead "
            "BEGIN SELECT RAISE(ABORT, 'injected'); END"
        )
    with store.listen("q") as sub:
        with pytest.raises(EngineError, match="injected"):
            store.queue("q").requeue(job_id)
        assert not sub.wait(0.05)
    assert _state(db_path, job_id) == ("dead",)
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP TRIGGER fail_requeue")
        assert conn.execute("SELECT count(*) FROM _alkstore_wakes").fetchone() == (0,)


# -- dead-letter pages and purge -------------------------------------------------


def test_dead_jobs_pages_through_one_queue(store: SqliteStore, clock: ManualClock) -> None:
    ids = [_kill(store, "q", i) for i in range(7)]
    _kill(store, "other")
    queue = store.queue("q")
    first = queue.dead_jobs(limit=3)
    assert [j.id for j in first] == ids[:3]
    assert {j.state for j in first} == {"dead"}
    assert [j.payload for j in first] == [0, 1, 2]
    second = queue.dead_jobs(limit=3, after_id=first[-1].id)
    assert [j.id for j in second] == ids[3:6]
    assert [j.id for j in queue.dead_jobs(limit=3, after_id=second[-1].id)] == ids[6:]
    assert queue.dead_jobs(after_id=ids[-1]) == []
    assert queue.dead_jobs(after_id=2**63 - 1) == []
    assert store.queue("none").dead_jobs() == []


def test_purge_dead_by_age_and_all(store: SqliteStore, clock: ManualClock) -> None:
    old = [_kill(store, "q", i) for i in range(3)]
    clock.advance(100)
    young = _kill(store, "q", "young")
    other = _kill(store, "other")
    queue = store.queue("q")
    assert queue.purge_dead(older_than=101) == 0
    # died_at + older_than <= now: exactly 100 seconds old is purged.
    assert queue.purge_dead(older_than=100) == 3
    assert [j.id for j in queue.dead_jobs()] == [young]
    assert all(queue.get_job(i) is None for i in old)
    assert queue.purge_dead() == 1
    assert queue.purge_dead() == 0
    assert [j.id for j in store.queue("other").dead_jobs()] == [other]


# -- plans -------------------------------------------------------------------------


def _plan(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[str]:
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


def test_dead_pages_and_due_schedules_are_index_ranges(store: SqliteStore, db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        assert _plan(conn, _operations.DEAD_PAGE, ("q", 0, 10)) == [
            "SEARCH _alkstore_dead USING INDEX _alkstore_dead_queue (queue=? AND rowid>?)"
        ]
        assert _plan(conn, LIST_DUE, (0,)) == [
            "SEARCH _alkstore_schedules USING INDEX _alkstore_schedules_due (next_run_at<?)"
        ]
        # The pause guard is one primary-key probe (or its index).
        guard = _plan(conn, _queue._PAUSED_NOW, {"queue": "q"})
        assert [step for step in guard if "_alkstore_queues" in step] in (
            ["SEARCH _alkstore_queues USING PRIMARY KEY (name=?)"],
            ["SEARCH _alkstore_queues USING COVERING INDEX _alkstore_queues_paused (name=?)"],
        )


def test_the_wake_detector_reads_a_rowid_range_of_wakes(store: SqliteStore, db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        assert _plan(conn, _wake._NEW_WAKES, (0,)) == [
            "SEARCH _alkstore_wakes USING INTEGER PRIMARY KEY (rowid>?)"
        ]


def test_queue_names_seeks_indexes_only(store: SqliteStore, db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        plan = _plan(conn, _operations.QUEUE_NAMES)
    searches = [step for step in plan if step.startswith("SEARCH _alkstore")]
    assert len(searches) == 8  # one per index of _NAME_INDEXES
    assert all("USING" in step and "INDEX" in step for step in searches), searches
    assert not [step for step in plan if step.startswith("SCAN _alkstore")]
    assert not [step for step in plan if "TEMP B-TREE" in step]


@contextmanager
def _counting(store: SqliteStore) -> Iterator[dict[str, int]]:
    """Count the VM instructions of the store's operations inside (one
    thread, so the pool lends its one connection)."""
    store.queue("warm-up").stats()
    (conn,) = store._pool._idle
    counter = {"steps": 0}

    def count() -> int:
        counter["steps"] += 1
        return 0

    conn.set_progress_handler(count, 1)
    try:
        yield counter
    finally:
        conn.set_progress_handler(None, 1)


def _names_work(path: Path, rows: int) -> tuple[int, list[str]]:
    clock = ManualClock()
    with closing(open_store(f"sqlite:///{path}", clock=clock)) as store:
        for name in ("a", "b", "c"):
            queue = store.queue(name, QueueOpts(visibility_timeout_s=5))
            queue.enqueue_many(["x"] * rows)
            queue.enqueue_many(["x"] * rows, delay=60, expires=120)
            queue.claim_batch("w", rows // 2)
        with _counting(store) as counter:
            names = store.queue_names()
        return counter["steps"], names


def test_queue_names_work_does_not_grow_with_the_jobs(tmp_path: Path) -> None:
    small, small_names = _names_work(tmp_path / "small.db", 200)
    large, large_names = _names_work(tmp_path / "large.db", 20_000)
    assert small_names == large_names == ["a", "b", "c"]
    assert large <= small * 1.5, (small, large)


def test_queue_names_lists_every_state(
    store: SqliteStore, db_path: Path, clock: ManualClock
) -> None:
    assert store.queue_names() == []
    long_claims = QueueOpts(visibility_timeout_s=3600)
    store.queue("pending").enqueue(1)
    store.queue("scheduled").enqueue(1, delay=3600)
    store.queue("processing", long_claims).enqueue(1)
    assert store.queue("processing").claim_one("w") is not None
    lapsed = store.queue("lapsed", QueueOpts(visibility_timeout_s=5))
    lapsed.enqueue("low", priority=-1)
    assert lapsed.claim_one("w") is not None
    expired = store.queue("expired")
    expired.enqueue(1, expires=5)
    _kill(store, "dead")
    store.queue("paused").pause()
    store.queue("resumed").pause()
    store.queue("resumed").resume()
    clock.advance(10)
    # Each claim sets a row aside: the lapsed claim (while it claims another
    # job, acked at once) and the expired job.
    lapsed.enqueue("high", priority=5)
    handle = lapsed.claim_one("w")
    assert handle is not None
    assert handle.ack()
    assert expired.claim_one("w") is None
    with sqlite3.connect(db_path) as conn:
        states = sorted(conn.execute("SELECT queue, state FROM _alkstore_jobs ORDER BY queue"))
    assert states == [
        ("expired", "expired"),
        ("lapsed", "lapsed"),
        ("pending", "pending"),
        ("processing", "processing"),
        ("scheduled", "scheduled"),
    ]
    assert store.queue_names() == sorted([*(queue for queue, _ in states), "dead", "paused"])


# -- schedules ---------------------------------------------------------------------


def _schedule(name: str = "tick", **changes: Any) -> Schedule:
    values: dict[str, Any] = {
        "name": name,
        "spec": "* * * * *",
        "timezone": "UTC",
        "queue": "q",
        "payload_bytes": b'{"n":1}',
        "content_type": "application/json",
        "priority": None,
        "max_attempts": None,
        "expires_s": None,
        "queue_opts": QueueOpts(),
        "catch_up": "latest",
        "revision": 0,
        "created_at": T0,
        "next_run_at": T0 + timedelta(minutes=1),
        "last_run_at": None,
        "last_job_id": None,
    }
    values.update(changes)
    return Schedule(**values)


def _fire(store: SqliteStore, schedule: Schedule, boundary: datetime) -> int | None:
    resolved = resolve(boundary, schedule.queue_opts, EnqueueOptions(run_at=boundary))
    payload = EncodedPayload(schedule.payload_bytes, schedule.content_type)
    return store._fire_schedule(
        schedule, boundary, boundary + timedelta(minutes=1), resolved, payload
    )


def test_put_list_and_delete_schedules(store: SqliteStore) -> None:
    opts = QueueOpts(visibility_timeout_s=12.5, priority=3)
    first = store._put_schedule(_schedule("b", queue_opts=opts, priority=7, expires_s=30.0))
    assert first.revision == 1
    assert first == _schedule("b", queue_opts=opts, priority=7, expires_s=30.0, revision=1)
    assert first.payload == {"n": 1}
    later = T0 + timedelta(minutes=5)
    store._put_schedule(_schedule("a", next_run_at=later))
    store._put_schedule(_schedule("c", next_run_at=T0 + timedelta(minutes=1)))
    assert [s.name for s in store._list_schedules(None)] == ["a", "b", "c"]
    assert [s.name for s in store._list_schedules(T0)] == []
    assert [s.name for s in store._list_schedules(T0 + timedelta(minutes=1))] == ["b", "c"]
    assert [s.name for s in store._list_schedules(later)] == ["b", "c", "a"]
    assert store._delete_schedule("b")
    assert not store._delete_schedule("b")
    assert [s.name for s in store.schedules()] == ["a", "c"]


def test_a_replaced_schedule_counts_revisions_and_forgets_its_runs(store: SqliteStore) -> None:
    first = store._put_schedule(_schedule())
    boundary = first.next_run_at
    job_id = _fire(store, first, boundary)
    assert job_id is not None
    (fired,) = store._list_schedules(None)
    assert (fired.revision, fired.last_run_at, fired.last_job_id) == (1, boundary, job_id)
    assert fired.next_run_at == boundary + timedelta(minutes=1)
    replaced = store._put_schedule(
        _schedule(spec="*/5 * * * *", created_at=T0 + timedelta(hours=1))
    )
    assert replaced.revision == 2
    assert (replaced.spec, replaced.last_run_at, replaced.last_job_id) == (
        "*/5 * * * *",
        None,
        None,
    )
    assert replaced.created_at == T0 + timedelta(hours=1)
    # A tick holding the old revision fires nothing.
    stale = _schedule(revision=1, next_run_at=replaced.next_run_at)
    assert _fire(store, stale, replaced.next_run_at) is None
    assert not store._skip_schedule(stale, T0 + timedelta(hours=2))
    assert store._list_schedules(None) == [replaced]


def test_fire_inserts_the_job_and_wakes(store: SqliteStore, clock: ManualClock) -> None:
    schedule = store._put_schedule(
        _schedule(priority=4, max_attempts=2, expires_s=600.0, queue_opts=QueueOpts(priority=1))
    )
    boundary = schedule.next_run_at
    clock.set(boundary + timedelta(seconds=3))
    resolved = resolve(
        clock(),
        schedule.queue_opts,
        EnqueueOptions(run_at=boundary, priority=4, max_attempts=2, expires_s=600.0),
    )
    with store.listen("q") as sub:
        job_id = store._fire_schedule(
            schedule,
            boundary,
            boundary + timedelta(minutes=1),
            resolved,
            EncodedPayload(schedule.payload_bytes, schedule.content_type),
        )
        assert job_id is not None
        assert sub.wait(0)
        assert not sub.wait(0.05)
    job = store.queue("q").get_job(job_id)
    assert job is not None
    assert (job.payload, job.priority, job.max_attempts) == ({"n": 1}, 4, 2)
    assert (job.run_at, job.enqueued_at) == (boundary, clock())
    assert job.expires_at == clock() + timedelta(seconds=600)
    # The same boundary again: the guard fails, nothing is written.
    assert _fire(store, schedule, boundary) is None
    assert store.queue("q").stats().pending == 1


def test_skip_advances_only_next_run_at(store: SqliteStore) -> None:
    schedule = store._put_schedule(_schedule())
    later = T0 + timedelta(minutes=10)
    assert store._skip_schedule(schedule, later)
    assert not store._skip_schedule(schedule, later)
    (skipped,) = store._list_schedules(None)
    assert (skipped.next_run_at, skipped.last_run_at, skipped.revision) == (later, None, 1)
    assert store.queue("q").stats().pending == 0


def test_fire_races_from_many_processes_exactly_once(
    db_url: str, store: SqliteStore, clock: ManualClock
) -> None:
    processes = 5
    schedule = store._put_schedule(_schedule())
    boundary = schedule.next_run_at
    barrier = sqlite_children.barrier(processes)
    results = sqlite_children.run_children(
        sqlite_children.fire_at_once, [(db_url, barrier, "tick", boundary)] * processes
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1, results
    assert results.count(None) == processes - 1
    queue = store.queue("q")
    clock.set(boundary)
    assert queue.stats() == QueueStats(pending=1, scheduled=0, processing=0, dead=0)
    (fired,) = store._list_schedules(None)
    assert (fired.last_job_id, fired.last_run_at) == (winners[0], boundary)
    assert fired.next_run_at == boundary + timedelta(minutes=1)
    job = queue.get_job(winners[0])
    assert job is not None
    assert job.payload == {"n": 1}


# -- maintenance turns -------------------------------------------------------------


def test_maintenance_turn_is_taken_once_per_interval(
    store: SqliteStore, clock: ManualClock
) -> None:
    with store._maintenance_turn("sweep", 60) as mine:
        assert mine
        with store._maintenance_turn("sweep", 60) as again:
            assert not again
        with store._maintenance_turn("other", 60) as other:
            assert other
    clock.advance(59.999999)
    with store._maintenance_turn("sweep", 60) as mine:
        assert not mine
    clock.advance(0.000001)
    with store._maintenance_turn("sweep", 60) as mine:
        assert mine
    # An exception in the block propagates; the turn was taken all the same.
    clock.advance(60)

    def fail_in_turn() -> None:
        with store._maintenance_turn("sweep", 60) as mine:
            assert mine
            raise RuntimeError

    with pytest.raises(RuntimeError):
        fail_in_turn()
    with store._maintenance_turn("sweep", 60) as mine:
        assert not mine


def test_maintenance_turn_is_exclusive_across_processes(db_url: str, store: SqliteStore) -> None:
    processes = 5
    rounds = [T0, T0 + timedelta(seconds=30), T0 + timedelta(seconds=60)]
    taken = []
    for now in rounds:
        barrier = sqlite_children.barrier(processes)
        results = sqlite_children.run_children(
            sqlite_children.maintenance_turn_at_once,
            [(db_url, barrier, "sweep", 60.0, now)] * processes,
        )
        taken.append(results.count(True))
    # Half an interval later nobody; a whole one later exactly one again.
    assert taken == [1, 0, 1]


def test_a_held_turn_excludes_other_processes_past_its_interval(
    db_url: str, store: SqliteStore, clock: ManualClock
) -> None:
    later = T0 + timedelta(seconds=1000)

    def elsewhere() -> bool:
        (mine,) = sqlite_children.run_children(
            sqlite_children.maintenance_turn_at_once,
            [(db_url, sqlite_children.barrier(1), "sweep", 60.0, later)],
        )
        return bool(mine)

    with store._maintenance_turn("sweep", 60) as mine:
        assert mine
        clock.set(later)
        # Due again, but the turn is still held: another process gets no
        # turn, and does not wait for one.
        assert not elsewhere()
    assert elsewhere()


def test_a_crashed_holder_does_not_keep_the_turn(
    db_url: str, store: SqliteStore, clock: ManualClock
) -> None:
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=sqlite_children.take_turn_and_die, args=(db_url, "sweep", 60.0, T0))
    child.start()
    child.join(sqlite_children.CHILD_TIMEOUT_S)
    assert child.exitcode == 3
    # The interval still counts from the dead holder's turn ...
    clock.set(T0 + timedelta(seconds=59))
    with store._maintenance_turn("sweep", 60) as mine:
        assert not mine
    # ... but its lock died with it.
    clock.set(T0 + timedelta(seconds=60))
    with store._maintenance_turn("sweep", 60) as mine:
        assert mine


def test_one_lock_file_per_task_beside_the_database(store: SqliteStore) -> None:
    assert _maintenance.lock_path("/d/jobs.db", "sweep") == "/d/jobs.db-alkstore-sweep.lock"
    odd = _maintenance.lock_path("/d/jobs.db", "../../etc/x y")
    assert odd.startswith("/d/jobs.db-alkstore-")
    assert "/" not in odd.removeprefix("/d/")
    assert odd != _maintenance.lock_path("/d/jobs.db", "../../etc/x z")
    with store._maintenance_turn("sweep", 60) as mine:
        assert mine
    assert Path(_maintenance.lock_path(store.path, "sweep")).exists()


# -- schema version 3 --------------------------------------------------------------


def _make_version_2(path: Path) -> None:
    """A version-2 file with live rows in every state and dead rows.

    The schema is version 2's migrations; the rows are written by this
    code (whose job and dead-letter writes are version 2's) on the upgraded
    file, whose version-3 and version-4 objects are then dropped again.
    """
    clock = ManualClock()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_schema._CREATE_META)
        for statements in _schema._MIGRATIONS[:2]:
            for statement in statements:
                conn.execute(statement, {"now": to_us(clock())})
        conn.execute("INSERT INTO _alkstore_meta (key, value) VALUES ('schema_version', 2)")
        conn.execute("COMMIT")
        with sqlite3.connect(path) as check:
            v2_objects = set(check.execute("SELECT type, name, sql FROM sqlite_schema"))
    finally:
        conn.close()
    with closing(open_store(f"sqlite:///{path}", clock=clock)) as store:
        queue = store.queue("q", QueueOpts(visibility_timeout_s=5))
        queue.enqueue("low", priority=-1)
        assert queue.claim_one("w") is not None
        queue.enqueue_many(["a", "b"])
        queue.enqueue("future", delay=3600)
        queue.enqueue("expiring", expires=5)
        _kill(store, "graveyard", "dead one")
        _kill(store, "graveyard", "dead two")
        clock.advance(10)
        # Sets the lapsed claim and the expired job aside, claims "a".
        handle = queue.claim_one("w")
        assert handle is not None
        assert handle.payload == "a"
        # AUTOINCREMENT remembers the newest id, gone or not.
        assert queue.cancel(queue.enqueue("newest"))
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for table in ("queues", "wakes", "schedules", "maintenance", "workers", "throughput"):
            conn.execute(f"DROP TABLE _alkstore_{table}")
        conn.execute("DROP INDEX _alkstore_dead_queue")
        conn.execute("DROP INDEX _alkstore_jobs_unique")
        conn.execute("DROP TABLE _alkstore_completed")
        for table in ("jobs", "dead"):
            conn.execute(f"ALTER TABLE _alkstore_{table} DROP COLUMN unique_key")
        conn.execute("DELETE FROM sqlite_sequence WHERE name = '_alkstore_wakes'")
        conn.execute("UPDATE _alkstore_meta SET value = 2 WHERE key = 'schema_version'")
        conn.execute("COMMIT")
        assert set(conn.execute("SELECT type, name, sql FROM sqlite_schema")) == v2_objects
    finally:
        conn.close()


def test_version_2_migrates_and_keeps_every_row(db_path: Path, db_url: str) -> None:
    _make_version_2(db_path)
    with sqlite3.connect(db_path) as conn:
        before = {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("_alkstore_jobs", "_alkstore_dead", "sqlite_sequence")
        }
        states = {state for (state,) in conn.execute("SELECT state FROM _alkstore_jobs")}
        (version,) = conn.execute("SELECT value FROM _alkstore_meta").fetchone()
    assert version == 2
    assert states == {"pending", "scheduled", "processing", "lapsed", "expired"}
    assert len(before["_alkstore_dead"]) == 2
    clock = ManualClock(T0 + timedelta(seconds=10))
    with closing(open_store(db_url, clock=clock)) as store:
        rows = _rows(db_path)
        for table, old in before.items():
            if table != "sqlite_sequence":
                # Version 4's unique_key column: NULL on every old row.
                assert {row[-1] for row in rows[table]} == {None}, table
                rows[table] = [row[:-1] for row in rows[table]]
            assert rows[table] == old, table
        with sqlite3.connect(db_path) as conn:
            assert conn.execute("SELECT value FROM _alkstore_meta").fetchone() == (SCHEMA_VERSION,)
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert SCHEMA_VERSION == 5
        assert store.queue_names() == ["graveyard", "q"]
        dead = store.queue("graveyard").dead_jobs()
        assert [j.payload for j in dead] == ["dead one", "dead two"]
        assert store.queue("graveyard").requeue(dead[0].id)
        assert not store.queue("q").is_paused()
        assert store.schedules() == []
        with store._maintenance_turn("sweep", 60) as mine:
            assert mine
        (seq,) = [s for name, s in before["sqlite_sequence"] if name == "_alkstore_jobs"]
        assert store.queue("q").enqueue("after") == seq + 1


def test_several_processes_migrate_a_version_2_file_at_once(db_path: Path, db_url: str) -> None:
    _make_version_2(db_path)
    processes = 4
    barrier = sqlite_children.barrier(processes)
    results = sqlite_children.run_children(
        sqlite_children.open_at_once, [(db_url, barrier)] * processes
    )
    assert results == ["SqliteStore"] * processes
    with closing(open_store(db_url, clock=ManualClock())) as store:
        assert store.queue_names() == ["graveyard", "q"]
        assert store.queue("q").pause()
