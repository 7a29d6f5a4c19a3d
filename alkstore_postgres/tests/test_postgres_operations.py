"""The operator's primitives on PostgreSQL (docs/operations.md,
docs/schedules.md): pause and resume, dead-letter pages, requeue and purge,
the queue listing, schedules and their exactly-once firing, maintenance
turns, and the version 3 migration."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import postgres_children
import psycopg
import pytest
from psycopg import sql
from test_postgres_claims import in_threads
from test_postgres_schema import (
    _FILL,
    _FILL_DEAD,
    fill,
    fill_state,
    make_version,
    nodes,
    version,
)

from alkstore import Job, Queue, QueueOpts, Scheduler
from alkstore_contract_tests import T0, ManualClock
from alkstore_postgres import SCHEMA_VERSION, PostgresStore
from alkstore_postgres._maintenance import advisory_key
from alkstore_postgres._operations import QUEUE_NAMES, dead_jobs_query
from alkstore_postgres._queue import LAPSED_CLAIMS
from alkstore_postgres._schema import (
    _MIGRATIONS,
    render,
)

pytestmark = pytest.mark.postgres


def state_of(admin: psycopg.Connection[Any], schema: str, job_id: int) -> str | None:
    """The engine-private state of a live row (``None`` if not live)."""
    row = admin.execute(
        render(sql.SQL("SELECT state FROM {jobs} WHERE id = %s"), schema), [job_id]
    ).fetchone()
    return None if row is None else str(row[0])


def kill(queue: Queue, job_id: int) -> Job:
    """Claim ``job_id`` (the only due job) and fail it to the dead table."""
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.id == job_id
    assert handle.fail("boom")
    job = queue.get_job(job_id)
    assert job is not None
    assert job.state == "dead"
    return job


# -- pause -------------------------------------------------------------------


def test_pause_is_durable_and_reported(
    store: PostgresStore, open_pg: Callable[..., PostgresStore]
) -> None:
    q = store.queue("p")
    assert not q.is_paused()
    assert q.pause()
    assert not q.pause()  # already paused
    assert q.is_paused()
    assert open_pg().queue("p").is_paused()  # another store sees it
    assert not store.queue("other").is_paused()
    assert q.resume()
    assert not q.resume()
    assert not q.is_paused()


def test_a_paused_claim_returns_nothing_and_writes_nothing(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str, clock: ManualClock
) -> None:
    q = store.queue("p", QueueOpts(visibility_timeout_s=10))
    exhausted = q.enqueue("last try", max_attempts=1, priority=3)
    lapsed = q.enqueue("retry me", priority=2)
    assert [h.id for h in q.claim_batch("w", 2)] == [exhausted, lapsed]
    q.enqueue("due", priority=1)
    scheduled = q.enqueue("later", delay=5)
    clock.advance(20)  # both claims lapsed; the scheduled row came due
    before = admin.execute(render(sql.SQL("SELECT * FROM {jobs} ORDER BY id"), schema)).fetchall()

    assert q.pause()
    assert q.claim_batch("w", 10) == []
    assert q.claim_one("w") is None
    # Nothing moved: no dead-lettering of the exhausted claim, no reclaim,
    # no promotion of the scheduled row, no claim.
    after = admin.execute(render(sql.SQL("SELECT * FROM {jobs} ORDER BY id"), schema)).fetchall()
    assert after == before
    assert state_of(admin, schema, scheduled) == "scheduled"
    assert q.dead_jobs() == []
    assert q.stats() == (2, 0, 2, 0)
    q.enqueue("enqueues still land")
    other = store.queue("not-paused")
    other.enqueue(1)
    assert other.claim_one("w") is not None  # only this queue is paused

    assert q.resume()
    handles = q.claim_batch("w", 10)
    assert [h.payload for h in handles] == ["retry me", "due", "later", "enqueues still land"]
    assert [j.id for j in q.dead_jobs()] == [exhausted]


@contextlib.contextmanager
def waiting_child(postgres_url: str, schema: str, queue: str) -> Iterator[tuple[Any, list[Any]]]:
    """A child process that meets the test at a barrier twice, then waits
    up to a day for a wake on ``queue`` (postgres_children's
    wake_after_barrier); yields the barrier and the list its result lands
    in, complete once the block has ended."""
    barrier = postgres_children.barrier(2)
    results: list[Any] = []
    child = threading.Thread(
        target=lambda: results.extend(
            postgres_children.run_children(
                postgres_children.wake_after_barrier,
                [(postgres_url, schema, queue, T0 + timedelta(days=1), barrier)],
            )
        )
    )
    child.start()
    try:
        yield barrier, results
    finally:
        child.join(postgres_children.CHILD_TIMEOUT_S)


@pytest.mark.slow
def test_resume_wakes_a_subscriber_in_another_process(
    postgres_url: str, store: PostgresStore, schema: str
) -> None:
    q = store.queue("p")
    assert q.pause()
    q.enqueue("after resume")
    with waiting_child(postgres_url, schema, "p") as (barrier, results):
        barrier.wait(postgres_children.CHILD_TIMEOUT_S)
        assert not q.pause()  # no change, no wake
        barrier.wait(postgres_children.CHILD_TIMEOUT_S)
        assert q.resume()
    assert results == [(False, "after resume")]


# -- dead letters ------------------------------------------------------------


def test_dead_jobs_are_paged_by_id(store: PostgresStore) -> None:
    q, other = store.queue("d"), store.queue("other")
    ids = q.enqueue_many(list(range(7)))
    kill(other, other.enqueue("x"))  # another queue's dead job, not listed
    for handle in q.claim_batch("w", 7):
        assert handle.fail("boom")
    pages, after = [], None
    while page := q.dead_jobs(limit=3, after_id=after):
        pages.append([j.id for j in page])
        after = page[-1].id
    assert pages == [ids[:3], ids[3:6], ids[6:]]
    assert all(j.state == "dead" and j.last_error == "boom" for j in q.dead_jobs())
    assert q.dead_jobs(after_id=2**63 - 1) == []
    assert q.dead_jobs(after_id=0) == q.dead_jobs()


def test_requeue_moves_a_dead_job_back(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str, clock: ManualClock
) -> None:
    q = store.queue("r", QueueOpts(visibility_timeout_s=7, backoff_base_s=2, backoff_cap_s=9))
    job_id = q.enqueue({"k": 1}, priority=4, max_attempts=3, expires=100)
    dead = kill(q, job_id)
    clock.advance(1000)  # long expired: the window starts again
    sub = store.listen("r")
    assert q.requeue(job_id, delay=timedelta(seconds=30))
    assert sub.wait(5)
    live = q.get_job(job_id)
    assert live is not None
    run_at = T0 + timedelta(seconds=1030)
    assert live == dataclasses.replace(
        dead,
        state="pending",
        run_at=run_at,
        expires_at=run_at + timedelta(seconds=100),
        max_attempts=dead.attempts + dead.max_attempts,  # attempts kept, budget renewed
        worker_id=None,
        claim_deadline=None,
        died_at=None,
    )
    assert live.last_error == "boom"
    assert state_of(admin, schema, job_id) == "scheduled"  # out of the claim's path
    assert q.dead_jobs() == []
    assert not q.requeue(job_id)  # live now
    assert not store.queue("elsewhere").requeue(job_id)
    assert not q.requeue(10**9)
    assert not q.requeue(2**63)  # beyond bigint: unknown
    assert q.claim_one("w") is None
    clock.advance(30)
    handle = q.claim_one("w")
    assert handle is not None
    assert (handle.id, handle.attempts, handle.payload) == (job_id, dead.attempts + 1, {"k": 1})


def test_requeue_now_is_pending_and_keeps_no_expiry(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str
) -> None:
    q = store.queue("r")
    job_id = q.enqueue(1)
    kill(q, job_id)
    assert q.requeue(job_id)
    assert state_of(admin, schema, job_id) == "pending"
    job = q.get_job(job_id)
    assert job is not None
    assert job.expires_at is None
    assert q.stats() == (1, 0, 0, 0)


def test_the_expiry_window_is_exact_across_dst(
    postgres_url: str, open_pg: Callable[..., PostgresStore], clock: ManualClock
) -> None:
    # An interval with days would be added in the session's time zone: two
    # days after 2030-03-30 12:00 UTC in Europe/Berlin are 47 hours later.
    store = open_pg(f"{postgres_url}?options=-c%20TimeZone%3DEurope/Berlin")
    q = store.queue("r")
    job_id = q.enqueue(1, expires=timedelta(days=2, microseconds=7))
    kill(q, job_id)
    clock.set(T0.replace(month=3, day=30, hour=12))
    assert q.requeue(job_id)
    job = q.get_job(job_id)
    assert job is not None
    assert job.expires_at is not None
    assert job.expires_at - job.run_at == timedelta(days=2, microseconds=7)


def test_one_of_many_concurrent_requeues_wins(open_pg: Callable[..., PostgresStore]) -> None:
    stores = [open_pg(pool_max_size=1) for _ in range(6)]
    q = stores[0].queue("race")
    for _ in range(20):
        job_id = q.enqueue("x")
        kill(q, job_id)
        barrier = threading.Barrier(6)

        def requeue(i: int, job_id: int = job_id, barrier: threading.Barrier = barrier) -> bool:
            barrier.wait()
            return stores[i].queue("race").requeue(job_id)

        assert sorted(in_threads(6, requeue)) == [False] * 5 + [True]
        handle = q.claim_one("w")
        assert handle is not None
        assert handle.id == job_id
        assert handle.ack()
    assert q.stats() == (0, 0, 0, 0)


@pytest.mark.slow
def test_requeue_wakes_a_subscriber_in_another_process(
    postgres_url: str, store: PostgresStore, schema: str
) -> None:
    q = store.queue("r")
    job_id = q.enqueue("requeued")
    kill(q, job_id)
    with waiting_child(postgres_url, schema, "r") as (barrier, results):
        barrier.wait(postgres_children.CHILD_TIMEOUT_S)
        assert q.purge_dead(timedelta(days=1)) == 0  # not old enough: nothing, no wake
        barrier.wait(postgres_children.CHILD_TIMEOUT_S)
        assert q.requeue(job_id)
    assert results == [(False, "requeued")]


def test_purge_dead_by_age(store: PostgresStore, clock: ManualClock) -> None:
    q, other = store.queue("d"), store.queue("other")
    old = q.enqueue("old")
    kill(q, old)
    clock.advance(100)
    young = q.enqueue("young")
    kill(q, young)
    kill(other, other.enqueue("other"))
    clock.advance(50)
    assert q.purge_dead(151) == 0
    assert q.purge_dead(timedelta(seconds=150)) == 1  # died_at + 150 <= now
    assert [j.id for j in q.dead_jobs()] == [young]
    assert q.purge_dead() == 1
    assert q.dead_jobs() == []
    assert len(other.dead_jobs()) == 1


# -- the queue listing -------------------------------------------------------


def test_queue_names(store: PostgresStore, clock: ManualClock) -> None:
    assert store.queue_names() == []
    store.queue("pending").enqueue(1)
    store.queue("scheduled").enqueue(1, delay=60)
    processing = store.queue("processing")
    processing.enqueue(1)
    assert processing.claim_one("w") is not None
    dead = store.queue("dead")
    kill(dead, dead.enqueue(1))
    store.queue("paused").pause()
    resumed = store.queue("resumed")
    resumed.pause()
    resumed.resume()
    for name in ("Zed", "a_b", "a.b", "a-b"):  # sorted by code point
        store.queue(name).enqueue(1)
    assert store.queue_names() == [
        "Zed",
        "a-b",
        "a.b",
        "a_b",
        "dead",
        "paused",
        "pending",
        "processing",
        "scheduled",
    ]


def _explain(admin: psycopg.Connection[Any], query: bytes, params: dict[str, Any]) -> Any:
    row = admin.execute(b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()
    assert row is not None
    return row[0][0]


def _blocks(plan: Any) -> int:
    # A node's buffers include its children's.
    top = plan["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


@pytest.fixture
def big_store(store: PostgresStore, admin: psycopg.Connection[Any], schema: str) -> PostgresStore:
    """Three queues with 60 000 live rows in every private state and
    30 000 dead, and a queue ``rare`` with 3 dead rows above all of them."""
    early, late = T0 - timedelta(days=1), T0 + timedelta(days=1)
    for queue in ("a", "b", "c"):
        fill(admin, schema, _FILL, queue=queue, priority=0, run_at=early, rows=10_000)
        fill_state(
            admin, schema, state="scheduled", queue=queue, priority=0, run_at=late, rows=5_000
        )
        fill_state(
            admin,
            schema,
            state="processing",
            deadline=late,
            queue=queue,
            priority=0,
            run_at=early,
            rows=5_000,
        )
        # Ids -9 700 001 and below for "a", -9 800 001 for "b", ...
        dead_ids = _FILL_DEAD.replace("-g", f"-g - {ord(queue)} * 100000")
        fill(admin, schema, dead_ids, queue=queue, run_at=early, rows=10_000)
    fill(admin, schema, _FILL_DEAD.replace("-g", "g"), queue="rare", run_at=early, rows=3)
    admin.execute(render(sql.SQL("VACUUM ANALYZE {jobs}"), schema))
    admin.execute(render(sql.SQL("VACUUM ANALYZE {dead}"), schema))
    return store


@pytest.mark.slow
def test_queue_names_is_a_loose_index_scan(
    big_store: PostgresStore, admin: psycopg.Connection[Any], schema: str
) -> None:
    big_store.queue("d").pause()
    assert big_store.queue_names() == ["a", "b", "c", "d", "rare"]
    plan = _explain(admin, render(QUEUE_NAMES, schema), {})
    text = json.dumps(plan)
    seq = {n["Relation Name"] for n in nodes(plan["Plan"]) if n["Node Type"] == "Seq Scan"}
    assert seq <= {"queues"}, text  # the pause table is a page
    scans = {n.get("Index Name") for n in nodes(plan["Plan"]) if "Index Name" in n}
    assert {"jobs_pending", "jobs_scheduled", "jobs_processing", "jobs_lapsed"} <= scans, text
    assert "jobs_expiry" in scans, text  # every 'expired' row has an expires_at
    assert scans & {"dead_queue", "dead_died"}, text  # either leads with queue
    # 90 000 rows: an index descent per queue name and state, not a scan.
    assert _blocks(plan) < 100, _blocks(plan)


@pytest.mark.slow
def test_dead_jobs_is_an_index_range(
    big_store: PostgresStore, admin: psycopg.Connection[Any], schema: str
) -> None:
    page = big_store.queue("b").dead_jobs(limit=5)
    assert [j.id for j in page] == list(range(-9_810_000, -9_809_995))
    assert [j.id for j in big_store.queue("rare").dead_jobs()] == [1, 2, 3]
    # The first page of a queue with few dead rows, above another's many,
    # and a page in the middle of a big one, planned as the pool plans (the
    # generic plan forced, D25): the values are in the text, so the plan is
    # made for them.
    admin.execute("SET plan_cache_mode = force_generic_plan")
    try:
        for queue, lower in (("rare", -(2**63)), ("b", -(2**63)), ("b", -9_805_000)):
            plan = _explain(admin, dead_jobs_query(schema, queue, lower, 100), {})
            text = json.dumps(plan)
            kinds = {n["Node Type"] for n in nodes(plan["Plan"])}
            assert not kinds & {"Sort", "Seq Scan"}, text
            assert _blocks(plan) < 20, text
    finally:
        admin.execute("RESET plan_cache_mode")


@pytest.mark.slow
def test_lapsed_claims_passes_over_live_claims_by_their_deadline(
    big_store: PostgresStore, admin: psycopg.Connection[Any], schema: str
) -> None:
    """5 000 live claims of queue "a" (deadline tomorrow) and 10 000 more in
    "b" and "c": counting the lapsed ones reads index ranges, never them."""
    early = T0 - timedelta(days=1)
    for state, rows in (("processing", 3), ("lapsed", 2)):
        fill_state(
            admin,
            schema,
            state=state,
            deadline=early,
            queue="a",
            priority=0,
            run_at=early,
            rows=rows,
        )
    admin.execute(render(sql.SQL("ANALYZE {jobs}"), schema))
    assert big_store.queue("a").lapsed_claims() == 5
    assert big_store.queue("a").stats().processing == 5_005
    assert big_store.queue("rare").lapsed_claims() == 0
    admin.execute("SET plan_cache_mode = force_generic_plan")  # as the pool plans (D25)
    try:
        plan = _explain(admin, render(LAPSED_CLAIMS, schema), {"queue": "a", "now": T0})
    finally:
        admin.execute("RESET plan_cache_mode")
    text = json.dumps(plan)
    assert "Seq Scan" not in {n["Node Type"] for n in nodes(plan["Plan"])}, text
    scans = {n.get("Index Name") for n in nodes(plan["Plan"]) if "Index Name" in n}
    assert {"jobs_processing", "jobs_lapsed", "jobs_expiry"} <= scans, text
    assert _blocks(plan) < 30, text


# -- schedules ---------------------------------------------------------------


def test_schedules_are_stored_and_replaced(store: PostgresStore, clock: ManualClock) -> None:
    q = store.queue("s", QueueOpts(visibility_timeout_s=5))
    first = store.schedule("b-job", "@every 30s", q, {"n": 1}, priority=7, expires=60)
    assert first.revision == 1
    assert first.next_run_at == T0 + timedelta(seconds=30)
    assert first.created_at == T0
    assert (first.priority, first.expires_s, first.max_attempts) == (7, 60.0, None)
    assert first.queue_opts == QueueOpts(visibility_timeout_s=5)
    store.schedule("A-job", "0 * * * *", "s", b"raw", catch_up="skip")
    assert [s.name for s in store.schedules()] == ["A-job", "b-job"]
    clock.advance(31)
    assert len(Scheduler(store).tick()) == 1
    fired = {s.name: s for s in store.schedules()}["b-job"]
    assert fired.last_run_at == T0 + timedelta(seconds=30)
    assert fired.last_job_id is not None
    assert fired.revision == 1
    replaced = store.schedule("b-job", "@every 1m", "t", [2])
    assert replaced.revision == 2
    assert (replaced.last_run_at, replaced.last_job_id) == (None, None)
    assert (replaced.queue, replaced.payload, replaced.priority) == ("t", [2], None)
    assert replaced.created_at == T0 + timedelta(seconds=31)
    assert store.schedules()[1] == replaced
    assert store.unschedule("b-job")
    assert not store.unschedule("b-job")
    assert [s.name for s in store.schedules()] == ["A-job"]


def test_due_schedules_come_in_next_run_order(store: PostgresStore, clock: ManualClock) -> None:
    store.schedule("hourly", "@hourly", "s", 1)
    store.schedule("b", "@every 10s", "s", 1)
    store.schedule("a", "@every 10s", "s", 1)
    assert store._list_schedules(T0) == []
    due = store._list_schedules(T0 + timedelta(seconds=10))
    assert [s.name for s in due] == ["a", "b"]
    due = store._list_schedules(T0 + timedelta(hours=1))
    assert [s.name for s in due] == ["a", "b", "hourly"]


def test_the_guard_refuses_a_stale_snapshot(store: PostgresStore, clock: ManualClock) -> None:
    schedule = store.schedule("s", "@every 10s", "q", 1)
    later = T0 + timedelta(seconds=20)
    assert store._skip_schedule(schedule, later)
    assert not store._skip_schedule(schedule, later)  # next_run_at moved
    (moved,) = store.schedules()
    assert moved.next_run_at == later
    assert moved.last_run_at is None
    assert store.schedule("s", "@every 10s", "q", 1) == moved  # the same definition: kept
    replaced = store.schedule("s", "@every 10s", "q", 2)
    assert not store._skip_schedule(moved, later + timedelta(seconds=10))  # revision moved
    assert store._skip_schedule(replaced, later)


def test_a_fired_job_wakes_and_is_as_enqueued(store: PostgresStore, clock: ManualClock) -> None:
    q = store.queue("s", QueueOpts(max_attempts=2))
    store.schedule("s", "@every 10s", q, {"p": 1}, priority=5)
    sub = store.listen("s")
    clock.advance(15)
    (job_id,) = Scheduler(store).tick()
    assert sub.wait(5)
    job = q.get_job(job_id)
    assert job is not None
    assert (job.state, job.payload, job.priority, job.max_attempts) == ("pending", {"p": 1}, 5, 2)
    assert job.run_at == T0 + timedelta(seconds=10)
    assert Scheduler(store).tick() == []


@pytest.mark.slow
def test_one_of_many_processes_fires_each_boundary(
    postgres_url: str, store: PostgresStore, schema: str, clock: ManualClock
) -> None:
    store.schedule("every", "@every 30s", "fired", "payload")
    processes, rounds = 4, 15
    barrier = postgres_children.barrier(processes)
    results = postgres_children.run_children(
        postgres_children.fire_rounds,
        [(postgres_url, schema, "every", rounds, barrier)] * processes,
    )
    ids = []
    for r in range(rounds):
        fired = [result[r] for result in results if result[r] is not None]
        assert len(fired) == 1, (r, [result[r] for result in results])
        ids.extend(fired)
    q = store.queue("fired")
    assert q.stats() == (0, rounds, 0, 0)  # each due at its boundary
    clock.set(T0 + timedelta(seconds=30 * rounds))
    assert q.stats() == (rounds, 0, 0, 0)
    assert [h.id for h in q.claim_batch("w", 100)] == ids
    (schedule,) = store.schedules()
    assert schedule.last_job_id == ids[-1]
    assert schedule.last_run_at == T0 + timedelta(seconds=30 * rounds)
    assert schedule.next_run_at == T0 + timedelta(seconds=30 * (rounds + 1))


#: Seconds a tick may take beside a held schedule row before the test calls
#: it stuck (it takes milliseconds when it passes the row over).
TICK_WAIT_S = 30.0


def test_a_tick_passes_over_a_schedule_row_another_session_holds(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str, clock: ManualClock
) -> None:
    """A session that locked one schedule's row and went quiet (a ticker
    stopped mid-fire, an operator's open transaction) must not stall the
    tick at that row: the others fire, and the held one fires its latest
    boundary on the first tick after the lock is gone."""
    store.schedule("held", "@every 10s", "q", "held")
    store.schedule("free", "@every 10s", "q", "free")
    q = store.queue("q")
    clock.set(T0 + timedelta(seconds=10))
    ticked: list[list[int]] = []
    done = threading.Event()

    def tick() -> None:
        ticked.append(Scheduler(store).tick())
        done.set()

    with admin.transaction():
        admin.execute(
            sql.SQL("SELECT 1 FROM {} WHERE name = 'held' FOR UPDATE").format(
                sql.Identifier(schema, "schedules")
            )
        )
        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        finished = done.wait(TICK_WAIT_S)
    ticker.join(TICK_WAIT_S)  # the lock is gone: a stuck tick ends now
    assert finished, "the tick waited for the held schedule row"
    (fired,) = ticked
    assert [job.payload for job in map(q.get_job, fired) if job is not None] == ["free"]
    held = {s.name: s for s in store.schedules()}["held"]
    assert (held.next_run_at, held.last_job_id) == (T0 + timedelta(seconds=10), None)
    clock.set(T0 + timedelta(seconds=25))
    jobs = [q.get_job(i) for i in Scheduler(store).tick()]
    assert sorted((j.payload, j.run_at) for j in jobs if j is not None) == [
        ("free", T0 + timedelta(seconds=20)),
        ("held", T0 + timedelta(seconds=20)),
    ]


# -- maintenance turns ------------------------------------------------------


def test_a_turn_is_exclusive_and_honours_the_interval(
    store: PostgresStore, open_pg: Callable[..., PostgresStore], clock: ManualClock
) -> None:
    other = open_pg()
    with store._maintenance_turn("sweep", 60) as mine:
        assert mine
        with other._maintenance_turn("sweep", 60) as theirs:
            assert not theirs  # held (and not due)
        with store._maintenance_turn("other task", 60) as unrelated:
            assert unrelated
    with other._maintenance_turn("sweep", 60) as theirs:
        assert not theirs  # taken 0 s ago
    clock.advance(59.999)
    with other._maintenance_turn("sweep", 60) as theirs:
        assert not theirs
    clock.advance(0.001)
    with other._maintenance_turn("sweep", 60) as theirs:
        assert theirs


def held_advisory_locks(admin: psycopg.Connection[Any], key: int) -> int:
    unsigned = key % 2**64
    row = admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND classid = %s AND objid = %s AND objsubid = 1",
        [unsigned >> 32, unsigned & 0xFFFFFFFF],
    ).fetchone()
    assert row is not None
    count: int = row[0]
    return count


def turn_that_fails(
    store: PostgresStore, admin: psycopg.Connection[Any], elsewhere: PostgresStore
) -> None:
    """Take the ``sweep`` turn, check what it holds, and fail inside it."""
    key = advisory_key(store.schema, "sweep")
    with store._maintenance_turn("sweep", 1) as mine:
        assert mine
        assert held_advisory_locks(admin, key) == 1
        with elsewhere._maintenance_turn("sweep", 1) as theirs:
            assert theirs  # another schema: another lock
            # The pool's one connection is free for the block's work.
            assert elsewhere.queue_names() == []
        raise RuntimeError("the block failed")


def test_a_turn_holds_its_lock_and_releases_it_on_error(
    open_pg: Callable[..., PostgresStore],
    admin: psycopg.Connection[Any],
    clock: ManualClock,
    other_schema: str,
) -> None:
    store = open_pg()
    key = advisory_key(store.schema, "sweep")
    assert key != advisory_key(other_schema, "sweep")
    assert key != advisory_key(store.schema, "other")
    elsewhere = open_pg(schema=other_schema, pool_max_size=1)
    with pytest.raises(RuntimeError, match="the block failed"):
        turn_that_fails(store, admin, elsewhere)
    assert held_advisory_locks(admin, key) == 0
    clock.advance(1)
    with store._maintenance_turn("sweep", 1) as mine:
        assert mine


@pytest.fixture
def other_schema(postgres_url: str) -> Iterator[str]:
    from postgres_server import drop_schema, fresh_schema_name

    name = fresh_schema_name()
    yield name
    drop_schema(postgres_url, name)


@pytest.mark.slow
def test_turns_are_exclusive_across_processes(
    postgres_url: str, store: PostgresStore, schema: str
) -> None:
    processes = 4
    barrier = postgres_children.barrier(processes)
    results = postgres_children.run_children(
        postgres_children.maintenance_phases,
        [(postgres_url, schema, i, barrier) for i in range(processes)],
    )
    taken = [sum(result[phase] for result in results) for phase in range(4)]
    # One taker while the lock is held; one per interval; none before.
    assert taken == [1, 1, 0, 1], results


# -- the version 3 migration -------------------------------------------------


def test_version_2_is_migrated(
    open_pg: Callable[..., PostgresStore],
    admin: psycopg.Connection[Any],
    schema: str,
    clock: ManualClock,
) -> None:
    make_version(admin, schema, 2)
    # Rows as older code wrote them: future ones as 'pending' (version 1
    # code, still running against version 2), a scheduled one, a claim, a
    # due one and a dead one.
    fill(admin, schema, _FILL, queue="old", priority=9, run_at=T0 + timedelta(seconds=60), rows=2)
    fill(admin, schema, _FILL, queue="old", priority=0, run_at=T0 - timedelta(seconds=1), rows=1)
    fill_state(
        admin,
        schema,
        state="scheduled",
        queue="old",
        priority=0,
        run_at=T0 + timedelta(seconds=60),
        rows=1,
    )
    fill_state(
        admin,
        schema,
        state="processing",
        deadline=T0 + timedelta(seconds=30),
        queue="old",
        priority=0,
        run_at=T0 - timedelta(seconds=1),
        rows=1,
    )
    fill(admin, schema, _FILL_DEAD, queue="old", run_at=T0, rows=2)
    select_all = render(sql.SQL("SELECT * FROM {jobs} ORDER BY id"), schema)
    select_dead = render(sql.SQL("SELECT * FROM {dead} ORDER BY id"), schema)
    jobs_before = admin.execute(select_all).fetchall()
    dead_before = admin.execute(select_dead).fetchall()

    store = open_pg()
    assert version(admin, schema) == SCHEMA_VERSION
    jobs_after = admin.execute(select_all).fetchall()
    # Version 6 added unique_key, NULL on every old row.
    assert admin.execute(select_dead).fetchall() == [(*row, None) for row in dead_before]
    # Every row kept; only the future 'pending' ones changed state.
    assert len(jobs_after) == len(jobs_before) == 5
    state = 2
    for before, after in zip(jobs_before, jobs_after, strict=True):
        moved = before[state] == "pending" and before[6] > T0
        assert after == (
            *before[:state],
            "scheduled" if moved else before[state],
            *before[3:],
            None,
        )
    assert [row[state] for row in jobs_after] == [
        "scheduled",
        "scheduled",
        "pending",
        "scheduled",
        "processing",
    ]
    # The move is idempotent: running it again changes nothing.
    leftover = next(s for s in _MIGRATIONS[2] if "SET state = 'scheduled'" in s.as_string())
    assert admin.execute(render(leftover, schema), {"now": T0}).rowcount == 0
    store.migrate()
    assert admin.execute(select_all).fetchall() == jobs_after

    q = store.queue("old")
    assert q.stats() == (1, 3, 1, 2)
    assert store.queue_names() == ["old"]
    handle = q.claim_one("w")
    assert handle is not None
    assert handle.id == jobs_before[2][0]
    assert handle.ack()
    clock.advance(61)
    assert [h.priority for h in q.claim_batch("w", 10)] == [9, 9, 0, 0]


def test_version_2_rows_are_judged_by_the_server_clock_without_one(
    open_pg: Callable[..., PostgresStore], admin: psycopg.Connection[Any], schema: str
) -> None:
    make_version(admin, schema, 2)
    row = admin.execute("SELECT now()").fetchone()
    assert row is not None
    now = row[0]
    fill(admin, schema, _FILL, queue="q", priority=0, run_at=now + timedelta(hours=1), rows=1)
    fill(admin, schema, _FILL, queue="q", priority=0, run_at=now - timedelta(hours=1), rows=1)
    open_pg(clock=None)
    states = admin.execute(render(sql.SQL("SELECT state FROM {jobs} ORDER BY id"), schema))
    assert [s for (s,) in states.fetchall()] == ["scheduled", "pending"]
