"""The worker runtime against a real engine: :class:`WorkerTests`.

The worker (``alkstore.Worker``) is built on the public contract only, so
these tests belong with the contract: every engine runs them, with real
threads and real processes (docs/tasks-and-workers.md).

- Outcomes, options, ordering, burst, sweeping and stopping run in this
  process with a :class:`ManualClock`: time moves only when a test says so.
- Heartbeats, SIGKILL and SIGTERM need claims to lapse in real time in a real
  child process, so those tests use the engine's own clock, a visibility
  timeout of one second, and bounded waits of seconds.

Child processes are started with ``"spawn"`` and open the target with
:func:`alkstore.open` (harness capability ``spawned_processes_can_open``;
the tests skip without it).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest

from alkstore import App, Fail, JobContext, Retry, Store, ValidationError, Worker, WorkerCounts
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._worker_app import (
    QUEUE,
    child_worker,
    executions,
    register_tasks,
    release,
    started,
)
from alkstore_contract_tests.harness import EngineHarness, StoreTarget

__all__ = [
    "WAIT_S",
    "AppFactory",
    "RunningWorker",
    "WorkerFixtures",
    "WorkerTests",
    "wait_until",
]

#: The longest any bounded wait of this suite lasts, seconds.
WAIT_S = 60.0
#: How long a lapsed claim may take to be reclaimed and its job finished,
#: seconds: a one-second visibility timeout plus a 0.1 s re-poll, with room
#: for a loaded machine.
RECLAIM_WAIT_S = 15.0
#: How often bounded waits look again, seconds.
POLL_S = 0.02


class AppFactory(Protocol):
    """The ``worker_apps`` fixture: an :class:`App` over a new store on the
    test's target, with the suite's tasks registered."""

    def __call__(
        self, *, clock: ManualClock | None = ..., visibility_timeout_s: float = ...
    ) -> App: ...


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``predicate`` until it is true; fail naming ``what`` after
    ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(POLL_S)


class RunningWorker:
    """``worker.run()`` on a thread; :meth:`finish` stops it, joins it within
    bounds and re-raises anything ``run`` raised."""

    def __init__(self, worker: Worker, burst: bool = False) -> None:
        self.worker = worker
        self.result: WorkerCounts | None = None
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, args=(burst,), daemon=True)
        self.thread.start()

    def _run(self, burst: bool) -> None:
        try:
            self.result = self.worker.run(burst=burst)
        except BaseException:
            self.error = traceback.format_exc()

    def join(self, timeout_s: float = WAIT_S) -> WorkerCounts:
        """Wait for ``run`` to return by itself."""
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"worker.run did not return within {timeout_s} s"
        assert self.error is None, f"worker.run raised:\n{self.error}"
        assert self.result is not None
        return self.result

    def finish(self, timeout_s: float = WAIT_S) -> WorkerCounts:
        """Stop the worker and wait for ``run`` to return."""
        self.worker.stop()
        return self.join(timeout_s)


class ChildWorker:
    """A worker in a spawned child process, and its log file."""

    def __init__(self, process: Any, log: Path) -> None:
        self.process = process
        self.log = log

    @property
    def pid(self) -> int:
        """The child's process id."""
        pid: int = self.process.pid
        return pid

    def log_text(self) -> str:
        """What the child's worker logged so far."""
        return self.log.read_text() if self.log.exists() else ""

    def join(self, timeout_s: float = WAIT_S) -> int:
        """Wait for the child to exit; return its exit code."""
        self.process.join(timeout_s)
        assert not self.process.is_alive(), f"the child did not exit within {timeout_s} s"
        code: int = self.process.exitcode
        return code


def job_of(queue: Any, job_id: int) -> Any:
    """``queue.get_job(job_id)``, asserting that the job exists."""
    found = queue.get_job(job_id)
    assert found is not None, f"job {job_id} not found"
    return found


def behind_a_gate(
    app: App, log_dir: str, before: int, gates: list[str], after: list[str]
) -> tuple[list[int], list[int]]:
    """The prefetch tests' queue: ``before`` quick jobs (``r0`` ...), then a
    gated job per token of ``gates``, then a quick job per token of
    ``after``; the ids of the gated jobs and of those after them."""
    for i in range(before):
        app.tasks["record"].enqueue(log_dir, f"r{i}")
    gated = [app.tasks["gated"].enqueue(log_dir, token) for token in gates]
    return gated, [app.tasks["record"].enqueue(log_dir, token) for token in after]


def _run_burst(*workers: Worker) -> list[WorkerCounts]:
    """Run the workers in burst mode at once, each on its own thread."""
    running = [RunningWorker(w, burst=True) for w in workers]
    return [r.join() for r in running]


class WorkerFixtures(EngineHarness):
    """The fixtures of the worker tests (function-scoped; named ``worker_*``
    so that they never clash with the contract suite's own):
    ``worker_clock`` (a :class:`ManualClock` at ``T0``), ``worker_apps``
    (apps over fresh stores on the target, the tasks of :mod:`._worker_app`
    registered), ``worker_log_dir`` (where task executions are recorded) and
    ``worker_spawn`` (child worker processes).
    """

    @pytest.fixture
    def worker_clock(self) -> ManualClock:
        """A :class:`ManualClock` standing at ``T0``."""
        return ManualClock(T0)

    @pytest.fixture
    def worker_log_dir(self, tmp_path: Path) -> str:
        """An empty folder for the tasks' execution records."""
        folder = tmp_path / "worker-log"
        folder.mkdir()
        return str(folder)

    @pytest.fixture
    def worker_apps(self, alkstore_target: StoreTarget) -> Iterator[AppFactory]:
        """Make apps over new stores on the test's target (``clock=None``:
        the engine's own clock); every store is closed at teardown."""
        stores: list[Store] = []

        def factory(*, clock: ManualClock | None = None, visibility_timeout_s: float = 30) -> App:
            options: dict[str, Any] = {} if clock is None else {"clock": clock}
            store = self.open_store(alkstore_target, **options)
            stores.append(store)
            app = App(store=store)
            register_tasks(app, visibility_timeout_s)
            return app

        yield factory
        for store in stores:
            store.close()

    @pytest.fixture
    def worker_spawn(
        self, alkstore_target: StoreTarget, tmp_path: Path, worker_log_dir: str
    ) -> Iterator[Callable[..., ChildWorker]]:
        """Start a child process running a worker on the target (real clock):
        ``worker_spawn(visibility_timeout_s, burst=..., **worker_options)``
        returns a :class:`ChildWorker`. Children still alive at teardown are
        killed."""
        if not self.spawned_processes_can_open:
            pytest.skip("this engine's harness cannot open its target in a spawned process")
        ctx = multiprocessing.get_context("spawn")
        children: list[ChildWorker] = []

        def spawn(
            visibility_timeout_s: float = 30, burst: bool = False, **options: Any
        ) -> ChildWorker:
            log_path = tmp_path / f"child-{len(children)}.log"
            options.setdefault("poll_interval_s", 0.1)
            process = ctx.Process(
                target=child_worker,
                kwargs={
                    "url": alkstore_target.url,
                    "options": dict(alkstore_target.options),
                    "imports": tuple(self.child_process_imports),
                    "visibility_timeout_s": visibility_timeout_s,
                    "worker_options": options,
                    "burst": burst,
                    "log_path": str(log_path),
                },
                daemon=True,
            )
            process.start()
            child = ChildWorker(process, log_path)
            children.append(child)
            return child

        yield spawn
        for child in children:
            if child.process.is_alive():
                child.process.kill()
            child.process.join(WAIT_S)


