"""Async tasks in the worker, its event loop and ``run_async``, and the
app's async store, on a real SQLite file with real threads and loops
(docs/tasks-and-workers.md "Async tasks", docs/async.md "Tasks and
workers"). The rules every engine keeps are the contract's
``AsyncWorkerTests`` and ``AsyncRuntimeTests``."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import alkstore
from alkstore import App, AsyncStore, Store, ValidationError, WorkerCounts
from alkstore.contract.threaded import ThreadedAsyncStore, ThreadedAsyncSubscription
from alkstore.logic.callbacks import NotRunError, call_async, handler_kind
from alkstore.runtime.pool import DaemonPool
from alkstore_contract_tests import T0, ManualClock

WAIT_S = 30.0


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'async-worker.db'}"


@pytest.fixture
def app(url: str) -> Iterator[App]:
    with App(url, clock=ManualClock(T0)) as made:
        yield made


def wait_until(predicate: Any, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


async def until(predicate: Any, what: str, timeout_s: float = WAIT_S) -> None:
    """Await ``predicate()`` becoming true, letting the loop turn."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


# -- the rule: what is awaited, what is refused -------------------------------


def test_the_kind_of_a_handler_is_decided_where_it_is_given() -> None:
    async def coroutine_function(x: int) -> int:
        return x

    class AsyncCallable:
        async def __call__(self, x: int) -> int:
            return x

    def plain(x: int) -> int:
        return x

    def generator() -> Any:
        yield 1

    async def async_generator() -> Any:
        yield 1

    assert handler_kind(coroutine_function, "a task") == "async"
    assert handler_kind(functools.partial(coroutine_function, 1), "a task") == "async"
    assert handler_kind(AsyncCallable(), "a task") == "async"
    assert handler_kind(plain, "a task") == "sync"
    assert handler_kind(print, "a task") == "sync"
    for refused, kind in ((generator, "a generator"), (async_generator, "an async generator")):
        with pytest.raises(ValidationError, match=f"a task must be .* is {kind} function"):
            handler_kind(refused, "a task")


def test_call_async_awaits_once_and_refuses_what_is_left() -> None:
    async def inner() -> str:
        return "inner ran"

    async def returns_a_coroutine() -> Any:
        return inner()

    async def returns_a_value() -> str:
        return "ran"

    assert asyncio.run(call_async(returns_a_value, "a task", [], {})) == "ran"
    with pytest.raises(NotRunError, match="await the coroutine inside it"):
        asyncio.run(call_async(returns_a_coroutine, "a task", [], {}))


# -- slots, threads and the loop -----------------------------------------------


@pytest.mark.parametrize("n", [50, 150])
def test_fifty_async_jobs_run_at_once_on_a_handful_of_threads(app: App, n: int) -> None:
    """``concurrency`` counts coroutines: 50 async jobs are in flight at
    once (a barrier only all 50 pass) while the process runs a handful of
    threads, none of them a handler thread. With 150, the claim's batch is
    started over three steps of the loop, all of it."""
    barriers: list[asyncio.Barrier] = []
    seen: list[list[str]] = []

    @app.task(queue="q", name="meet")
    async def meet(i: int) -> None:
        if not barriers:
            barriers.append(asyncio.Barrier(n))
        if await asyncio.wait_for(barriers[0].wait(), 10) == 0:
            seen.append([t.name for t in threading.enumerate()])

    meet.enqueue_many([(i,) for i in range(n)])
    before = threading.active_count()
    worker = app.worker(concurrency=n, handle_signals=False)
    result: list[WorkerCounts] = []
    run = threading.Thread(target=lambda: result.append(worker.run(burst=True)), daemon=True)
    run.start()
    run.join(WAIT_S)
    assert result == [WorkerCounts(succeeded=n)]
    before += 1  # the thread running the worker
    names = seen[0]
    started = len(names) - before
    # The heartbeat, completer, loop and outcome threads (a burst run has no
    # listener): 4 for 50 or 150 jobs.
    assert started <= 6, names
    assert not [name for name in names if name.startswith("alkstore-job")]
    assert [name for name in names if name.startswith("alkstore-loop-")]
    # run() stopped the loop it owned, and its thread, before it returned.
    assert not [t for t in threading.enumerate() if t.name.startswith("alkstore-loop-")]


