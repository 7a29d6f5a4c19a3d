"""What a worker does besides running its tasks: it ticks the scheduler, sweeps
the store in the fleet-wide turn, and runs the app's outbox relays
(docs/schedules.md, docs/operations.md, docs/outbox.md). On SQLite files,
with the store's time from a ManualClock."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import alkstore
from alkstore import App, Sweeper, SweepResult, ValidationError, Worker, WorkerCounts
from alkstore_contract_tests._clock import T0, ManualClock

WAIT_S = 30.0
FAST = {"poll_interval_s": 0.05, "handle_signals": False}


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "chores.db"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def app(path: Path, clock: ManualClock) -> Iterator[App]:
    with App(f"sqlite:///{path}", clock=clock) as made:
        yield made


class Running:
    """A worker's ``run()`` on a thread; stopped and joined on exit."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.counts: WorkerCounts | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker")

    def _run(self) -> None:
        try:
            self.counts = self.worker.run()
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def stop(self) -> WorkerCounts:
        self.worker.stop()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the worker did not stop"
        assert self.error is None, self.error
        assert self.counts is not None
        return self.counts

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self.worker.stop()
            self.thread.join(WAIT_S)


def relay_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("alkstore-relay-")]


# -- the scheduler tick ----------------------------------------------------------


def test_a_worker_ticks_the_scheduler_and_runs_the_fired_job(app: App, clock: ManualClock) -> None:
    calls: list[str] = []

    @app.task(queue="tasks", name="tick", visibility_timeout_s=3600)
    def tick(label: str) -> None:
        calls.append(label)

    saved = app.store.schedule("every-minute", "@every 1m", app.queue("tasks"), tick.payload("t"))
    assert saved.next_run_at == T0 + timedelta(minutes=1)  # strictly after the save
    with Running(app.worker(tick_interval_s=0.05, sweep_interval_s=None, **FAST)) as running:
        clock.advance(60)
        wait_until(lambda: calls, "the fired job to run")
        (schedule,) = app.store.schedules()
        assert schedule.last_run_at == T0 + timedelta(minutes=1)
        assert schedule.next_run_at == T0 + timedelta(minutes=2)
        assert schedule.last_job_id is not None
        wait_until(lambda: running.worker.counts.succeeded == 1, "the ack")
        assert app.queue("tasks").get_job(schedule.last_job_id) is None  # acked
        counts = running.stop()
    assert calls == ["t"]
    assert counts == WorkerCounts(succeeded=1)


def test_the_tick_happens_while_the_only_slot_is_busy(app: App, clock: ManualClock) -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    @app.task(queue="tasks", name="block", visibility_timeout_s=3600)
    def block() -> None:
        started.set()
        assert release.wait(WAIT_S)

    @app.task(queue="tasks", name="tick")
    def tick(label: str) -> None:
        calls.append(label)

    app.store.schedule("every-minute", "@every 1m", app.queue("tasks"), tick.payload("fired"))
    block.enqueue()
    worker = app.worker(concurrency=1, tick_interval_s=0.05, sweep_interval_s=None, **FAST)
    with Running(worker) as running:
        assert started.wait(WAIT_S)
        assert running.worker.running == 1
        clock.advance(60)
        wait_until(lambda: app.store.schedules()[0].last_job_id is not None, "the tick")
        (schedule,) = app.store.schedules()
        assert schedule.last_job_id is not None
        fired = app.queue("tasks").get_job(schedule.last_job_id)
        assert fired is not None
        # Enqueued while the slot was busy, so not claimed yet.
        assert (fired.state, fired.attempts, fired.run_at) == (
            "pending",
            0,
            T0 + timedelta(seconds=60),
        )
        assert fired.payload == {"task": "tick", "args": ["fired"], "kwargs": {}}
        assert calls == []
        release.set()
        wait_until(lambda: running.worker.counts.succeeded == 2, "both jobs")
        counts = running.stop()
    assert calls == ["fired"]
    assert counts == WorkerCounts(succeeded=2)