class WorkerTests(WorkerFixtures):
    """The worker runtime on this engine (docs/tasks-and-workers.md), with
    sync tasks; async tasks are :class:`~.async_worker.AsyncWorkerTests`'."""

    # -- outcomes (injected clock) -------------------------------------------

    def test_each_outcome_reaches_the_store(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """Return acks; an exception retries with the queue's backoff and
        the type, message and traceback as the error; ``Fail`` dead-letters
        at once; ``Retry(delay=)`` retries at that delay; an unknown task, a
        payload that is not a task's, and a retry at the budget dead-letter."""
        app = worker_apps(clock=worker_clock)

        @app.task(queue=QUEUE, name="boom")
        def boom() -> None:
            raise ValueError("boom")

        @app.task(queue=QUEUE, name="refuse")
        def refuse(message: str | None) -> None:
            raise Fail(message)

        @app.task(queue=QUEUE, name="later")
        def later() -> None:
            raise Retry("not yet", delay=60)

        queue = app.queue(QUEUE)
        ok = app.tasks["record"].enqueue(worker_log_dir, "ok")
        boomed = boom.enqueue()
        refused = refuse.enqueue("bad input")
        refused_bare = refuse.enqueue(None)
        snoozed = later.enqueue()
        unknown = queue.enqueue({"task": "no-such-task", "args": []})
        malformed = queue.enqueue(["not", "a", "task"])
        exhausted = boom.options(max_attempts=1).enqueue()

        counts = app.worker(handle_signals=False).run(burst=True)

        assert counts == WorkerCounts(succeeded=1, retried=2, dead=5, lost=0)
        assert queue.get_job(ok) is None
        assert executions(worker_log_dir) == {"ok": 1}

        retried = queue.get_job(boomed)
        assert retried is not None
        assert (retried.state, retried.attempts) == ("pending", 1)
        assert retried.last_error is not None
        assert retried.last_error.startswith("ValueError: boom\n")
        assert "Traceback (most recent call last)" in retried.last_error
        # The default backoff (base 4 s) after attempt 1: 2 to 4 s (docs/contract.md §3).
        assert T0 + timedelta(seconds=2) <= retried.run_at <= T0 + timedelta(seconds=4)

        snoozed_job = queue.get_job(snoozed)
        assert snoozed_job is not None
        assert (snoozed_job.state, snoozed_job.last_error) == ("pending", "not yet")
        assert snoozed_job.run_at == T0 + timedelta(seconds=60)

        expected_dead = {refused: "bad input", refused_bare: "failed"}
        for job_id, error in expected_dead.items():
            dead = queue.get_job(job_id)
            assert dead is not None
            assert (dead.state, dead.last_error) == ("dead", error)
        # Its last attempt spent, the job is dead and keeps the error that spent it.
        dead = queue.get_job(exhausted)
        assert dead is not None
        assert (dead.state, dead.attempts) == ("dead", 1)
        assert dead.last_error is not None
        assert dead.last_error.startswith(
            "max attempts exceeded; last error: ValueError: boom\n\nTraceback"
        )
        for job_id, fragment in ((unknown, "unknown task 'no-such-task'"), (malformed, "task")):
            dead = queue.get_job(job_id)
            assert dead is not None
            assert dead.state == "dead"
            assert dead.last_error is not None
            assert fragment in dead.last_error

    def test_a_job_whose_outcome_cannot_be_recorded_is_left_to_lapse(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """``Fail(123)`` is refused when raised, so its job is retried; an
        outcome the store refuses to record (here ``fail(123)``, smuggled
        past ``Fail``'s own check) is logged and counted ``lost``: the slot
        is freed (the burst run returns), and the job, left claimed, lapses
        and is reclaimed by the next worker."""
        app = worker_apps(clock=worker_clock)
        calls: list[str] = []

        @app.task(queue=QUEUE, name="bad_fail")
        def bad_fail() -> None:
            raise Fail(123)  # type: ignore[arg-type]

        @app.task(queue=QUEUE, name="unrecordable")
        def unrecordable() -> None:
            calls.append("run")
            if len(calls) == 1:
                exc = Fail("x")
                exc.message = 123  # type: ignore[assignment]
                raise exc

        queue = app.queue(QUEUE)
        retried_id = bad_fail.enqueue()
        lost_id = unrecordable.enqueue()
        worker = app.worker(handle_signals=False, grace_period_s=WAIT_S)
        counts = RunningWorker(worker, burst=True).join(timeout_s=20)
        assert counts == WorkerCounts(retried=1, lost=1)
        assert worker.running == 0

        retried = queue.get_job(retried_id)
        assert retried is not None
        assert (retried.state, retried.attempts) == ("pending", 1)
        assert retried.last_error is not None
        assert "Fail's message must be a str or None, not int" in retried.last_error
        left = queue.get_job(lost_id)
        assert left is not None
        assert (left.state, left.attempts, left.last_error) == ("processing", 1, None)

        worker_clock.advance(30)  # the unrecorded claim lapses
        queue.cancel(retried_id)
        again = app.worker(handle_signals=False).run(burst=True)
        assert again == WorkerCounts(succeeded=1)
        assert calls == ["run", "run"]
        assert queue.get_job(lost_id) is None

    def test_case_012_a_task_whose_call_does_not_run_its_body_is_never_acked(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """Case 012: an async generator and a generator function are refused
        where they are registered, naming them; a plain function that
        returns an awaitable or a generator (a plain def around an ``async
        def``) has not run its body, and neither has an async task whose
        awaited value is another coroutine: each such job is dead-lettered
        with that reason, never acked, and the inner body never runs.
        (Coroutine functions are async tasks: ``AsyncWorkerTests``.)"""
        app = worker_apps(clock=worker_clock)
        ran: list[str] = []

        async def fetch(url: str) -> None:
            ran.append(url)
            raise RuntimeError("ran")

        async def stream() -> Any:
            yield 1

        def produce() -> Any:
            ran.append("generator")
            yield 1

        class Streamer:
            async def __call__(self) -> Any:
                yield 1

        for function, kind in (
            (stream, "async generator"),
            (produce, "generator"),
            (Streamer(), "async generator"),
        ):
            with pytest.raises(
                ValidationError,
                match=rf"a task must be a plain function or a coroutine function .* {kind}",
            ):
                app.task(queue=QUEUE, name=f"refused_{kind}")(function)
        assert not {name for name in app.tasks if name.startswith("refused_")}

        def fetch_later(url: str) -> Any:
            return fetch(url)  # plain defs that hand back what would run later

        def produce_later() -> Any:
            return produce()

        async def fetch_twice_later(url: str) -> Any:
            return fetch(url)  # awaited, it hands back another coroutine

        wrapped = app.task(queue=QUEUE, name="wrapped")(fetch_later)
        yielding = app.task(queue=QUEUE, name="yielding")(produce_later)
        nested = app.task(queue=QUEUE, name="nested")(fetch_twice_later)
        assert (wrapped.is_async, yielding.is_async, nested.is_async) == (False, False, True)
        queue = app.queue(QUEUE)
        coroutine_job = wrapped.enqueue("x")
        generator_job = yielding.enqueue()
        nested_job = nested.enqueue("y")
        counts = app.worker(handle_signals=False).run(burst=True)

        assert counts == WorkerCounts(dead=3)
        assert ran == []
        for job_id, said in (
            (coroutine_job, "returned a coroutine instead of running"),
            (generator_job, "returned a generator instead of running"),
            (nested_job, "returned a coroutine from its coroutine"),
        ):
            dead = queue.get_job(job_id)
            assert dead is not None
            assert (dead.state, dead.attempts) == ("dead", 1)
            assert dead.last_error is not None
            assert said in dead.last_error

    def test_case_015_writes_on_held_jobs_are_retried_through_a_passing_fault(
        self,
        alkstore_target: StoreTarget,
        worker_apps: AppFactory,
        worker_clock: ManualClock,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Case 015: while every write on the live jobs fails with an error
        that may pass (the harness's ``job_writes_fail``), finished jobs'
        ack, retry and fail are tried again while their claims hold, and
        land once the fault passes: each job ran once and ends as its
        handler said, nothing is counted lost."""
        app = worker_apps(clock=worker_clock)
        gate = threading.Event()
        ran: list[str] = []

        @app.task(queue=QUEUE, name="held")
        def held(outcome: str) -> None:
            assert gate.wait(WAIT_S)
            ran.append(outcome)
            if outcome == "raise":
                raise RuntimeError("boom")
            if outcome == "fail":
                raise Fail("refused")

        queue = app.queue(QUEUE)
        ids = {outcome: held.enqueue(outcome) for outcome in ("ok", "ok2", "raise", "fail")}
        worker = app.worker(concurrency=4, handle_signals=False, poll_interval_s=0.05)
        with caplog.at_level(logging.INFO, logger="alkstore.worker"):
            running = RunningWorker(worker, burst=True)
            wait_until(lambda: worker.running == 4, "the four jobs to start")
            with self.job_writes_fail(alkstore_target):
                gate.set()
                # The batched ack, the retry and the fail each failed once.
                wait_until(
                    lambda: (
                        "left to lapse" in caplog.text
                        or caplog.text.count("trying again while the claim holds") >= 3
                    ),
                    "three writes to fail",
                )
                assert "left to lapse" not in caplog.text
            counts = running.join()
        assert counts == WorkerCounts(succeeded=2, retried=1, dead=1)
        assert sorted(ran) == ["fail", "ok", "ok2", "raise"]
        assert queue.get_job(ids["ok"]) is None
        assert queue.get_job(ids["ok2"]) is None
        retried = queue.get_job(ids["raise"])
        assert retried is not None
        assert (retried.state, retried.attempts) == ("pending", 1)
        dead = queue.get_job(ids["fail"])
        assert dead is not None
        assert (dead.state, dead.last_error) == ("dead", "refused")

    def test_a_burst_worker_whose_claims_keep_failing_stops_with_the_error(
        self, alkstore_target: StoreTarget, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """Issue 11: a ``--burst`` worker whose every claim fails (here with
        an error that may pass) does not retry forever: after a few failed
        rounds it stops, and ``run`` raises an ``EngineError`` naming the
        last failure; the job is untouched."""
        app = worker_apps(clock=worker_clock)
        queue = app.queue(QUEUE)
        job_id = queue.enqueue({"task": "record", "args": ["unused", "x"]})
        worker = app.worker(handle_signals=False)
        with self.job_writes_fail(alkstore_target):
            running = RunningWorker(worker, burst=True)  # its first claim fails already
            running.thread.join(WAIT_S)
        assert not running.thread.is_alive(), "the burst worker did not give up"
        assert running.error is not None
        assert "EngineError: a burst worker's claims failed" in running.error
        assert "injected job-write failure" in running.error
        untouched = queue.get_job(job_id)
        assert untouched is not None
        assert (untouched.state, untouched.attempts) == ("pending", 0)

    def test_task_payload_and_per_job_options(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """``enqueue`` stores ``{"task", "args", "kwargs"}``; ``options()``
        returns a copy that applies per-job options; arguments that are not
        strict JSON raise ``ValidationError`` and store nothing; calling the
        task runs it in this process."""
        app = worker_apps(clock=worker_clock)
        record = app.tasks["record"]
        queue = app.queue(QUEUE)

        plain = queue.get_job(record.enqueue(worker_log_dir, token="t1"))
        assert plain is not None
        assert plain.payload == {
            "task": "record",
            "args": [worker_log_dir],
            "kwargs": {"token": "t1"},
        }
        assert plain.content_type == "application/json"
        assert plain.run_at == T0

        configured = record.options(delay=10, priority=7, max_attempts=2, expires=100)
        assert record.enqueue_options == {}
        job = queue.get_job(configured.enqueue(worker_log_dir, "t2"))
        assert job is not None
        assert job.run_at == T0 + timedelta(seconds=10)
        assert job.expires_at == T0 + timedelta(seconds=100)
        assert (job.priority, job.max_attempts, job.visibility_timeout_s) == (7, 2, 30)

        at = T0 + timedelta(minutes=5)
        scheduled = queue.get_job(record.options(run_at=at).enqueue(worker_log_dir, "t3"))
        assert scheduled is not None
        assert scheduled.run_at == at

        before = queue.stats()
        for bad in (("tuple",), object(), {1: "non-str key"}, float("nan")):
            with pytest.raises(ValidationError):
                record.enqueue(worker_log_dir, bad)
        with pytest.raises(ValidationError):
            record.options(priority=True)
        assert queue.stats() == before

        record(worker_log_dir, "in-process")
        assert executions(worker_log_dir) == {"in-process": 1}
        assert queue.stats() == before

    def test_enqueue_tx_commits_and_rolls_back_with_the_caller(
        self, alkstore_target: StoreTarget, worker_apps: AppFactory, worker_log_dir: str
    ) -> None:
        """``Task.enqueue_tx`` writes in the caller's transaction: a rollback
        leaves no job, a commit one that a worker runs."""
        app = worker_apps()
        record = app.tasks["record"]
        queue = app.queue(QUEUE)
        with self.app_connection(alkstore_target) as conn:
            self.begin(conn)
            rolled_back = record.enqueue_tx(conn, worker_log_dir, "rolled-back")
            conn.rollback()
            # Checked now: an engine may hand the rolled-back id out again.
            assert queue.get_job(rolled_back) is None
            assert tuple(queue.stats()) == (0, 0, 0, 0)
            self.begin(conn)
            committed = record.enqueue_tx(conn, worker_log_dir, "committed")
            conn.commit()
        assert queue.get_job(committed) is not None
        app.worker(handle_signals=False).run(burst=True)
        assert executions(worker_log_dir) == {"committed": 1}

    # -- claiming (injected clock) -------------------------------------------

    def test_threads_run_every_job_exactly_once(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """Two workers with their own stores, four threads each, drain 200
        jobs in burst mode: each job runs exactly once and is acked."""
        apps = [worker_apps(clock=worker_clock) for _ in range(2)]
        tokens = [f"j{i}" for i in range(200)]
        apps[0].tasks["record"].enqueue_many([(worker_log_dir, t) for t in tokens])

        counts = _run_burst(*(app.worker(concurrency=4, handle_signals=False) for app in apps))

        assert executions(worker_log_dir) == dict.fromkeys(tokens, 1)
        assert sum(c.succeeded for c in counts) == len(tokens)
        assert sum(c.total for c in counts) == len(tokens)
        assert tuple(apps[0].queue(QUEUE).stats()) == (0, 0, 0, 0)

    def test_queues_are_worked_in_the_order_given(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """A worker claims from its first queue before the next (RQ's queue
        order); with ``queues=None`` it works every queue of the app."""
        app = worker_apps(clock=worker_clock)
        ran: list[str] = []

        @app.task(queue="low", name="low")
        def low(i: int) -> None:
            ran.append(f"low{i}")

        @app.task(queue="high", name="high")
        def high(i: int) -> None:
            ran.append(f"high{i}")

        low.enqueue_many([(i,) for i in range(3)])
        high.enqueue_many([(i,) for i in range(3)])
        app.worker(["high", "low"], handle_signals=False).run(burst=True)
        assert ran == ["high0", "high1", "high2", "low0", "low1", "low2"]

        worker = app.worker()
        assert worker.queues == [QUEUE, "low", "high"]

    def test_burst_leaves_jobs_that_are_not_due(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """Burst mode returns once no job is ready: a delayed job waits for
        a later run (RQ's burst mode)."""
        app = worker_apps(clock=worker_clock)
        record = app.tasks["record"]
        record.options(delay=60).enqueue(worker_log_dir, "later")

        first = app.worker(handle_signals=False).run(burst=True)
        assert first.total == 0
        assert app.queue(QUEUE).stats().scheduled == 1

        worker_clock.advance(60)
        second = app.worker(handle_signals=False).run(burst=True)
        assert second.succeeded == 1
        assert executions(worker_log_dir) == {"later": 1}

    def test_expired_jobs_are_swept_to_the_dead_letters(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """A worker sweeps its queues when it starts: an expired job is
        dead-lettered as ``"expired"``, never run."""
        app = worker_apps(clock=worker_clock)
        job_id = app.tasks["record"].options(expires=10).enqueue(worker_log_dir, "stale")
        worker_clock.advance(20)
        counts = app.worker(handle_signals=False).run(burst=True)
        assert counts.total == 0
        dead = app.queue(QUEUE).get_job(job_id)
        assert dead is not None
        assert (dead.state, dead.last_error) == ("dead", "expired")
        assert executions(worker_log_dir) == {}

    # -- waking and stopping -------------------------------------------------

    def test_a_wake_claims_long_before_the_poll_interval(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """With a 30 s re-poll interval, a job enqueued while the worker waits
        runs within seconds: the worker listens for wakes (docs/contract.md §3 "Wake")."""
        app = worker_apps(clock=worker_clock)
        record = app.tasks["record"]
        record.enqueue(worker_log_dir, "first")
        running = RunningWorker(app.worker(poll_interval_s=30, handle_signals=False))
        try:
            wait_until(lambda: executions(worker_log_dir), "the first job to run")
            # Not a measurement: lets the worker finish the claim that follows a
            # job, so that the next job can only be found through a wake.
            time.sleep(0.2)
            record.enqueue(worker_log_dir, "woken")
            wait_until(lambda: len(executions(worker_log_dir)) == 2, "the woken job", 10)
        finally:
            counts = running.finish()
        assert counts.succeeded == 2

    def test_stop_from_another_thread_lets_the_running_job_finish(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """``stop()`` ends claiming at once; the running job finishes and is
        acked; a job not yet claimed stays pending, untouched."""
        app = worker_apps(clock=worker_clock)
        queue = app.queue(QUEUE)
        running_id = app.tasks["gated"].enqueue(worker_log_dir, "running")
        waiting_id = app.tasks["record"].enqueue(worker_log_dir, "waiting")
        running = RunningWorker(app.worker(poll_interval_s=0.05, handle_signals=False))
        wait_until(lambda: started(worker_log_dir), "the gated job to start")
        running.worker.stop()
        running.thread.join(0.5)
        assert running.thread.is_alive(), "run() returned before its running job finished"
        release(worker_log_dir)
        counts = running.join()

        assert counts == WorkerCounts(succeeded=1)
        assert queue.get_job(running_id) is None
        waiting = queue.get_job(waiting_id)
        assert waiting is not None
        assert (waiting.state, waiting.attempts) == ("pending", 0)
        assert executions(worker_log_dir) == {"running": 1}

    # -- the workers registry (docs/contract.md §11) ---------------------------

    def test_a_running_worker_is_in_the_registry_with_its_jobs_and_reports_throughput(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """The worker records itself when it starts, shows the job it runs
        at its next refresh, reports the jobs that ended per minute, and
        removes its record when it stops."""
        app = worker_apps(clock=worker_clock)
        store, queue = app.store, app.queue(QUEUE)
        gated_id = app.tasks["gated"].enqueue(worker_log_dir, "g")
        for i in range(3):
            app.tasks["record"].enqueue(worker_log_dir, f"r{i}")
        queue.enqueue({"task": "no-such-task"})  # dead at once
        worker = app.worker(
            concurrency=2,
            poll_interval_s=0.05,
            registry_interval_s=0.05,
            worker_id="registry-w",
            handle_signals=False,
        )
        running = RunningWorker(worker)
        wait_until(lambda: started(worker_log_dir), "the gated job to start")
        wait_until(
            lambda: [w.running for w in store.workers()] == [(gated_id,)],
            "the registry to show the gated job running",
        )
        (info,) = store.workers()
        assert (info.id, info.pid, info.queues, info.concurrency) == (
            "registry-w",
            os.getpid(),
            (QUEUE,),
            2,
        )
        assert (info.started_at, info.last_seen_at, info.ttl_s) == (T0, T0, 3 * 0.05)
        release(worker_log_dir)
        assert running.finish() == WorkerCounts(succeeded=4, dead=1)
        assert store.workers() == []  # it said it left
        (point,) = queue.throughput()
        assert point == (T0, 4, 0, 1)

    def test_a_worker_can_stay_out_of_the_registry(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        app = worker_apps(clock=worker_clock)
        app.tasks["gated"].enqueue(worker_log_dir, "g")
        running = RunningWorker(
            app.worker(poll_interval_s=0.05, registry_interval_s=None, handle_signals=False)
        )
        wait_until(lambda: started(worker_log_dir), "the gated job to start")
        assert app.store.workers() == []
        release(worker_log_dir)
        assert running.finish() == WorkerCounts(succeeded=1)
        assert app.queue(QUEUE).throughput() == []

    # -- results (docs/tasks-and-workers.md "Results") --------------------------

    def test_a_return_value_is_kept_as_the_result_where_the_queue_keeps_completed_jobs(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """docs/contract.md §3 "Completed jobs": the worker acks with the
        handler's return value; one the codec refuses dead-letters the job,
        saying why; a queue that keeps nothing still deletes its jobs."""
        app = worker_apps(clock=worker_clock)

        @app.task(queue="kept", name="total", keep_completed_s=3600)
        def total(numbers: list[int]) -> dict[str, int]:
            return {"total": sum(numbers)}

        @app.task(queue="kept", name="opaque")
        def opaque() -> object:
            return {1, 2}  # a set: not JSON

        @app.task(queue="kept", name="nothing")
        def nothing() -> None:
            pass

        @app.task(queue="gone", name="forgotten")
        def forgotten() -> int:
            return 7

        summed, refused, none = total.enqueue([1, 2, 3]), opaque.enqueue(), nothing.enqueue()
        dropped = forgotten.enqueue()
        counts = app.worker(["kept", "gone"], handle_signals=False).run(burst=True)
        assert counts == WorkerCounts(succeeded=3, dead=1)
        kept = app.queue("kept")
        done = kept.get_job(summed)
        assert done is not None
        assert (done.state, done.result, done.finished_at) == ("completed", {"total": 6}, T0)
        empty = kept.get_job(none)
        assert empty is not None
        assert (empty.state, empty.result) == ("completed", None)
        dead = kept.get_job(refused)
        assert dead is not None
        assert dead.state == "dead"
        assert dead.last_error is not None
        assert "task 'opaque' returned a value its queue cannot keep" in dead.last_error
        assert app.queue("gone").get_job(dropped) is None

    # -- the job context (docs/tasks-and-workers.md "Job context") -------------

    def test_a_task_taking_the_context_gets_its_claimed_job(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """``takes_context=True``: the worker passes the job's
        ``JobContext`` first, its ``job`` the claim's snapshot (id, queue,
        attempts, payload); enqueueing takes the arguments without it,
        checked against the function less its first parameter."""
        app = worker_apps(clock=worker_clock)
        seen: list[tuple[Any, ...]] = []

        @app.task(queue=QUEUE, name="ctx_job", takes_context=True)
        def ctx_job(context: JobContext, token: str, *, twice: bool = False) -> None:
            seen.append((context.job, token, twice, context.cancelled, context.lost))
            if context.job.attempts == 1:
                raise RuntimeError("once more")

        queue = app.queue(QUEUE)
        with pytest.raises(
            ValidationError, match=r"task 'ctx_job' cannot be called .*too many positional"
        ):
            ctx_job.enqueue("a", "b")  # type: ignore[call-arg, arg-type]
        with pytest.raises(
            ValidationError, match=r"task 'ctx_job' cannot be called .*missing .*'token'"
        ):
            ctx_job.enqueue_many([("a",), ()])
        assert tuple(queue.stats()) == (0, 0, 0, 0)

        job_id = ctx_job.enqueue("t", twice=True)
        first = app.worker(handle_signals=False, worker_id="w1").run(burst=True)
        worker_clock.advance(10)  # past the backoff
        second = app.worker(handle_signals=False, worker_id="w2").run(burst=True)

        assert (first, second) == (WorkerCounts(retried=1), WorkerCounts(succeeded=1))
        assert [(job.id, job.queue, job.attempts, job.worker_id) for job, *_ in seen] == [
            (job_id, QUEUE, 1, "w1"),
            (job_id, QUEUE, 2, "w2"),
        ]
        assert [tuple(rest) for _, *rest in seen] == [("t", True, False, False)] * 2
        claimed = seen[0][0]
        assert claimed.state == "processing"
        assert claimed.payload == {"task": "ctx_job", "args": ["t"], "kwargs": {"twice": True}}
        assert claimed.claim_deadline == T0 + timedelta(seconds=30)

    def test_the_context_heartbeat_extends_the_claim_through_the_worker(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """``context.heartbeat(extend)`` sets the claim's deadline to the
        store's now plus ``extend`` (default the visibility timeout, 30 s
        here) and says it took effect."""
        app = worker_apps(clock=worker_clock)
        go, beaten = threading.Event(), threading.Event()
        beats: list[bool] = []

        @app.task(queue=QUEUE, name="long_ctx", takes_context=True)
        def long_ctx(context: JobContext) -> None:
            for extend in (timedelta(seconds=300), None):
                assert go.wait(WAIT_S)
                go.clear()
                beats.append(context.heartbeat(extend))
                beaten.set()
            assert go.wait(WAIT_S)

        queue = app.queue(QUEUE)
        job_id = long_ctx.enqueue()
        running = RunningWorker(app.worker(poll_interval_s=0.05, handle_signals=False))
        try:
            wait_until(lambda: job_of(queue, job_id).state == "processing", "the claim")
            assert job_of(queue, job_id).claim_deadline == T0 + timedelta(seconds=30)
            for advance, deadline in ((10, 310), (5, 45)):
                worker_clock.advance(advance)
                go.set()
                assert beaten.wait(WAIT_S)
                beaten.clear()
                assert job_of(queue, job_id).claim_deadline == T0 + timedelta(seconds=deadline)
            go.set()
            wait_until(lambda: running.worker.counts.total, "the job to finish")
        finally:
            go.set()
            counts = running.finish()
        assert beats == [True, True]
        assert counts == WorkerCounts(succeeded=1)
        assert queue.get_job(job_id) is None

    def test_a_running_handler_sees_its_job_cancelled_in_its_context(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """``Queue.cancel`` from another thread while the handler runs:
        a handler polling ``context.cancelled`` sees it within a heartbeat
        interval (a third of the visibility timeout, 1 s here), well before
        the claim would lapse; one whose ``context.heartbeat()`` is refused
        for it sees it at once. Neither outcome is recorded: both are
        counted ``cancelled``."""
        app = worker_apps(clock=worker_clock, visibility_timeout_s=3)
        started_now = threading.Event()
        asked = threading.Event()
        seen: dict[str, tuple[Any, ...]] = {}

        @app.task(queue=QUEUE, name="polling", takes_context=True)
        def polling(context: JobContext) -> None:
            started_now.set()
            deadline = time.monotonic() + WAIT_S
            while not context.cancelled:
                assert time.monotonic() < deadline, "the cancel was never seen"
                time.sleep(POLL_S)
            seen["polling"] = (time.monotonic(), context.lost)

        @app.task(queue=QUEUE, name="asking", takes_context=True)
        def asking(context: JobContext) -> None:
            assert asked.wait(WAIT_S)
            beat = context.heartbeat()
            seen["asking"] = (beat, context.cancelled, context.lost)

        queue = app.queue(QUEUE)
        polling_id = polling.enqueue()
        running = RunningWorker(
            app.worker(concurrency=2, poll_interval_s=0.05, handle_signals=False)
        )
        try:
            assert started_now.wait(WAIT_S)
            cancelled_at = time.monotonic()
            assert queue.cancel(polling_id)
            wait_until(lambda: "polling" in seen, "the handler to see the cancel")
            assert seen["polling"][1] is False  # cancelled, not lost
            assert seen["polling"][0] - cancelled_at < 3.0  # before the claim would lapse

            asking_id = asking.enqueue()
            wait_until(lambda: job_of(queue, asking_id).state == "processing", "the claim")
            assert queue.cancel(asking_id)
            asked.set()
            wait_until(lambda: running.worker.counts.total == 2, "both handlers to end")
        finally:
            asked.set()
            counts = running.finish()
        assert seen["asking"] == (False, True, False)
        assert counts == WorkerCounts(cancelled=2)

    # -- prefetch (docs/tasks-and-workers.md "Prefetch") -----------------------

    def test_prefetched_jobs_are_released_unstarted_when_the_worker_stops(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """Once jobs finish quickly the worker claims ahead of its one slot;
        at ``stop()`` the jobs it holds and has not started go back at once,
        due, their attempt not counted (``max_attempts`` one larger), and
        are never run by it."""
        app = worker_apps(clock=worker_clock)
        queue = app.queue(QUEUE)
        _, after = behind_a_gate(app, worker_log_dir, 30, ["gate"], [f"w{i}" for i in range(10)])
        budget = job_of(queue, after[-1]).max_attempts
        running = RunningWorker(app.worker(prefetch=5, poll_interval_s=0.05, handle_signals=False))
        wait_until(lambda: started(worker_log_dir), "the gated job to start")
        wait_until(
            lambda: any(job_of(queue, i).attempts for i in after),
            "the worker to claim ahead of its busy slot",
        )
        running.worker.stop()
        release(worker_log_dir)
        counts = running.finish()

        assert counts == WorkerCounts(succeeded=31)
        assert executions(worker_log_dir) == {**{f"r{i}": 1 for i in range(30)}, "gate": 1}
        rows = [job_of(queue, i) for i in after]
        assert [row.state for row in rows] == ["pending"] * 10
        given_back = [row for row in rows if row.attempts]
        assert 1 <= len(given_back) <= 5
        for row in given_back:
            assert (row.attempts, row.max_attempts, row.worker_id) == (1, budget + 1, None)
        # The next worker runs them, its claims counted from there.
        assert app.worker(handle_signals=False).run(burst=True).succeeded == 10
        assert executions(worker_log_dir)["w0"] == 1

    def test_a_prefetched_job_whose_claim_lapsed_is_never_started(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """A job claimed ahead whose claim lapses while it waits for a slot
        is not run on that claim (it is no longer its own): counted
        ``lost``, it runs once, under a new claim."""
        app = worker_apps(clock=worker_clock)
        queue = app.queue(QUEUE)
        _, [ahead] = behind_a_gate(app, worker_log_dir, 30, ["gate"], ["ahead"])
        running = RunningWorker(app.worker(prefetch=5, poll_interval_s=0.05, handle_signals=False))
        wait_until(lambda: started(worker_log_dir), "the gated job to start")
        wait_until(lambda: job_of(queue, ahead).attempts, "the worker to claim ahead")
        # The jobs before it acked (the completer's batch): only two claims left.
        wait_until(lambda: queue.stats().processing == 2, "the finished jobs' acks")
        worker_clock.advance(30)  # every claim lapses, the running job's too
        release(worker_log_dir)
        # Both are reclaimed (by this worker too) and run under new claims.
        wait_until(lambda: queue.stats() == (0, 0, 0, 0), "every job to be done")
        counts = running.finish()
        assert (counts.succeeded, counts.lost) == (32, 2)
        runs = executions(worker_log_dir)
        assert (runs["gate"], runs["ahead"]) == (2, 1)  # the gate's first run was lost

    def test_prefetch_zero_claims_only_for_free_slots(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        app = worker_apps(clock=worker_clock)
        queue = app.queue(QUEUE)
        _, [after] = behind_a_gate(app, worker_log_dir, 20, ["gate"], ["after"])
        running = RunningWorker(app.worker(prefetch=0, poll_interval_s=0.05, handle_signals=False))
        wait_until(lambda: started(worker_log_dir), "the gated job to start")
        wait_until(lambda: queue.stats().processing == 1, "the finished jobs' acks")
        assert job_of(queue, after).attempts == 0
        release(worker_log_dir)
        running.worker.stop()
        assert running.finish().succeeded == 21

    def test_a_worker_gives_back_prefetched_jobs_another_is_idle_for(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """Fairness: worker A, its one slot busy with a long job, holds the
        next long jobs it claimed ahead; an idle worker B gets them within
        the prefetch window (A releases them), while A's job still runs."""
        app = worker_apps(clock=worker_clock)
        queue = app.queue(QUEUE)
        gates, _ = behind_a_gate(app, worker_log_dir, 30, [f"g{i}" for i in range(3)], [])
        budget = job_of(queue, gates[-1]).max_attempts
        first = RunningWorker(
            app.worker(prefetch=10, worker_id="A", poll_interval_s=0.05, handle_signals=False)
        )
        wait_until(lambda: started(worker_log_dir), "worker A's first long job to start")
        second = RunningWorker(
            app.worker(prefetch=10, worker_id="B", poll_interval_s=0.05, handle_signals=False)
        )
        wait_until(lambda: len(started(worker_log_dir)) == 2, "worker B to start a long job")
        rows = {row.worker_id: row for row in (job_of(queue, i) for i in gates)}
        assert rows["A"].attempts == 1  # A's own long job, still running
        # B's came from A's prefetch: claimed twice, the first not counted.
        assert (rows["B"].attempts, rows["B"].max_attempts) == (2, budget + 1)
        release(worker_log_dir)
        wait_until(lambda: len(executions(worker_log_dir)) == 33, "every job to run")
        counts = [first.finish(), second.finish()]
        assert sum(c.succeeded for c in counts) == 33
        assert set(executions(worker_log_dir).values()) == {1}

    def test_a_job_running_past_the_grace_period_is_reclaimed(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """After ``stop()`` the worker waits ``grace_period_s`` for running
        jobs, then returns; a job still running is left claimed, lapses, and
        another worker reclaims and finishes it (at-least-once)."""
        app = worker_apps(clock=worker_clock)
        queue = app.queue(QUEUE)
        job_id = app.tasks["gated"].enqueue(worker_log_dir, "slow")
        first = RunningWorker(app.worker(grace_period_s=0.2, handle_signals=False))
        wait_until(lambda: started(worker_log_dir), "the gated job to start")
        assert first.finish(timeout_s=10).total == 0

        left = queue.get_job(job_id)
        assert left is not None
        assert (left.state, left.attempts) == ("processing", 1)

        worker_clock.advance(30)  # the claim lapses
        release(worker_log_dir)
        second = app.worker(handle_signals=False).run(burst=True)
        assert second.succeeded == 1
        assert queue.get_job(job_id) is None
        # The abandoned handler finishes too, but its claim is gone.
        wait_until(lambda: first.worker.counts.lost == 1, "the abandoned handler to end")
        assert executions(worker_log_dir) == {"slow": 2}

    # -- real time -----------------------------------------------------------

    def test_heartbeats_keep_a_long_job_claimed(
        self, worker_apps: AppFactory, worker_log_dir: str
    ) -> None:
        """A job running three times its one-second visibility timeout is
        never reclaimed: the worker heartbeats it (real time, bounded)."""
        app = worker_apps(visibility_timeout_s=1)
        thief = worker_apps(visibility_timeout_s=1).queue(QUEUE)
        job_id = app.tasks["gated"].enqueue(worker_log_dir, "long")
        running = RunningWorker(app.worker(poll_interval_s=0.1, handle_signals=False))
        try:
            wait_until(lambda: started(worker_log_dir), "the job to start")
            claimed = app.queue(QUEUE).get_job(job_id)
            assert claimed is not None
            assert claimed.claim_deadline is not None
            first_deadline = claimed.claim_deadline
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                stolen = thief.claim_one("thief")
                assert stolen is None, f"job {job_id} was reclaimed while running"
                time.sleep(0.1)
            later = app.queue(QUEUE).get_job(job_id)
            assert later is not None
            assert later.state == "processing"
            assert later.attempts == 1
            assert later.claim_deadline is not None
            assert later.claim_deadline >= first_deadline + timedelta(seconds=2)
            release(worker_log_dir)
            wait_until(lambda: running.worker.counts.total, "the job to finish")
        finally:
            release(worker_log_dir)
            counts = running.finish()
        assert counts == WorkerCounts(succeeded=1)
        assert app.queue(QUEUE).get_job(job_id) is None

    # -- processes (real time) -----------------------------------------------

    @pytest.mark.slow
    def test_processes_run_every_job_exactly_once(
        self, worker_apps: AppFactory, worker_spawn: Callable[..., ChildWorker], worker_log_dir: str
    ) -> None:
        """Three worker processes, two threads each, drain 300 jobs in burst
        mode: each job runs exactly once."""
        app = worker_apps()
        tokens = [f"p{i}" for i in range(300)]
        app.tasks["record"].enqueue_many([(worker_log_dir, t) for t in tokens])
        children = [worker_spawn(burst=True, concurrency=2) for _ in range(3)]
        for child in children:
            assert child.join() == 0, child.log_text()
        assert executions(worker_log_dir) == dict.fromkeys(tokens, 1)
        assert tuple(app.queue(QUEUE).stats()) == (0, 0, 0, 0)

    @pytest.mark.slow
    def test_sigkill_mid_job_leaves_jobs_to_be_reclaimed(
        self, worker_apps: AppFactory, worker_spawn: Callable[..., ChildWorker], worker_log_dir: str
    ) -> None:
        """A worker process killed with SIGKILL while running three jobs loses
        none: their claims lapse (visibility timeout 1 s) and another worker
        reclaims and finishes each (at-least-once)."""
        app = worker_apps(visibility_timeout_s=1)
        queue = app.queue(QUEUE)
        tokens = ["k0", "k1", "k2"]
        ids = app.tasks["gated"].enqueue_many([(worker_log_dir, t) for t in tokens])
        child = worker_spawn(visibility_timeout_s=1, concurrency=3)
        wait_until(lambda: len(started(worker_log_dir)) == 3, "the child to start all jobs")
        os.kill(child.pid, signal.SIGKILL)
        assert child.join() == -signal.SIGKILL
        for job_id in ids:
            orphan = queue.get_job(job_id)
            assert orphan is not None
            assert orphan.state == "processing"

        release(worker_log_dir)
        rescuer = RunningWorker(
            app.worker(concurrency=3, poll_interval_s=0.1, handle_signals=False)
        )
        try:
            wait_until(
                lambda: not any(queue.stats()),
                "the orphans to be reclaimed and acked",
                RECLAIM_WAIT_S,
            )
        finally:
            counts = rescuer.finish()
        assert counts.succeeded == 3
        assert executions(worker_log_dir) == dict.fromkeys(tokens, 1)
        assert started(worker_log_dir) == dict.fromkeys(tokens, 2)

    @pytest.mark.slow
    def test_sigterm_lets_running_jobs_finish(
        self, worker_apps: AppFactory, worker_spawn: Callable[..., ChildWorker], worker_log_dir: str
    ) -> None:
        """SIGTERM stops claiming at once; the two running jobs finish and are
        acked within the grace period; the process exits 0; the third job
        was never claimed."""
        app = worker_apps()
        queue = app.queue(QUEUE)
        gated_ids = app.tasks["gated"].enqueue_many([(worker_log_dir, t) for t in ("t0", "t1")])
        waiting_id = app.tasks["record"].enqueue(worker_log_dir, "t2")
        child = worker_spawn(concurrency=2, grace_period_s=WAIT_S)
        wait_until(lambda: len(started(worker_log_dir)) == 2, "the child to start two jobs")
        os.kill(child.pid, signal.SIGTERM)
        wait_until(lambda: "SIGTERM received" in child.log_text(), "the child to see SIGTERM")
        child.process.join(0.5)
        assert child.process.is_alive(), "the worker exited before its running jobs finished"
        release(worker_log_dir)
        assert child.join() == 0, child.log_text()

        assert all(queue.get_job(i) is None for i in gated_ids)
        waiting = queue.get_job(waiting_id)
        assert waiting is not None
        assert (waiting.state, waiting.attempts) == ("pending", 0)
        assert executions(worker_log_dir) == {"t0": 1, "t1": 1}

    @pytest.mark.slow
    def test_sigterm_past_the_grace_period_leaves_the_job_to_lapse(
        self, worker_apps: AppFactory, worker_spawn: Callable[..., ChildWorker], worker_log_dir: str
    ) -> None:
        """A job still running when the grace period ends is left claimed: the
        process exits 0 and the job, once its claim lapses, is reclaimed by
        another worker and finished."""
        app = worker_apps(visibility_timeout_s=1)
        queue = app.queue(QUEUE)
        job_id = app.tasks["gated"].enqueue(worker_log_dir, "stuck")
        child = worker_spawn(visibility_timeout_s=1, grace_period_s=0.5)
        wait_until(lambda: started(worker_log_dir), "the child to start the job")
        os.kill(child.pid, signal.SIGTERM)
        assert child.join() == 0, child.log_text()
        assert "still running" in child.log_text()
        left = queue.get_job(job_id)
        assert left is not None
        assert left.state == "processing"

        release(worker_log_dir)
        rescuer = RunningWorker(app.worker(poll_interval_s=0.1, handle_signals=False))
        try:
            wait_until(
                lambda: queue.get_job(job_id) is None,
                "the job to be reclaimed and acked",
                RECLAIM_WAIT_S,
            )
        finally:
            counts = rescuer.finish()
        assert counts.succeeded == 1
        assert executions(worker_log_dir) == {"stuck": 1}