def test_the_pool_starts_a_thread_only_when_every_thread_is_busy() -> None:
    pool = DaemonPool(4, "pool-test")
    done = threading.Event()
    ran: list[int] = []
    try:
        for i in range(3):
            pool.submit(functools.partial(ran.append, i))
            wait_until(lambda i=i: len(ran) == i + 1, "the call to run")  # type: ignore[misc]
        assert pool.threads == 1  # each call found the one thread idle
        gate = threading.Event()
        for _ in range(6):
            pool.submit(lambda: gate.wait(WAIT_S))
        assert pool.threads == 4  # busy: started up to the size, no more
        gate.set()
        pool.submit(done.set)
        assert done.wait(WAIT_S)
    finally:
        pool.shutdown()


def test_a_task_registered_while_the_worker_runs_is_awaited_too(app: App) -> None:
    """An async task registered after ``run()`` started (the worker learns
    it at its first job) still runs on the worker's loop and is acked."""
    app.task(queue="q", name="first")(print)
    worker = app.worker(poll_interval_s=0.05, handle_signals=False)
    ran: list[str] = []
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:

        @app.task(queue="q", name="late")
        async def late() -> None:
            ran.append(threading.current_thread().name)

        job_id = late.enqueue()
        wait_until(lambda: app.queue("q").get_job(job_id) is None, "the late job's ack")
    finally:
        worker.stop()
        thread.join(WAIT_S)
    assert len(ran) == 1
    assert ran[0].startswith("alkstore-loop-")
    assert worker.counts == WorkerCounts(succeeded=1)


def test_a_bug_around_an_async_job_frees_its_slot_and_leaves_it_to_lapse(
    app: App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """W13 for coroutines: a failure of the worker itself around an async
    job, on the loop or on the outcome thread, is logged and counted
    ``lost``; the slot is freed (the burst run returns) and the job is left
    claimed, to lapse and be reclaimed."""
    from alkstore.runtime.worker import Worker

    @app.task(queue="q", name="fine")
    async def fine() -> None:
        pass

    job_ids = fine.enqueue_many([(), ()])
    real_resolve, real_conclude = Worker._resolve, Worker._conclude
    calls: list[str] = []

    def resolve(self: Worker, handle: Any) -> Any:
        if handle.id == job_ids[0]:
            calls.append("resolve")
            raise RuntimeError("a bug on the loop")
        return real_resolve(self, handle)

    def conclude(self: Worker, handle: Any, *args: Any, **kwargs: Any) -> Any:
        if handle.id == job_ids[1]:
            calls.append("conclude")
            raise RuntimeError("a bug on the outcome thread")
        return real_conclude(self, handle, *args, **kwargs)

    monkeypatch.setattr(Worker, "_resolve", resolve)
    monkeypatch.setattr(Worker, "_conclude", conclude)
    worker = app.worker(concurrency=2, handle_signals=False)
    result: list[WorkerCounts] = []
    with caplog.at_level(logging.ERROR, logger="alkstore.worker"):
        run = threading.Thread(target=lambda: result.append(worker.run(burst=True)), daemon=True)
        run.start()
        run.join(WAIT_S)  # a leaked slot would keep the burst run going
    assert result == [WorkerCounts(lost=2)]
    assert sorted(calls) == ["conclude", "resolve"]
    assert worker.running == 0
    assert caplog.text.count("failed inside the worker; its claim is left to lapse") == 2
    for job_id in job_ids:
        left = app.queue("q").get_job(job_id)
        assert left is not None
        assert (left.state, left.attempts) == ("processing", 1)


# -- run_async inside a serving loop ------------------------------------------


def test_run_inside_a_running_loop_is_refused_and_run_async_still_runs(app: App) -> None:
    """``Worker.run()`` would block a running loop until the worker stops:
    refused as ``asyncio.run`` refuses, naming ``run_async``, before the
    worker counts as run."""
    ran: list[int] = []

    @app.task(queue="q", name="note")
    async def note(n: int) -> None:
        ran.append(n)

    note.enqueue(1)

    async def main() -> WorkerCounts:
        worker = app.worker(queues=["q"], handle_signals=False)
        with pytest.raises(RuntimeError, match=r"await worker\.run_async\(\)"):
            worker.run(burst=True)
        return await worker.run_async(burst=True)

    assert asyncio.run(main()) == WorkerCounts(succeeded=1)
    assert ran == [1]


class SlowSteps(logging.Handler):
    """Collects asyncio's debug-mode warnings of slow loop steps taken by
    the worker: its job tasks and its callbacks."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.steps: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing") and ("alkstore-job-" in message or "Worker." in message):
            self.steps.append(message)


class OutcomeThreads(logging.Handler):
    """The threads the worker's outcome records are logged from."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.threads: set[int] = set()
        self.records = 0

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "outcome"):
            self.threads.add(record.thread or 0)
            self.records += 1