def test_tick_interval_none_never_ticks(app: App, clock: ManualClock) -> None:
    calls: list[str] = []

    @app.task(queue="tasks", name="tick")
    def tick(label: str) -> None:
        calls.append(label)

    app.store.schedule("every-minute", "@every 1m", "tasks", tick.payload("x"))
    clock.advance(90)  # the boundary T0+1m is due
    # A burst run does its chores before its first claim, so a ticking
    # worker would fire the boundary and run the job before returning.
    counts = app.worker(tick_interval_s=None, sweep_interval_s=None, **FAST).run(burst=True)
    assert counts == WorkerCounts()
    (schedule,) = app.store.schedules()
    assert (schedule.last_job_id, schedule.next_run_at) == (None, T0 + timedelta(minutes=1))
    assert tuple(app.queue("tasks").stats()) == (0, 0, 0, 0)

    counts = app.worker(sweep_interval_s=None, **FAST).run(burst=True)  # ticks by default
    assert counts == WorkerCounts(succeeded=1)
    assert calls == ["x"]
    (schedule,) = app.store.schedules()
    assert schedule.last_run_at == T0 + timedelta(minutes=1)
    assert schedule.next_run_at == T0 + timedelta(minutes=2)


def test_tick_interval_is_validated(app: App) -> None:
    app.task(queue="q")(print)
    for bad in (0, -1, "1"):
        with pytest.raises(ValidationError, match="tick_interval_s"):
            app.worker(tick_interval_s=bad)
    with pytest.raises(ValidationError, match="relays must be a bool"):
        app.worker(relays=1)  # type: ignore[arg-type]


# -- the sweep: one turn for the whole fleet ---------------------------------------


def test_workers_sweep_every_queue_in_one_fleet_wide_turn(path: Path, clock: ManualClock) -> None:
    url = f"sqlite:///{path}"
    with App(url, clock=clock) as first, App(url, clock=clock) as second:
        first.task(queue="a", name="a")(print)
        second.task(queue="b", name="b")(print)
        elsewhere = first.store.queue("elsewhere")  # served by neither worker
        probe = Sweeper(second.store, interval_s=300)

        def burst(app: App) -> WorkerCounts:
            return app.worker(sweep_interval_s=300, tick_interval_s=None, **FAST).run(burst=True)

        one = elsewhere.enqueue("one", expires=10)
        clock.advance(11)
        assert burst(first) == WorkerCounts()
        job = elsewhere.get_job(one)
        assert job is not None
        assert (job.state, job.died_at) == ("dead", T0 + timedelta(seconds=11))

        # 20 s later the turn is not due yet: the other worker does not sweep.
        two = elsewhere.enqueue("two", expires=10)
        clock.advance(20)
        assert burst(second) == WorkerCounts()
        job = elsewhere.get_job(two)
        assert job is not None
        assert job.state == "pending"  # expired, but not swept
        assert probe.run_once() is None
        assert tuple(elsewhere.stats()) == (1, 0, 0, 1)

        # Once the interval has passed, whichever worker comes first sweeps.
        clock.advance(300)
        assert burst(second) == WorkerCounts()
        job = elsewhere.get_job(two)
        assert job is not None
        assert (job.state, job.died_at) == ("dead", T0 + timedelta(seconds=331))
        assert probe.run_once() is None  # the turn was taken
        assert burst(first) == WorkerCounts()
        assert tuple(elsewhere.stats()) == (0, 0, 0, 2)


