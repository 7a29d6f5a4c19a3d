"""Async tasks in the worker on a real engine: :class:`AsyncWorkerTests`.

A task that is a coroutine function runs as a coroutine on the worker's
event loop (docs/tasks-and-workers.md "Async tasks"), in the same worker and
under the same rules as a sync task: every outcome, the slots, heartbeats,
the grace period, ``run_async`` and its cancellation, the ``aenqueue``
twins and the relays' async ``send``. The store calls are the engine's, so
every engine runs these. Time is the injected :class:`ManualClock`'s; waits
are bounded waits for a condition.

Every test here is named ``test_async_worker_...``, so ``-k async_worker``
selects them.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, TypeVarTuple

import pytest

from alkstore import App, AsyncStore, Fail, JobContext, Retry, ValidationError, WorkerCounts
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._worker_app import QUEUE, executions
from alkstore_contract_tests.harness import StoreTarget, resolved
from alkstore_contract_tests.suite.worker import (
    WAIT_S,
    AppFactory,
    RunningWorker,
    WorkerFixtures,
    wait_until,
)

__all__ = ["AsyncWorkerTests"]

#: How long a barrier of coroutines waits for all of them, seconds: they are
#: all started at once, or the barrier is broken and the test fails.
BARRIER_WAIT_S = 10.0


_Ts = TypeVarTuple("_Ts")


class _ReportingLoop(asyncio.SelectorEventLoop):
    """An event loop that calls :attr:`after_threadsafe` (when set), on the
    calling thread, once another thread has scheduled a callback on it."""

    after_threadsafe: Callable[[], object] | None = None

    def call_soon_threadsafe(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        handle = super().call_soon_threadsafe(callback, *args, context=context)
        if self.after_threadsafe is not None:
            self.after_threadsafe()
        return handle


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Await ``predicate()`` becoming true (bounded), letting the loop turn."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


class AsyncWorkerTests(WorkerFixtures):
    """Async tasks (``async def``) in the worker on this engine
    (docs/tasks-and-workers.md "Async tasks")."""

    @pytest.fixture
    def url_app(self, alkstore_target: StoreTarget, worker_clock: ManualClock) -> Iterator[App]:
        """An app that opens its own stores from the target's URL (so its
        async store is the engine's native one when it has one), with the
        test's clock. A test closes its async store on its loop
        (``await app.aclose()``); the sync one is closed at teardown."""
        app = App(alkstore_target.url, **{**alkstore_target.options, "clock": worker_clock})
        yield app
        app.close()

    # -- outcomes ------------------------------------------------------------

    def test_async_worker_keeps_an_async_tasks_return_value(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """docs/contract.md §3 "Completed jobs": what the coroutine returned
        is the completed job's result."""
        app = worker_apps(clock=worker_clock)

        @app.task(queue="kept", name="fetch", keep_completed_s=60)
        async def fetch(url: str) -> dict[str, object]:
            await asyncio.sleep(0)
            return {"url": url, "status": 200}

        job_id = fetch.enqueue("https://example.com/")
        assert app.worker(["kept"], handle_signals=False).run(burst=True) == WorkerCounts(
            succeeded=1
        )
        done = app.queue("kept").get_job(job_id)
        assert done is not None
        assert (done.state, done.result) == (
            "completed",
            {"url": "https://example.com/", "status": 200},
        )

    def test_async_worker_each_outcome_reaches_the_store(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """An async task that returns is acked; one that raises is retried
        with the queue's backoff and its traceback; ``Fail`` dead-letters it
        at once; ``Retry(delay=)`` retries it at that delay; a retry at the
        budget dead-letters it with the error that spent it. A coroutine
        function, a partial of one and an object with an async ``__call__``
        are all awaited, beside a sync task in the same run."""
        app = worker_apps(clock=worker_clock)
        ran: list[str] = []

        async def record(token: str) -> None:
            await asyncio.sleep(0)  # it runs on a loop, and yields
            ran.append(token)

        class Recorder:
            async def __call__(self, token: str) -> None:
                await asyncio.sleep(0)
                ran.append(token)

        @app.task(queue=QUEUE, name="a_boom")
        async def a_boom() -> None:
            await asyncio.sleep(0)
            raise ValueError("boom")

        @app.task(queue=QUEUE, name="a_refuse")
        async def a_refuse(message: str) -> None:
            raise Fail(message)

        @app.task(queue=QUEUE, name="a_later")
        async def a_later() -> None:
            raise Retry("not yet", delay=60)

        @app.task(queue=QUEUE, name="s_record")
        def s_record(token: str) -> None:
            ran.append(token)

        a_record = app.task(queue=QUEUE, name="a_record")(record)
        a_partial = app.task(queue=QUEUE, name="a_partial")(functools.partial(record, "partial"))
        a_object = app.task(queue=QUEUE, name="a_object")(Recorder())
        assert all(t.is_async for t in (a_record, a_partial, a_object, a_boom))
        assert not s_record.is_async

        queue = app.queue(QUEUE)
        acked = [
            a_record.enqueue("async"),
            a_partial.enqueue(),
            a_object.enqueue("object"),
            s_record.enqueue("sync"),
        ]
        boomed = a_boom.enqueue()
        refused = a_refuse.enqueue("bad input")
        snoozed = a_later.enqueue()
        exhausted = a_boom.options(max_attempts=1).enqueue()

        counts = app.worker(concurrency=4, handle_signals=False).run(burst=True)

        assert counts == WorkerCounts(succeeded=4, retried=2, dead=2)
        assert sorted(ran) == ["async", "object", "partial", "sync"]
        assert [queue.get_job(job_id) for job_id in acked] == [None] * 4

        retried = queue.get_job(boomed)
        assert retried is not None
        assert (retried.state, retried.attempts) == ("pending", 1)
        assert retried.last_error is not None
        assert retried.last_error.startswith("ValueError: boom\n")
        assert "Traceback (most recent call last)" in retried.last_error
        assert "a_boom" in retried.last_error
        # The default backoff (base 4 s) after attempt 1: 2 to 4 s (docs/contract.md §3).
        assert T0 + timedelta(seconds=2) <= retried.run_at <= T0 + timedelta(seconds=4)

        snoozed_job = queue.get_job(snoozed)
        assert snoozed_job is not None
        assert (snoozed_job.state, snoozed_job.last_error) == ("pending", "not yet")
        assert snoozed_job.run_at == T0 + timedelta(seconds=60)

        dead = queue.get_job(refused)
        assert dead is not None
        assert (dead.state, dead.last_error) == ("dead", "bad input")
        spent = queue.get_job(exhausted)
        assert spent is not None
        assert (spent.state, spent.attempts) == ("dead", 1)
        assert spent.last_error is not None
        assert spent.last_error.startswith(
            "max attempts exceeded; last error: ValueError: boom\n\nTraceback"
        )

    def test_async_worker_an_exception_is_retried_then_dead_at_max_attempts(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """An async task that keeps raising is retried with backoff, and its
        last attempt dead-letters it, ``last_error`` keeping the error that
        spent it; an unknown task is dead at once, as for sync tasks."""
        app = worker_apps(clock=worker_clock)
        calls: list[int] = []

        @app.task(queue=QUEUE, name="down")
        async def down() -> None:
            calls.append(len(calls))
            raise ConnectionError(f"down {len(calls)}")

        queue = app.queue(QUEUE)
        job_id = down.options(max_attempts=2).enqueue()
        unknown = queue.enqueue({"task": "no-such-task"})
        first = app.worker(handle_signals=False).run(burst=True)
        assert first == WorkerCounts(retried=1, dead=1)
        retried = queue.get_job(job_id)
        assert retried is not None
        assert (retried.state, retried.attempts) == ("pending", 1)
        assert retried.last_error is not None
        assert retried.last_error.startswith("ConnectionError: down 1\n")
        gone = queue.get_job(unknown)
        assert gone is not None
        assert gone.state == "dead"
        assert gone.last_error is not None
        assert gone.last_error.startswith("unknown task 'no-such-task'")

        worker_clock.advance(4)  # the backoff's longest first delay
        second = app.worker(handle_signals=False).run(burst=True)
        assert second == WorkerCounts(dead=1)
        dead = queue.get_job(job_id)
        assert dead is not None
        assert (dead.state, dead.attempts) == ("dead", 2)
        assert dead.last_error is not None
        assert dead.last_error.startswith(
            "max attempts exceeded; last error: ConnectionError: down 2\n\nTraceback"
        )
        assert calls == [0, 1]

    # -- slots -----------------------------------------------------------------

    def test_async_worker_concurrency_counts_coroutines(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """``concurrency=50`` runs 50 async jobs at once, each on the
        worker's event loop, on a barrier that only all 50 together pass,
        and starts no handler thread for them (the outcome of each is
        recorded off the loop)."""
        app = worker_apps(clock=worker_clock)
        n = 50
        barriers: list[asyncio.Barrier] = []
        loops: set[int] = set()
        threads_at_the_barrier: list[list[str]] = []

        @app.task(queue=QUEUE, name="meet")
        async def meet(i: int) -> None:
            loops.add(id(asyncio.get_running_loop()))
            if not barriers:
                barriers.append(asyncio.Barrier(n))
            if await asyncio.wait_for(barriers[0].wait(), BARRIER_WAIT_S) == 0:
                threads_at_the_barrier.append([t.name for t in threading.enumerate()])

        meet.enqueue_many([(i,) for i in range(n)])
        counts = app.worker(concurrency=n, handle_signals=False).run(burst=True)

        assert counts == WorkerCounts(succeeded=n)
        assert len(loops) == 1
        assert len(threads_at_the_barrier) == 1
        handler_threads = [t for t in threads_at_the_barrier[0] if t.startswith("alkstore-job")]
        assert handler_threads == []
        assert tuple(app.queue(QUEUE).stats()) == (0, 0, 0, 0)

    def test_async_worker_sync_and_async_jobs_share_the_slots(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """One worker runs sync jobs on threads and async ones as coroutines
        at once, ``concurrency`` counting both: with 4 slots, two of each
        kind hold them all and a fifth job waits unclaimed."""
        app = worker_apps(clock=worker_clock)
        gate = threading.Event()
        started: list[str] = []

        @app.task(queue=QUEUE, name="s_held")
        def s_held(token: str) -> None:
            started.append(token)
            assert gate.wait(WAIT_S)

        @app.task(queue=QUEUE, name="a_held")
        async def a_held(token: str) -> None:
            started.append(token)
            assert await asyncio.to_thread(gate.wait, WAIT_S)

        queue = app.queue(QUEUE)
        s_held.enqueue("s1")
        a_held.enqueue("a1")
        s_held.enqueue("s2")
        a_held.enqueue("a2")
        fifth = app.tasks["record"].enqueue(worker_log_dir, "fifth")
        running = RunningWorker(app.worker(concurrency=4, handle_signals=False))
        try:
            wait_until(lambda: len(started) == 4, "the four held jobs to start")
            assert sorted(started) == ["a1", "a2", "s1", "s2"]
            assert running.worker.running == 4
            waiting = queue.get_job(fifth)
            assert waiting is not None
            assert (waiting.state, waiting.attempts) == ("pending", 0)
            gate.set()
            wait_until(lambda: executions(worker_log_dir) == {"fifth": 1}, "the fifth job")
            wait_until(lambda: running.worker.counts.succeeded == 5, "the five acks")
        finally:
            gate.set()
            counts = running.finish()
        assert counts == WorkerCounts(succeeded=5)

    # -- heartbeats and stopping ---------------------------------------------------

    def test_async_worker_heartbeats_keep_a_long_async_job_claimed(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """An async job whose run takes 1.4 s of the store's clock, past its
        0.6 s visibility timeout, is never handed to another worker: the
        worker heartbeats it (every 0.2 s of real time). The store's clock
        moves only here, each step after the heartbeats landed, so a slow
        host cannot lapse the claim."""
        app = worker_apps(clock=worker_clock)
        gate = threading.Event()
        vt = 0.6

        @app.task(queue="long", name="long", visibility_timeout_s=vt)
        async def long() -> None:
            assert await asyncio.to_thread(gate.wait, WAIT_S)

        queue = app.queue("long")
        job_id = long.enqueue()

        def deadline() -> datetime | None:
            job = queue.get_job(job_id)
            return None if job is None else job.claim_deadline

        def renewed_since(instant: datetime) -> bool:
            current = deadline()
            return current is not None and current >= instant + timedelta(seconds=vt)

        running = RunningWorker(app.worker(["long"], poll_interval_s=0.05, handle_signals=False))
        try:
            wait_until(lambda: deadline() is not None, "the job to be claimed")
            for _ in range(4):  # 4 x 0.35 s: past the first deadline, each step inside one
                now = worker_clock.advance(0.35)
                wait_until(lambda: renewed_since(now), "a heartbeat to renew the claim")  # noqa: B023
                assert queue.claim_one("thief") is None
            assert worker_clock() == T0 + timedelta(seconds=1.4)
            gate.set()
            wait_until(lambda: queue.get_job(job_id) is None, "the job to be acked")
        finally:
            gate.set()
            counts = running.finish()
        assert counts == WorkerCounts(succeeded=1)

    # -- the job context (docs/tasks-and-workers.md "Job context") ---------------

    def test_async_worker_the_context_heartbeats_and_sees_a_cancel_at_once(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """An async task with ``takes_context=True`` gets its claimed job;
        ``await context.aheartbeat(extend)`` sets the claim's deadline to the
        store's now plus ``extend`` without blocking the loop; after
        ``Queue.cancel`` from another thread, ``aheartbeat()`` is refused and
        ``context.cancelled`` is set at once; the outcome is ``cancelled``.
        Enqueueing checks the arguments less the context."""
        app = worker_apps(clock=worker_clock)
        go, beaten = threading.Event(), threading.Event()
        seen: dict[str, Any] = {}

        @app.task(queue=QUEUE, name="a_ctx", takes_context=True)
        async def a_ctx(context: JobContext, token: str) -> None:
            seen["job"], seen["token"] = context.job, token
            for step in ("extended", "after_cancel"):
                assert await asyncio.to_thread(go.wait, WAIT_S)
                go.clear()
                beat = await context.aheartbeat(120 if step == "extended" else None)
                seen[step] = (beat, context.cancelled, context.lost)
                beaten.set()

        queue = app.queue(QUEUE)
        with pytest.raises(ValidationError, match=r"task 'a_ctx' cannot be called .*'token'"):
            a_ctx.enqueue()  # type: ignore[call-arg]
        job_id = a_ctx.enqueue("t")
        running = RunningWorker(app.worker(poll_interval_s=0.05, handle_signals=False))
        try:
            wait_until(lambda: "job" in seen, "the job to start")
            assert (seen["job"].id, seen["job"].attempts, seen["token"]) == (job_id, 1, "t")
            worker_clock.advance(10)
            go.set()
            assert beaten.wait(WAIT_S)
            beaten.clear()
            found = queue.get_job(job_id)
            assert found is not None
            assert found.claim_deadline == T0 + timedelta(seconds=130)
            assert queue.cancel(job_id)
            go.set()
            assert beaten.wait(WAIT_S)
            wait_until(lambda: running.worker.counts.total, "the job to end")
        finally:
            go.set()
            counts = running.finish()
        assert seen["extended"] == (True, False, False)
        assert seen["after_cancel"] == (False, True, False)
        assert counts == WorkerCounts(cancelled=1)

    def test_async_worker_a_coroutine_polling_the_context_sees_its_cancel(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """A coroutine polling ``context.cancelled`` sees ``Queue.cancel``
        (from another thread) within a heartbeat interval (1 s here, for a
        3 s visibility timeout), before the claim would lapse; counted
        ``cancelled``."""
        app = worker_apps(clock=worker_clock)
        started_now = threading.Event()
        seen: list[tuple[float, bool]] = []

        @app.task(queue="poll", name="a_polling", takes_context=True, visibility_timeout_s=3)
        async def a_polling(context: JobContext) -> None:
            started_now.set()
            deadline = time.monotonic() + WAIT_S
            while not context.cancelled:
                assert time.monotonic() < deadline, "the cancel was never seen"
                await asyncio.sleep(0.02)
            seen.append((time.monotonic(), context.lost))

        queue = app.queue("poll")
        job_id = a_polling.enqueue()
        running = RunningWorker(app.worker(["poll"], poll_interval_s=0.05, handle_signals=False))
        try:
            assert started_now.wait(WAIT_S)
            cancelled_at = time.monotonic()
            assert queue.cancel(job_id)
            wait_until(lambda: running.worker.counts.total, "the coroutine to see the cancel")
        finally:
            counts = running.finish()
        [(seen_at, lost)] = seen
        assert not lost
        assert seen_at - cancelled_at < 3.0  # before the claim would have lapsed
        assert counts == WorkerCounts(cancelled=1)

    def test_async_worker_a_coroutine_past_the_grace_period_is_cancelled_and_lapses(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """At the end of the grace period, a coroutine still running is
        cancelled (a thread cannot be, a task can): its job is neither acked
        nor retried, even when the coroutine swallows the cancellation and
        returns; it is left claimed, frees its slot, and is reclaimed once
        its claim lapses (at-least-once)."""
        app = worker_apps(clock=worker_clock)
        ends: list[str] = []
        done: list[str] = []
        began: list[str] = []

        @app.task(queue=QUEUE, name="stuck")
        async def stuck(label: str) -> None:
            if ends:  # the rerun, after the reclaim
                done.append(label)
                return
            began.append(label)
            try:
                await asyncio.Event().wait()  # never set
            except asyncio.CancelledError:
                ends.append(f"{label} cancelled")
                if label == "polite":
                    raise
                # "stubborn" swallows the cancellation and returns.

        queue = app.queue(QUEUE)
        ids = stuck.enqueue_many([("polite",), ("stubborn",)])
        worker = app.worker(concurrency=2, grace_period_s=0.2, handle_signals=False)
        first = RunningWorker(worker)
        # Both coroutines running, not only their slots taken (a job handed
        # to the loop but not started yet is never started after a stop).
        wait_until(lambda: len(began) == 2, "both jobs' coroutines to start")
        assert first.finish(timeout_s=WAIT_S).total == 0
        assert sorted(ends) == ["polite cancelled", "stubborn cancelled"]
        wait_until(lambda: worker.running == 0, "the cancelled coroutines to free their slots")
        assert worker.counts.total == 0
        for job_id in ids:
            left = queue.get_job(job_id)
            assert left is not None
            assert (left.state, left.attempts, left.last_error) == ("processing", 1, None)

        worker_clock.advance(30)  # the claims lapse
        again = app.worker(concurrency=2, handle_signals=False).run(burst=True)
        assert again == WorkerCounts(succeeded=2)
        assert sorted(done) == ["polite", "stubborn"]
        assert [queue.get_job(job_id) for job_id in ids] == [None, None]

    def test_async_worker_at_the_end_of_the_grace_period_no_handed_job_starts(
        self,
        worker_apps: AppFactory,
        worker_clock: ManualClock,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """At the end of the grace period every job handed to the event
        loop is either started, and its coroutine cancelled, or never
        started: none starts afterwards, to run on unheartbeaten. Here a
        coroutine holds the loop (a blocking call) while a batch of 200
        jobs, several of the loop's start steps, is claimed and handed to
        it, and the grace period (0 s) ends before the loop is free again:
        the coroutines running are cancelled, the batch's jobs never start;
        none is counted, all are left claimed, and each runs once after its
        claim lapses."""
        app = worker_apps(clock=worker_clock)
        early, late = [f"early-{i}" for i in range(5)], [f"late-{i}" for i in range(200)]
        holding, release, second_round = threading.Event(), threading.Event(), threading.Event()
        started: list[str] = []
        cancelled: list[str] = []
        rerun: list[str] = []

        async def park(label: str) -> None:
            started.append(label)
            try:
                await asyncio.Event().wait()  # never set
            except asyncio.CancelledError:
                cancelled.append(label)
                raise

        @app.task(queue=QUEUE, name="parked")
        async def parked(label: str) -> None:
            if second_round.is_set():  # the rerun, after the claims lapsed
                rerun.append(label)
                return
            await park(label)

        @app.task(queue=QUEUE, name="hog")
        async def hog() -> None:
            if second_round.is_set():
                rerun.append("hog")
                return
            holding.set()
            release.wait(WAIT_S)  # holds the loop, as a blocking call in a handler does
            await park("hog")

        ids = parked.enqueue_many([(label,) for label in early])
        ids.append(hog.enqueue())
        worker = app.worker(
            concurrency=len(early) + 1 + len(late), grace_period_s=0, poll_interval_s=0.05
        )

        def control(loop: _ReportingLoop) -> None:
            wait_until(lambda: holding.is_set() and len(started) == len(early), "the hog")
            ids.extend(parked.enqueue_many([(label,) for label in late]))
            wait_until(lambda: worker.running == len(ids), "the batch's claim, handed over")
            # The first thing a thread schedules on the loop from now on is
            # the worker's cancellation: the hog lets the loop go then.
            loop.after_threadsafe = release.set
            worker.stop()

        async def main() -> WorkerCounts:
            loop = asyncio.get_running_loop()
            assert isinstance(loop, _ReportingLoop)
            threading.Thread(target=control, args=(loop,), daemon=True).start()
            counts = await worker.run_async()
            await until(lambda: worker.running == 0, "every job to be left to lapse")
            return counts

        with (
            caplog.at_level(logging.WARNING, logger="alkstore.worker"),
            asyncio.Runner(loop_factory=_ReportingLoop) as runner,
        ):
            counts = runner.run(main())
        assert counts == WorkerCounts()
        assert sorted(started) == sorted([*early, "hog"])  # none of the batch's
        assert sorted(cancelled) == sorted(started)
        assert (
            f"cancelled {len(early) + 1} coroutine(s) still running and did not start "
            f"{len(late)} async job(s)"
        ) in caplog.text
        queue = app.queue(QUEUE)
        for job_id in ids:
            left = queue.get_job(job_id)
            assert left is not None
            assert (left.state, left.attempts) == ("processing", 1)

        worker_clock.advance(31)  # the claims lapse
        second_round.set()
        again = app.worker(concurrency=16, handle_signals=False).run(burst=True)
        assert again == WorkerCounts(succeeded=len(ids))
        assert sorted(rerun) == sorted([*early, *late, "hog"])

    def test_async_worker_cancelling_run_async_stops_gracefully(
        self, worker_apps: AppFactory, worker_clock: ManualClock, worker_log_dir: str
    ) -> None:
        """``run_async`` runs the handlers on the caller's loop. Cancelling
        the task that awaits it stops the worker as ``stop()`` does: the
        running job finishes and is acked before the ``CancelledError``
        reaches the caller, and a job not yet claimed stays pending."""
        app = worker_apps(clock=worker_clock)
        queue = app.queue(QUEUE)
        waiting_id = -1
        running_id = -1
        caller_loop: list[asyncio.AbstractEventLoop] = []

        async def main() -> None:
            nonlocal waiting_id, running_id
            gate = asyncio.Event()
            started = asyncio.Event()

            @app.task(queue=QUEUE, name="held")
            async def held() -> None:
                caller_loop.append(asyncio.get_running_loop())
                started.set()
                await gate.wait()

            running_id = await held.aenqueue()
            waiting_id = await app.tasks["record"].aenqueue(worker_log_dir, "waiting")
            worker = app.worker(concurrency=1, poll_interval_s=0.05)
            run = asyncio.create_task(worker.run_async())
            await asyncio.wait_for(started.wait(), WAIT_S)
            run.cancel()
            await asyncio.sleep(0)  # run_async sees its cancellation: stop()
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(run, WAIT_S)
            assert worker.counts == WorkerCounts(succeeded=1)
            assert caller_loop == [asyncio.get_running_loop()]

        asyncio.run(main())
        assert queue.get_job(running_id) is None  # acked before run_async re-raised
        waiting = queue.get_job(waiting_id)
        assert waiting is not None
        assert (waiting.state, waiting.attempts) == ("pending", 0)
        assert executions(worker_log_dir) == {}

    # -- enqueueing from async code ------------------------------------------

    def test_async_worker_aenqueue_refuses_what_enqueue_refuses(self, url_app: App) -> None:
        """``aenqueue``, ``aenqueue_many`` (and ``aenqueue_tx``, which shares
        their checks) raise the very ``ValidationError`` the sync calls
        raise, before anything is stored, and store what they store."""

        @url_app.task(queue=QUEUE, name="typed")
        async def typed(a: int, *, b: str = "x") -> None:
            pass

        bad_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            ((), {}),
            ((1, 2), {}),
            ((1,), {"dealy": 60}),
            ((1,), {"c": 1}),
            ((float("nan"),), {}),
            (((1, 2),), {}),
            ((b"bytes",), {}),
            ((1,), {"b": object()}),
        ]
        bad_batches: list[Any] = [
            "not a list",
            {"a": 1},
            [1],
            [(1,), (1, 2)],
            [(float("inf"),)],
            [(1,), ((1, 2),)],
        ]

        def sync_refusal(call: Any, *args: Any, **kwargs: Any) -> str:
            with pytest.raises(ValidationError) as refused:
                call(*args, **kwargs)
            return str(refused.value)

        async def async_refusal(call: Any, *args: Any, **kwargs: Any) -> str:
            with pytest.raises(ValidationError) as refused:
                await call(*args, **kwargs)
            return str(refused.value)

        expected = [sync_refusal(typed.enqueue, *args, **kwargs) for args, kwargs in bad_calls]
        expected += [sync_refusal(typed.enqueue_many, calls) for calls in bad_batches]
        sync_ids = [typed.enqueue(1, b="y"), *typed.enqueue_many([(2,), (3,)])]

        async def main() -> tuple[list[str], list[int]]:
            got = [await async_refusal(typed.aenqueue, *a, **kw) for a, kw in bad_calls]
            got += [await async_refusal(typed.aenqueue_many, calls) for calls in bad_batches]
            ids = [await typed.aenqueue(1, b="y"), *await typed.aenqueue_many([(2,), (3,)])]
            await url_app.aclose()
            return got, ids

        got, async_ids = asyncio.run(main())
        assert got == expected
        assert "unexpected keyword argument 'dealy'" in expected[2]
        assert "task.options(delay=...)" in expected[2]
        queue = url_app.queue(QUEUE)  # the app's store, opened again after aclose()
        assert tuple(queue.stats()) == (6, 0, 0, 0)  # the good calls only
        for sync_id, async_id in zip(sync_ids, async_ids, strict=True):
            sync_job, async_job = queue.get_job(sync_id), queue.get_job(async_id)
            assert sync_job is not None
            assert async_job is not None
            assert async_job.payload == sync_job.payload
            assert (async_job.run_at, async_job.max_attempts) == (
                sync_job.run_at,
                sync_job.max_attempts,
            )

    def test_async_worker_run_closes_the_async_store_its_tasks_opened(
        self, url_app: App, caplog: pytest.LogCaptureFixture
    ) -> None:
        """``worker.run()`` (so ``alkstore worker``) runs async tasks on an
        event loop of its own; a task that enqueues the documented way,
        ``await other.aenqueue()``, opens the app's async store there (the
        engine's native one, when it has one). The run closes it before its
        loop ends and leaves the app's sync store open for its owner: no
        warning, the jobs acked, and ``app.close()`` closes the rest."""
        opened: list[AsyncStore] = []
        ran: list[str] = []

        @url_app.task(queue=QUEUE, name="second")
        async def second() -> None:
            ran.append("second")

        @url_app.task(queue=QUEUE, name="first")
        async def first() -> None:
            opened.append(await url_app.astore())
            await second.aenqueue()
            ran.append("first")

        first_id = first.enqueue()
        with caplog.at_level(logging.WARNING):
            counts = url_app.worker(handle_signals=False).run(burst=True)
            sync_store = url_app.store
            open_after_run = not sync_store.closed  # the caller's
            assert url_app.queue(QUEUE).get_job(first_id) is None  # acked
            url_app.close()
        assert counts == WorkerCounts(succeeded=2)
        assert ran == ["first", "second"]
        assert len(opened) == 1
        assert opened[0].closed
        assert (open_after_run, sync_store.closed) == (True, True)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warnings == []

    def test_async_worker_aenqueue_tx_commits_and_rolls_back_with_the_caller(
        self, alkstore_target: StoreTarget, url_app: App, worker_log_dir: str
    ) -> None:
        """``aenqueue_tx`` writes in the caller's transaction, as
        ``enqueue_tx`` does: a rollback leaves no job, a commit one that a
        worker runs; arguments that do not fit are refused with the sync
        call's error, and the transaction is left usable."""
        from alkstore_contract_tests._worker_app import register_tasks

        register_tasks(url_app)
        record = url_app.tasks["record"]
        queue = url_app.queue(QUEUE)

        async def main() -> tuple[int, str]:
            # The connection the async enqueue_tx takes (the harness's
            # async_app_connection: the sync driver's under the thread
            # adapter, the async driver's for a native engine).
            async with self.async_app_connection(alkstore_target) as conn:
                await self.begin_async(conn)
                rolled_back = await record.aenqueue_tx(conn, worker_log_dir, "rolled-back")
                await resolved(conn.rollback())
                # Checked now: an engine may hand the rolled-back id out again.
                assert queue.get_job(rolled_back) is None
                assert tuple(queue.stats()) == (0, 0, 0, 0)
                await self.begin_async(conn)
                with pytest.raises(ValidationError) as refused:
                    await record.aenqueue_tx(conn, worker_log_dir, token=b"x")
                committed = await record.aenqueue_tx(conn, worker_log_dir, "committed")
                await resolved(conn.commit())
            await url_app.aclose()
            return committed, str(refused.value)

        committed, refusal = asyncio.run(main())
        with self.app_connection(alkstore_target) as conn:
            self.begin(conn)
            with pytest.raises(ValidationError) as sync_refused:
                record.enqueue_tx(conn, worker_log_dir, token=b"x")
            conn.rollback()
        assert refusal == str(sync_refused.value)
        assert url_app.queue(QUEUE).get_job(committed) is not None
        url_app.worker(handle_signals=False).run(burst=True)
        assert executions(worker_log_dir) == {"committed": 1}

    # -- relays ------------------------------------------------------------------

    def test_async_worker_a_relay_awaits_an_async_send_on_the_workers_loop(
        self, worker_apps: AppFactory, worker_clock: ManualClock
    ) -> None:
        """A relay whose ``send`` is ``async def`` runs it on the worker's
        event loop; its message stays claimed while the coroutine runs, is
        acked once it returned, and is retried when it raised."""
        app = worker_apps(clock=worker_clock)
        gate = threading.Event()
        seen: list[tuple[Any, str]] = []

        @app.relay("outbox.async", max_attempts=3)
        async def publish(message: Any) -> None:
            seen.append((message, threading.current_thread().name))
            if message == "down":
                raise ConnectionError("down")
            assert await asyncio.to_thread(gate.wait, WAIT_S)

        q = app.outbox("outbox.async").queue
        ok, down = q.enqueue_many(["ok", "down"])
        worker = app.worker(poll_interval_s=0.05, handle_signals=False)
        running = RunningWorker(worker)
        try:
            wait_until(lambda: seen, "the relay to send")
            held = q.get_job(ok)
            assert held is not None
            assert held.state == "processing"  # not acked while its send runs
            gate.set()
            wait_until(lambda: q.get_job(ok) is None, "the delivered message's ack")
            wait_until(lambda: len(seen) == 2, "the second send")
        finally:
            gate.set()
            counts = running.finish()
        assert counts.relayed == 1
        assert [message for message, _ in seen] == ["ok", "down"]
        assert all(thread.startswith("alkstore-loop-") for _, thread in seen)
        retried = q.get_job(down)
        assert retried is not None
        assert (retried.state, retried.attempts) == ("pending", 1)
        assert retried.last_error is not None
        assert retried.last_error.startswith("ConnectionError: down\n")