def test_run_async_never_blocks_the_loop_that_keeps_serving(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While ``run_async`` drains 300 jobs (async and sync, succeeding and
    dead) in the caller's loop, that loop keeps serving other work: no
    database statement runs and no outcome is logged on the loop's thread,
    and no step the worker puts on the loop (its callbacks, its jobs'
    tasks) takes more than 5 ms (asyncio's debug mode,
    ``slow_callback_duration=0.005``).

    On a loaded host the scheduler alone can hold any thread past 5 ms
    (steps that do nothing, a task's first line, were seen at 6 ms), so the
    timing is judged over up to four drains: a step the worker makes slow is
    slow in every drain, one the host's scheduler makes slow is not. The
    switch interval is lowered to 1 ms so that a step is not charged the
    5 ms a worker thread may keep the GIL by default; the test's own
    serving task is not judged."""
    from alkstore_sqlite._connection import ConnectionPool

    statement_threads: set[int] = set()

    def spied(method: Any) -> Any:
        @functools.wraps(method)
        def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
            statement_threads.add(threading.get_ident())
            return method(self, *args, **kwargs)

        return spy

    @app.task(queue="q", name="a_ok")
    async def a_ok(i: int) -> None:
        await asyncio.sleep(0)

    @app.task(queue="q", name="a_bad")
    async def a_bad(i: int) -> None:
        raise RuntimeError(f"bad {i}")

    @app.task(queue="q", name="s_ok")
    def s_ok(i: int) -> None:
        pass

    async def serve(stop: asyncio.Event, served: list[float]) -> None:
        while not stop.is_set():
            served.append(time.monotonic())
            await asyncio.sleep(0.001)

    async def drain() -> tuple[WorkerCounts, int, int]:
        loop = asyncio.get_running_loop()
        loop.slow_callback_duration = 0.005
        stop, served = asyncio.Event(), []
        server = asyncio.create_task(serve(stop, served))
        counts = await app.worker(concurrency=16).run_async(burst=True)
        stop.set()
        await server
        return counts, threading.get_ident(), len(served)

    for name in ("run", "transaction", "run_refusing_own_locks"):
        monkeypatch.setattr(ConnectionPool, name, spied(getattr(ConnectionPool, name)))
    asyncio_log, worker_log = logging.getLogger("asyncio"), logging.getLogger("alkstore.worker")
    level = worker_log.level
    worker_log.setLevel(logging.INFO)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    slow_by_drain: list[list[str]] = []
    try:
        while len(slow_by_drain) < 4:
            a_ok.enqueue_many([(i,) for i in range(200)])
            a_bad.options(max_attempts=1).enqueue_many([(i,) for i in range(50)])
            s_ok.enqueue_many([(i,) for i in range(50)])
            statement_threads.clear()
            slow, outcomes = SlowSteps(), OutcomeThreads()
            asyncio_log.addHandler(slow)
            worker_log.addHandler(outcomes)
            try:
                counts, loop_thread, served = asyncio.run(drain(), debug=True)
            finally:
                worker_log.removeHandler(outcomes)
                asyncio_log.removeHandler(slow)
            assert counts == WorkerCounts(succeeded=250, dead=50)
            assert statement_threads  # the spy saw the worker's statements ...
            assert loop_thread not in statement_threads  # ... none of them on the loop
            assert outcomes.records == 300
            assert loop_thread not in outcomes.threads
            assert served > 20  # it kept serving while the worker drained
            slow_by_drain.append(slow.steps)
            if not slow.steps:
                break
    finally:
        sys.setswitchinterval(switch)
        worker_log.setLevel(level)
    assert [] in slow_by_drain, slow_by_drain


def test_cancelling_run_async_twice_ends_the_grace_period(app: App) -> None:
    """A second cancellation, as a second signal, leaves a job still
    running to lapse at once instead of waiting out the grace period; its
    coroutine is cancelled."""
    ends: list[str] = []
    began: list[str] = []

    @app.task(queue="q", name="stuck")
    async def stuck() -> None:
        began.append("began")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ends.append("cancelled")
            raise

    job_id = stuck.enqueue()

    async def main() -> float:
        worker = app.worker(grace_period_s=WAIT_S, poll_interval_s=0.05)
        run = asyncio.create_task(worker.run_async())
        # Its coroutine running, not only its slot taken (a job handed to
        # the loop but not started yet is never started after a stop).
        await until(lambda: bool(began), "the job's coroutine to start")
        started = time.monotonic()
        run.cancel()
        await asyncio.sleep(0)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(run, WAIT_S)
        return time.monotonic() - started

    assert asyncio.run(main()) < WAIT_S / 2
    assert ends == ["cancelled"]
    left = app.queue("q").get_job(job_id)
    assert left is not None
    assert (left.state, left.attempts) == ("processing", 1)


def test_run_async_installs_signal_handlers_only_when_asked(app: App) -> None:
    """By default ``run_async`` leaves the process's signals to the
    application; with ``handle_signals=True`` a SIGTERM stops it as it
    stops ``run()``, and the previous handlers come back."""
    app.task(queue="q")(print)
    before = signal.getsignal(signal.SIGTERM)

    async def main() -> list[Any]:
        seen = []
        worker = app.worker(poll_interval_s=0.05)
        run = asyncio.create_task(worker.run_async())
        await asyncio.sleep(0)  # run_async has entered its body
        seen.append(signal.getsignal(signal.SIGTERM) is before)
        worker.stop()
        seen.append(await asyncio.wait_for(run, WAIT_S))
        asked = app.worker(poll_interval_s=0.05, handle_signals=True)
        run = asyncio.create_task(asked.run_async())
        await asyncio.sleep(0)
        seen.append(signal.getsignal(signal.SIGTERM) is before)
        signal.raise_signal(signal.SIGTERM)
        seen.append(await asyncio.wait_for(run, WAIT_S))
        return seen

    assert asyncio.run(main()) == [True, WorkerCounts(), False, WorkerCounts()]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_relay_with_an_async_send_runs_on_the_callers_loop_in_run_async(app: App) -> None:
    sent: list[tuple[Any, bool]] = []

    async def main() -> WorkerCounts:
        loop = asyncio.get_running_loop()

        @app.relay("outbox.x")
        async def publish(message: Any) -> None:
            sent.append((message, asyncio.get_running_loop() is loop))

        outbox = app.outbox("outbox.x")
        outbox.queue.enqueue("m")
        worker = app.worker(poll_interval_s=0.05)
        run = asyncio.create_task(worker.run_async())
        await until(lambda: outbox.queue.get_job(1) is None, "the message's ack")
        worker.stop()
        return await asyncio.wait_for(run, WAIT_S)

    assert asyncio.run(main()).relayed == 1
    assert sent == [("m", True)]


# -- the app's async store ------------------------------------------------------


def test_the_async_store_opens_once_for_many_coroutines_threads_and_loops(url: str) -> None:
    app = App(url)
    stores: list[AsyncStore] = []
    lock = threading.Lock()

    async def ask() -> None:
        stores_here = await asyncio.gather(*(app.astore() for _ in range(20)))
        with lock:
            stores.extend(stores_here)

    threads = [threading.Thread(target=asyncio.run, args=(ask(),)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert len(stores) == 80
    assert len({id(store) for store in stores}) == 1
    store = stores[0]
    assert isinstance(store, ThreadedAsyncStore)
    assert store.sync_store is app.store  # over the app's own store, not a second one
    app.close()
    assert store.closed
    assert app.store is not store.sync_store  # the next use opens anew
    app.close()


def test_aclose_closes_both_stores_and_leaves_a_given_one_open(url: str) -> None:
    async def main(app: App) -> tuple[AsyncStore, Store]:
        async with app:
            astore = await app.astore()
            queue = await app.aqueue("q")
            assert queue is await app.aqueue("q")
            assert queue.store is astore
            await queue.enqueue("x")
            subscription = await astore.listen("q")
            sync = app.store
        assert astore.closed
        assert isinstance(subscription, ThreadedAsyncSubscription)
        assert subscription._sync._closed  # the adapter closed what it opened
        return astore, sync

    _, sync = asyncio.run(main(App(url)))
    assert sync.closed  # the app opened it
    with alkstore.open(url) as given:
        _, same = asyncio.run(main(App(store=given)))
        assert same is given
        assert not given.closed  # yours to close
        assert given.queue("q").stats().pending == 2


def test_a_threaded_store_that_does_not_own_its_store_leaves_it_open(url: str) -> None:
    with alkstore.open(url) as sync:

        async def main() -> bool:
            store = ThreadedAsyncStore(sync, owns_store=False)
            subscription = await store.listen("q")
            await store.queue("q").enqueue(1)
            await store.close()
            assert isinstance(subscription, ThreadedAsyncSubscription)
            return subscription._sync._closed

        assert asyncio.run(main())
        assert not sync.closed
        assert sync.queue("q").stats().pending == 1
        with pytest.raises(ValidationError, match="owns_store must be a bool"):
            ThreadedAsyncStore(sync, owns_store=1)  # type: ignore[arg-type]


def test_a_native_async_store_belongs_to_its_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With an engine that has native async primitives, ``astore()`` is
    ``alkstore.open_async``'s store, bound to the loop that opened it: used
    from another loop still running, it is refused; once its loop has
    closed, it is dropped with a warning and a new one opened."""
    opened: list[ThreadedAsyncStore] = []
    path = tmp_path / "native.db"

    def factory(url: str, **options: Any) -> Store:
        return alkstore.open(f"sqlite:///{path}", **options)

    async def open_native(url: str, **options: Any) -> AsyncStore:
        store = ThreadedAsyncStore(await asyncio.to_thread(factory, url, **options))
        opened.append(store)
        return store

    factory.open_async = open_native  # type: ignore[attr-defined]
    alkstore.register("native-app-test", factory)
    app = App("native-app-test://x")

    async def first() -> AsyncStore:
        store = await app.astore()
        assert store is await app.astore()
        await (await app.aqueue("q")).enqueue(1)
        return store

    loop = asyncio.new_event_loop()
    try:
        one = loop.run_until_complete(first())
        assert opened == [one]
        assert isinstance(one, ThreadedAsyncStore)
        assert one.sync_store is not app.store  # not the app's sync store: a store of its own
        with pytest.raises(RuntimeError, match="native to another event loop, still open"):
            asyncio.run(app.astore())
    finally:
        loop.close()
    # Its loop has closed: the store cannot be closed any more.
    with caplog.at_level(logging.WARNING, logger="alkstore"):
        two = asyncio.run(app.astore())
    assert two is not one
    assert "belonged to an event loop that has closed" in caplog.text

    async def third() -> AsyncStore:
        store = await app.astore()
        await app.aclose()  # on its own loop: closed
        return store

    three = asyncio.run(third())
    assert three.closed
    assert opened == [one, two, three]
    for dropped in (one, two):
        assert isinstance(dropped, ThreadedAsyncStore)
        dropped.sync_store.close()
    app.close()


#: How long a gated engine's sync opening holds at most (the bound that ends
#: a test whose loop is blocked by the opening).
HOLD_S = 10.0


class GatedEngine:
    """An engine registered under ``scheme`` over a SQLite file whose sync
    opening holds, until :attr:`release` is set (at most :data:`HOLD_S`),
    as a slow connect or migration would; :attr:`holding` is set while one
    holds. With ``native``, its factory also has an ``open_async`` (not
    held), as an engine with native async primitives."""

    def __init__(self, scheme: str, path: Path, *, native: bool) -> None:
        self.holding = threading.Event()
        self.release = threading.Event()
        self.url = f"{scheme}://x"
        sqlite_url = f"sqlite:///{path}"

        def factory(url: str, **options: Any) -> Store:
            self.holding.set()
            try:
                self.release.wait(HOLD_S)
            finally:
                self.holding.clear()
            return alkstore.open(sqlite_url, **options)

        async def open_native(url: str, **options: Any) -> AsyncStore:
            return ThreadedAsyncStore(await asyncio.to_thread(alkstore.open, sqlite_url, **options))

        if native:
            factory.open_async = open_native  # type: ignore[attr-defined]
        alkstore.register(scheme, factory)


async def turns() -> None:
    """Let the loop run a few steps: the tasks just created take theirs."""
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.parametrize("native", [False, True], ids=["thread-adapter", "native"])
@pytest.mark.parametrize("opener", ["a-thread", "run_async"])
def test_the_loop_turns_while_a_thread_opens_the_apps_store(
    tmp_path: Path, native: bool, opener: str
) -> None:
    """While a thread opens the app's sync store (a thread calling
    ``app.queue``, or ``run_async``'s control thread), the async methods
    awaited on the loop (``astore``, ``aqueue``, ``aoutbox``, ``aenqueue``)
    never hold the loop waiting for that opening: with a native engine they
    complete meanwhile, since its async store is a store of its own; over
    the thread adapter they wait for the sync store, off the loop."""
    engine = GatedEngine(f"gated-{opener}-{native}".lower(), tmp_path / "jobs.db", native=native)
    app = App(engine.url)

    @app.task(queue="q", name="t")
    async def t() -> None:
        pass

    async def ask() -> int:
        store = await app.astore()
        queue = await app.aqueue("q")
        assert queue.store is store
        assert (await app.aoutbox("ob")).queue.store is store
        return await t.aenqueue()

    async def main() -> tuple[bool, bool, int, WorkerCounts | None]:
        worker, run = None, None
        if opener == "run_async":
            worker = app.worker(poll_interval_s=0.05, handle_signals=False)
            run = asyncio.create_task(worker.run_async())
        else:
            threading.Thread(target=app.queue, args=("q",), daemon=True).start()
        await until(engine.holding.is_set, "the sync store's opening")
        asking = asyncio.create_task(ask())
        await turns()
        turned = engine.holding.is_set()  # the loop ran on while the opening held
        if native:
            await asyncio.wait_for(asyncio.shield(asking), WAIT_S)
        done_while_held = asking.done() and engine.holding.is_set()
        if worker is not None:
            worker.stop()
        engine.release.set()
        job_id = await asyncio.wait_for(asking, WAIT_S)
        counts = await asyncio.wait_for(run, WAIT_S) if run is not None else None
        await app.aclose()
        return turned, done_while_held, job_id, counts

    try:
        turned, done_while_held, job_id, counts = asyncio.run(main())
    finally:
        engine.release.set()
    assert turned
    assert done_while_held is native  # the adapter needs the sync store, so waits for it
    if counts is not None:
        assert counts == WorkerCounts()  # stopped before it claimed
    job = app.queue("q").get_job(job_id)
    assert job is not None
    assert (job.state, job.payload["task"]) == ("pending", "t")
    app.close()


def test_a_loop_waiting_for_another_loops_opening_is_refused_its_native_store(
    tmp_path: Path,
) -> None:
    """While a coroutine of loop A opens the app's native async store, one
    of loop B asking for it waits for that opening, then is refused with the
    ``RuntimeError`` of any use from another loop still running, never
    handed A's store; once A has closed it, B opens one of its own."""
    path = tmp_path / "native.db"
    opening, release, b_done = threading.Event(), threading.Event(), threading.Event()
    opened: list[AsyncStore] = []

    def factory(url: str, **options: Any) -> Store:
        return alkstore.open(f"sqlite:///{path}", **options)

    async def open_native(url: str, **options: Any) -> AsyncStore:
        opening.set()
        await asyncio.to_thread(release.wait, WAIT_S)  # held until B waits for it
        store = ThreadedAsyncStore(await asyncio.to_thread(factory, url, **options))
        opened.append(store)
        return store

    factory.open_async = open_native  # type: ignore[attr-defined]
    alkstore.register("native-two-loops", factory)
    app = App("native-two-loops://x")
    on_a: list[AsyncStore] = []

    async def loop_a() -> None:
        on_a.append(await app.astore())
        await (await app.aqueue("q")).enqueue("from A")  # A's store works on A
        await asyncio.to_thread(b_done.wait, WAIT_S)
        await app.aclose()

    a = threading.Thread(target=asyncio.run, args=(loop_a(),), daemon=True)
    a.start()

    async def loop_b() -> tuple[bool, BaseException | AsyncStore]:
        await asyncio.to_thread(opening.wait, WAIT_S)
        asking = asyncio.create_task(app.astore())
        await turns()
        waited = not asking.done()
        release.set()
        try:
            return waited, await asyncio.wait_for(asking, WAIT_S)
        except RuntimeError as refused:
            return waited, refused

    try:
        waited, got = asyncio.run(loop_b())
    finally:
        release.set()
        b_done.set()
        a.join(WAIT_S)
    assert waited
    assert isinstance(got, RuntimeError), f"loop B was handed {got!r}, native to loop A"
    assert "native to another event loop, still open" in str(got)
    assert on_a == opened[:1]
    assert on_a[0].closed  # closed by A, on A

    async def own() -> AsyncStore:
        store = await app.astore()
        assert (await (await app.aqueue("q")).stats()).pending == 1
        await app.aclose()
        return store

    assert asyncio.run(own()) is opened[1]
    assert len(opened) == 2
    app.close()


#: A fresh process's first use of the async API, on its event loop's thread,
#: watched by an audit hook that notes the blocking I/O that thread does.
FIRST_USE = """
import asyncio, sys, threading
import alkstore
from alkstore import App

BLOCKING = ("open", "os.listdir", "os.scandir", "socket.connect", "socket.getaddrinfo",
            "time.sleep", "subprocess.Popen", "sqlite3.connect")
seen, watched = [], []

def hook(event, args):
    if watched and event in BLOCKING and threading.current_thread() is watched[0]:
        if not (event == "time.sleep" and args and args[0] == 0):
            seen.append((event, str(args[0] if args else None)[:200]))

url = sys.argv[1]
app = App(url)

@app.task(queue="q", name="t")
async def t() -> None:
    pass

if sys.argv[2] == "open":
    app.store  # opened: only the wrapping is left
sys.addaudithook(hook)

async def main() -> None:
    watched.append(threading.current_thread())
    try:
{body}
    finally:
        watched.clear()
    await app.aclose()

asyncio.run(main())
print(repr(seen))
"""

FIRST_USES = {
    "astore": "await app.astore()",
    "aqueue": "await app.aqueue('q')",
    "aoutbox": "await app.aoutbox('ob')",
    "aenqueue": "await t.aenqueue(); await t.aenqueue_many([(), ()])",
    "aclose": "await app.aclose()",
    "open_async": "await (await alkstore.open_async(url)).close()",
}


@pytest.mark.parametrize("sync_store", ["open", "unopened"])
@pytest.mark.parametrize("use", sorted(FIRST_USES))
def test_the_first_use_of_the_async_api_reads_no_file_on_the_loop(
    tmp_path: Path, use: str, sync_store: str
) -> None:
    """In a fresh process, the first ``astore``, ``aqueue``, ``aoutbox``,
    ``aenqueue``, ``aclose`` and ``alkstore.open_async`` read no file (and
    make no other blocking call) on the event loop's thread: the modules
    they load on first use (the thread adapter, ``AsyncOutbox`` and its
    imports, the executor asyncio creates for ``to_thread``) are imported
    off the loop, as the engine is, whether or not the app's sync store is
    open already."""
    body = textwrap.indent(FIRST_USES[use], " " * 8)
    script = FIRST_USE.replace("{body}", body)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    out = subprocess.run(
        [sys.executable, "-c", script, url, sync_store],
        check=False,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