def test_concurrent_workers_share_the_sweep_turn(path: Path, clock: ManualClock) -> None:
    url = f"sqlite:///{path}"
    with App(url, clock=clock) as first, App(url, clock=clock) as second:
        first.task(queue="a", name="a")(print)
        second.task(queue="b", name="b")(print)
        elsewhere = first.store.queue("elsewhere")
        expiring = elsewhere.enqueue("x", expires=10)
        clock.advance(11)
        options: dict[str, Any] = {"sweep_interval_s": 0.05, "tick_interval_s": None, **FAST}
        with Running(first.worker(**options)) as one, Running(second.worker(**options)) as two:
            wait_until(lambda: elsewhere.stats().dead == 1, "a worker's sweep")
            # Both try every 50 ms, but the store's clock stands still: the
            # turn taken at this instant is not due again, for anyone.
            assert Sweeper(first.store, interval_s=0.05).run_once() is None
            assert one.stop() == WorkerCounts()
            assert two.stop() == WorkerCounts()
        job = elsewhere.get_job(expiring)
        assert job is not None
        assert (job.state, job.died_at) == ("dead", T0 + timedelta(seconds=11))
        # Once the store's time moves past the interval, the turn is due.
        clock.advance(1)
        results = Sweeper(first.store, interval_s=0.05).run_once()
        assert results == {"elsewhere": SweepResult(0, 0)}


def test_a_workers_sweep_applies_its_apps_retention_only(app: App, clock: ManualClock) -> None:
    app.task(queue="kept.briefly", name="t", dead_letter_retention_s=60)(print)
    mine, theirs = app.queue("kept.briefly"), app.store.queue("kept.forever")
    for queue in (mine, theirs):
        queue.enqueue("x")
        (handle,) = queue.claim_batch("w", 1)
        assert handle.fail("dead")
    clock.advance(61)
    assert app.worker(tick_interval_s=None, **FAST).run(burst=True) == WorkerCounts()
    assert tuple(mine.stats()) == (0, 0, 0, 0)  # purged: 60 s retention
    assert tuple(theirs.stats()) == (0, 0, 0, 1)  # not this app's: kept


def test_the_sweep_applies_the_retention_of_every_queue_of_the_app(
    app: App, clock: ManualClock
) -> None:
    """Not only of the queues this worker serves: the turn is fleet-wide, so
    whichever worker takes it must purge what the app declares."""
    app.task(queue="served", name="s")(print)
    app.task(queue="unserved", name="u", dead_letter_retention_s=60)(print)
    app.relay("outbox.x", dead_letter_retention_s=60)(print)
    queues = [app.queue("unserved"), app.outbox("outbox.x").queue]
    for queue in queues:
        queue.enqueue("x")
        (handle,) = queue.claim_batch("w", 1)
        assert handle.fail("dead")
    clock.advance(61)
    worker = app.worker(["served"], tick_interval_s=None, **FAST)
    assert worker.run(burst=True) == WorkerCounts()
    assert [tuple(queue.stats()) for queue in queues] == [(0, 0, 0, 0), (0, 0, 0, 0)]


def test_a_worker_refuses_to_claim_from_an_outbox(app: App) -> None:
    """Its messages are not task calls: claimed as tasks they would all be
    dead-lettered as malformed."""
    app.relay("outbox.x")(print)
    with pytest.raises(ValidationError, match=r"'outbox\.x' is an outbox"):
        app.worker(["outbox.x"])


def test_sweep_interval_none_never_sweeps(app: App, clock: ManualClock) -> None:
    app.task(queue="q", name="t")(print)
    elsewhere = app.store.queue("elsewhere")
    elsewhere.enqueue("x", expires=10)
    clock.advance(11)
    app.worker(sweep_interval_s=None, tick_interval_s=None, **FAST).run(burst=True)
    assert tuple(elsewhere.stats()) == (1, 0, 0, 0)
    # The turn was never taken: a sweeper gets it at once.
    assert Sweeper(app.store).run_once() == {"elsewhere": SweepResult(1, 0)}


# -- relays ----------------------------------------------------------------------


def add_message(path: Path, app: App, queue: str, message: object, *, commit: bool) -> int:
    """``app.outbox(queue).add`` inside an sqlite3 transaction of our own."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        # IMMEDIATE: a deferred transaction that reads before it writes fails
        # at once ("database is locked") if the relay commits in between.
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO orders DEFAULT VALUES")
        message_id = app.outbox(queue).add(conn, message)
        conn.execute("COMMIT" if commit else "ROLLBACK")
    finally:
        conn.close()
    return message_id


@pytest.fixture
def relay_app(path: Path) -> Iterator[App]:
    """An app with no task, only the relay of "outbox.x" (real clock)."""
    with App(f"sqlite:///{path}") as made:
        yield made


def test_a_relay_delivers_committed_messages_and_retries_a_failed_send(
    relay_app: App, path: Path
) -> None:
    app = relay_app
    sent: list[object] = []
    failed_once: list[object] = []

    @app.relay("outbox.x", backoff_base_s=0, max_attempts=3)
    def send(message: Any) -> None:
        if message["flaky"] and message not in failed_once:
            failed_once.append(message)
            raise ConnectionError("broker down")
        sent.append(message)

    assert app.queue_names == []
    _ = app.store  # creates the schema before our own connection writes
    outbox = app.outbox("outbox.x").queue
    rolled_back = add_message(path, app, "outbox.x", {"n": 0, "flaky": False}, commit=False)
    assert outbox.get_job(rolled_back) is None
    assert tuple(outbox.stats()) == (0, 0, 0, 0)
    with Running(app.worker(sweep_interval_s=None, tick_interval_s=None, **FAST)) as running:
        wait_until(lambda: relay_threads() == ["alkstore-relay-outbox.x"], "the relay thread")
        first = add_message(path, app, "outbox.x", {"n": 1, "flaky": False}, commit=True)
        second = add_message(path, app, "outbox.x", {"n": 2, "flaky": True}, commit=True)
        wait_until(lambda: len(sent) == 2, "both messages")
        wait_until(lambda: tuple(outbox.stats()) == (0, 0, 0, 0), "the acks")
        counts = running.stop()
    assert relay_threads() == []  # the relay stopped with the worker
    assert counts == WorkerCounts(relayed=2)  # messages are not task jobs
    assert sent == [{"n": 1, "flaky": False}, {"n": 2, "flaky": True}]  # never n=0
    assert failed_once == [{"n": 2, "flaky": True}]
    assert (outbox.get_job(first), outbox.get_job(second)) == (None, None)
    assert outbox.dead_jobs() == []


def test_a_message_that_keeps_failing_is_a_dead_letter(relay_app: App, path: Path) -> None:
    app = relay_app
    attempts: list[object] = []

    @app.relay("outbox.x", backoff_base_s=0, max_attempts=2)
    def send(message: Any) -> None:
        attempts.append(message)
        raise ConnectionError(f"refused {message}")

    _ = app.store
    message_id = add_message(path, app, "outbox.x", "m", commit=True)
    outbox = app.outbox("outbox.x").queue
    with Running(app.worker(sweep_interval_s=None, tick_interval_s=None, **FAST)) as running:
        wait_until(lambda: outbox.stats().dead == 1, "the dead letter")
        running.stop()
    assert attempts == ["m", "m"]
    (dead,) = outbox.dead_jobs()
    assert (dead.id, dead.attempts, dead.max_attempts) == (message_id, 2, 2)
    # The budget spent, the dead letter keeps the error that spent it.
    assert dead.last_error is not None
    assert dead.last_error.startswith(
        "max attempts exceeded; last error: ConnectionError: refused m\n\nTraceback"
    )


def test_relays_false_runs_no_relay(app: App, path: Path) -> None:
    sent: list[object] = []
    ran: list[int] = []
    app.relay("outbox.x")(sent.append)

    @app.task(queue="tasks", name="t")
    def task(n: int) -> None:
        ran.append(n)

    _ = app.store
    message_id = add_message(path, app, "outbox.x", "m", commit=True)
    worker = app.worker(relays=False, sweep_interval_s=None, tick_interval_s=None, **FAST)
    with Running(worker) as running:
        task.enqueue(1)
        wait_until(lambda: ran == [1], "the task")  # the run is well under way
        assert relay_threads() == []
        running.stop()
    assert sent == []
    outbox = app.outbox("outbox.x").queue
    message = outbox.get_job(message_id)
    assert message is not None
    assert (message.state, message.attempts) == ("pending", 0)
    # Without its relay and tasks, such a worker would have nothing to do.
    only_relay = App(f"sqlite:///{path}")
    only_relay.relay("outbox.y")(print)
    with pytest.raises(ValidationError, match="no queue to work"):
        only_relay.worker(relays=False)


def test_an_app_with_only_a_relay_runs_a_worker(
    relay_app: App, path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = relay_app
    sent: list[object] = []
    app.relay("outbox.x")(sent.append)
    worker = app.worker(sweep_interval_s=None, tick_interval_s=None, **FAST)
    assert worker.queues == []
    _ = app.store
    with caplog.at_level(logging.INFO, logger="alkstore.worker"), Running(worker) as running:
        add_message(path, app, "outbox.x", {"hello": "world"}, commit=True)
        wait_until(lambda: sent == [{"hello": "world"}], "the message")
        assert running.stop() == WorkerCounts(relayed=1)
    # The stop summary counts what the relays delivered (issue 11).
    assert (
        f"worker {worker.worker_id} stopped: 0 succeeded, 0 retried, 0 dead, 0 lost, "
        "0 cancelled; relays delivered 1 message(s)"
    ) in caplog.text
    assert relay_threads() == []
    # A burst run has no relays and no queues: it returns at once.
    assert app.worker(**FAST).run(burst=True) == WorkerCounts()


def test_outbox_relay_once_uses_the_apps_relay_options(relay_app: App, path: Path) -> None:
    app = relay_app
    app.relay("outbox.x", max_attempts=7, visibility_timeout_s=90)(print)
    assert app.queue_opts("outbox.x") == alkstore.QueueOpts(max_attempts=7, visibility_timeout_s=90)
    _ = app.store
    message_id = add_message(path, app, "outbox.x", "m", commit=True)
    message = app.outbox("outbox.x").queue.get_job(message_id)
    assert message is not None
    assert (message.max_attempts, message.visibility_timeout_s) == (7, 90)
    delivered: list[object] = []
    assert app.outbox("outbox.x").relay_once(delivered.append, worker_id="r") == 1
    assert delivered == ["m"]


def test_the_first_signal_stops_the_relays_at_once(app: App, path: Path) -> None:
    """Like claiming, relaying stops with the first SIGTERM, not at the end
    of the grace period: a relay still claiming messages then would have its
    batch cut short when the process is killed, and send it twice."""
    release = threading.Event()
    sent: list[object] = []
    app.relay("outbox.x")(sent.append)

    @app.task(queue="tasks", name="slow")
    def slow() -> None:
        assert release.wait(WAIT_S)

    slow.enqueue()
    worker = app.worker(
        grace_period_s=WAIT_S,
        poll_interval_s=0.05,
        sweep_interval_s=None,
        tick_interval_s=None,
    )
    seen_while_draining: list[object] = []

    def signal_then_watch() -> None:
        try:
            wait_until(lambda: worker.running == 1, "the job to start")
            wait_until(lambda: relay_threads() == ["alkstore-relay-outbox.x"], "the relay")
            os.kill(os.getpid(), signal.SIGTERM)
            wait_until(lambda: relay_threads() == [], "the relay to stop")
            seen_while_draining.append(worker.running)
        finally:
            release.set()

    watcher = threading.Thread(target=signal_then_watch)
    watcher.start()
    counts = worker.run()  # in the main thread, so it handles SIGTERM
    watcher.join()
    assert seen_while_draining == [1]  # the relay stopped while the job still ran
    assert counts == WorkerCounts(succeeded=1)
