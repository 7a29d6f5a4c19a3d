"""asyncio benchmark: alkstore's async and sync workers beside PgQueuer and procrastinate.

Run from the repository root after installing requirements-dev.txt and
bench/requirements.txt (the peers)::

    python bench/bench_async.py            # the full run
    python bench/bench_async.py --quick    # a smoke run
    python bench/bench_async.py --url postgresql://postgres@127.0.0.1:5432/test

``--url`` names a database to connect to for administration (default
``$ALKSTORE_BENCH_POSTGRES_URL``, else ``$ALKSTORE_TEST_POSTGRES_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``); the role must be allowed to
create databases. Every system gets its own fresh database on that server,
dropped at the end (bench_postgres.py's ``Systems``), and every measurement
runs in a fresh process. Each system is driven through its own API and its
own worker, as its users run it (issue 12, "Targets (benchmarks)"):

* enqueue one by one from async code: alkstore ``await queue.enqueue(payload)``
  on ``alkstore.open_async(url)``, and ``await task.aenqueue(args=[1, 2, 3])``
  (the task API); PgQueuer ``await queries.enqueue("noop", payload)``;
  procrastinate ``await task.defer_async(args=[1, 2, 3])``.
* enqueue_many (1,000): alkstore ``await queue.enqueue_many([payload] * 1000)``;
  PgQueuer's list form of ``queries.enqueue``; procrastinate
  ``await task.batch_defer_async(*[{"args": [1, 2, 3]}] * 1000)``.
* drain of no-op ``async def`` tasks at concurrency 1, 4 and 16, timed from
  the worker's start (its connections open) to the last job done: alkstore's
  sync worker ``Worker.run(burst=True)`` and its async worker
  ``await Worker.run_async(burst=True)``; PgQueuer's ``QueueManager.run(
  mode=drain)`` capped at N by the entrypoint's ``concurrency_limit`` or by
  ``max_concurrent_tasks``, whichever drains faster; procrastinate's
  ``run_worker_async(concurrency=N, wait=False)``.
* wake latency, commit to handler start, p50 and p99: a producer process
  enqueues one job at a time and reads ``CLOCK_MONOTONIC`` when the enqueue
  returns; an idle worker in another process reads it when its ``async``
  handler starts.
* loop blocking, measured with the loop's own slow-callback report: the
  child runs its loop in debug mode (``asyncio.run(..., debug=True)``) with
  ``loop.slow_callback_duration = 0.005``, so asyncio logs "Executing
  <Handle ...> took X seconds" on its ``asyncio`` logger for every callback
  (a step of a coroutine, up to its next suspension; a done callback) that
  held the loop 5 ms or longer. A handler on that logger counts the reports
  and keeps the longest. Everything on that loop is alkstore's work or the
  few lines of this file that call it, from opening the store to closing it.
  Measured twice: while alkstore's async worker drains (concurrency 16) and
  a coroutine beside it enqueues with ``task.aenqueue``; and, with what
  exists today, while coroutines enqueue, claim and ack through
  ``alkstore.open_async``'s store. Target: no report (no alkstore call holds
  the loop 5 ms). A loop with nothing on it but a 1 ms sleep is watched as
  long in a fresh process, and its reports (the machine's, the process
  descheduled) are printed under the table. So is, for each row, how many
  reported callbacks used 5 ms of the loop thread's CPU time
  (``time.thread_time`` around each callback): a report whose thread used
  less is a loop whose thread was not running, the OS running another
  process (the database server shares the host's cores) or another thread
  of the process holding the GIL; and how many of those overlapped one of
  the garbage collector's full collections (``gc.callbacks``, generation
  2), which stop every thread of the process whoever starts them.

The async worker and async tasks (``@app.task`` on an ``async def``,
``Task.aenqueue``, ``Worker.run_async``, ``App.astore``) are newer than this
script: an alkstore row whose API is missing prints ``-`` and the reason
("needs async tasks") under the table. Every figure is jobs per second
unless the unit says otherwise; bench/README.md says what each row times
for each system.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import logging
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Row, Table, percentile
from bench_postgres import (
    PAYLOAD,
    PEERS,
    Server,
    Systems,
    _pgq_queries,
    add_url_option,
    alk_wake,
    in_child,
    pgq_enqueue,
    pgq_fill,
    pgq_wake,
    proc_drain,
    proc_enqueue,
    proc_fill,
    proc_wake,
    rate_row,
    sql,
)
from bench_worker import QUEUE, check_empty, fill, worker_wake_consumer

import alkstore

#: The task's arguments, the same everywhere: procrastinate's
#: ``defer_async(args=ARGS)``, alkstore's ``aenqueue(args=ARGS)``.
ARGS = [1, 2, 3]
#: What ``noop.aenqueue(args=ARGS)`` stores (``Task.payload``).
TASK_PAYLOAD = {"task": "noop", "args": [], "kwargs": {"args": ARGS}}
#: The loop-blocking bound (issue 12): seconds.
SLOW_S = 0.005
#: The loop-blocking rows' concurrency.
LOOP_CONCURRENCY = 16
WARMUP = 5

#: A loop-blocking measurement: reports over ``SLOW_S``, the longest (ms),
#: that callback's text, and the seconds watched.
LoopReport = tuple[int, float, str, float, int, int, float]


@dataclass
class Sizes:
    single: int  # jobs enqueued one by one
    batched: int  # jobs enqueued 1,000 at a time
    drain: int  # jobs per drain
    wake: int  # wake samples, after WARMUP
    produced: int  # jobs enqueued one by one during the loop-blocking rows
    repeat: int  # rounds of the enqueue rows (the median is shown)


QUICK = Sizes(single=500, batched=10_000, drain=2_000, wake=50, produced=200, repeat=1)
FULL = Sizes(single=5_000, batched=50_000, drain=10_000, wake=300, produced=1_000, repeat=3)


# -- what of the async task API exists -------------------------------------------

_NAMES: dict[str, tuple[type, str]] = {
    "App.astore": (alkstore.App, "astore"),
    "Task.aenqueue": (alkstore.Task, "aenqueue"),
    "Worker.run_async": (alkstore.Worker, "run_async"),
}


def async_tasks_missing(*needs: str) -> str | None:
    """Why alkstore cannot run a row needing ``needs`` yet, or ``None``.

    ``needs`` holds ``"async def"`` (``@app.task`` accepts an ``async def``
    function, and so the sync worker runs it) and names of :data:`_NAMES`.
    """
    gone = [name for name in needs if name in _NAMES and not hasattr(*_NAMES[name])]
    if "async def" in needs:

        async def probe() -> None:
            return None

        try:
            alkstore.App().task(name="probe")(probe)
        except alkstore.ValidationError:
            gone.insert(0, "@app.task on an async def")
    return f"needs async tasks ({', '.join(gone)} not there yet)" if gone else None


# -- alkstore ------------------------------------------------------------------


def _alk_app(
    url: str, concurrency: int, on_job: Callable[[], None] | None = None
) -> tuple[alkstore.App, Any]:
    """An App on ``url`` with one task, ``async def noop(args)`` on the
    bench queue, which calls ``on_job()`` first and does nothing else; its
    pool holds ``concurrency + 3`` connections (docs/deployment.md)."""
    size = concurrency + 3
    app = alkstore.App(url, pool_min_size=size, pool_max_size=size)

    async def noop(args: list[int]) -> None:
        if on_job is not None:
            on_job()

    return app, app.task(queue=QUEUE, name="noop")(noop)


def _warm(store: alkstore.Store, connections: int) -> None:
    """Open the pool's connections before the clock starts: ``connections``
    threads claim at once on an empty queue (as bench_postgres.py's drain)."""
    queue = store.queue("warm")
    barrier = threading.Barrier(connections)

    def claim() -> None:
        barrier.wait(10)
        queue.claim_batch("warm", 1)

    threads = [threading.Thread(target=claim) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


async def _awarm(store: alkstore.AsyncStore, connections: int) -> None:
    """:func:`_warm` on an async store: ``connections`` claims at once."""
    queue = store.queue("warm")
    await asyncio.gather(*(queue.claim_batch("warm", 1) for _ in range(connections)))


async def _aclose(app: alkstore.App) -> None:
    """Close the app's async store, then its sync one."""
    aclose = getattr(app, "aclose", None)
    if aclose is not None:
        await aclose()
    else:
        await (await app.astore()).close()  # type: ignore[attr-defined]
    app.close()


async def _stop(worker: alkstore.Worker) -> None:
    stopped = worker.stop()
    if inspect.isawaitable(stopped):
        await stopped


async def _until(event: asyncio.Event, running: asyncio.Task[Any], timeout: float) -> None:
    """Wait for ``event``; raise if ``running`` (the worker) ended first or
    ``timeout`` seconds passed."""
    waiter = asyncio.ensure_future(event.wait())
    done, _ = await asyncio.wait(
        {waiter, running}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
    )
    waiter.cancel()
    if waiter not in done:
        if running in done:
            running.result()  # the worker's own error
            raise RuntimeError("the worker returned before its jobs ran")
        raise RuntimeError(f"the jobs did not run within {timeout:.0f} s")


def _check_ran(who: str, succeeded: int, ran: int, n: int) -> None:
    if succeeded != n or ran < n:
        raise RuntimeError(f"{who}: {succeeded} of {n} jobs succeeded, {ran} handlers ran")


def alk_enqueue_async(url: str, n: int, batch: int) -> float:
    """``await q.enqueue(PAYLOAD)`` (``batch`` 1) or ``await
    q.enqueue_many([PAYLOAD] * batch)`` on ``alkstore.open_async(url)``."""

    async def run() -> float:
        async with alkstore.open_async(url) as store:
            q = store.queue("enq")
            await q.enqueue_many([PAYLOAD] * 10)  # the connection, the statements prepared
            await q.enqueue(PAYLOAD)
            begun = time.perf_counter()
            if batch == 1:
                for _ in range(n):
                    await q.enqueue(PAYLOAD)
            else:
                for start in range(0, n, batch):
                    await q.enqueue_many([PAYLOAD] * min(batch, n - start))
            return n / (time.perf_counter() - begun)

    return asyncio.run(run())


def alk_task_enqueue(url: str, n: int) -> float:
    """``await noop.aenqueue(args=ARGS)`` one by one, the app's async store open."""

    async def run() -> float:
        app, noop = _alk_app(url, 1)
        try:
            await app.astore()  # type: ignore[attr-defined]
            await noop.aenqueue(args=ARGS)
            begun = time.perf_counter()
            for _ in range(n):
                await noop.aenqueue(args=ARGS)
            return n / (time.perf_counter() - begun)
        finally:
            await _aclose(app)

    return asyncio.run(run())


def alk_sync_worker_drain(url: str, n: int, concurrency: int) -> float:
    """The sync worker, ``Worker.run(burst=True)``, running the async task:
    timed from ``run()`` (the pool's connections open) to its return (the
    queue empty, every finished job acked)."""
    ran: list[None] = []
    app, _ = _alk_app(url, concurrency, lambda: ran.append(None))
    with app:
        _warm(app.store, concurrency + 3)
        worker = app.worker(queues=[QUEUE], concurrency=concurrency, handle_signals=False)
        begun = time.perf_counter()
        counts = worker.run(burst=True)
        elapsed = time.perf_counter() - begun
    _check_ran("the sync worker", counts.succeeded, len(ran), n)
    return n / elapsed


def alk_async_worker_drain(url: str, n: int, concurrency: int) -> float:
    """The async worker, ``await Worker.run_async(burst=True)`` in this
    process's loop: timed as :func:`alk_sync_worker_drain`."""
    ran: list[None] = []

    async def run() -> tuple[Any, float]:
        app, _ = _alk_app(url, concurrency, lambda: ran.append(None))
        try:
            await _awarm(await app.astore(), concurrency + 3)  # type: ignore[attr-defined]
            worker = app.worker(queues=[QUEUE], concurrency=concurrency, handle_signals=False)
            begun = time.perf_counter()
            counts = await worker.run_async(burst=True)  # type: ignore[attr-defined]
            return counts, time.perf_counter() - begun
        finally:
            await _aclose(app)

    counts, elapsed = asyncio.run(run())
    _check_ran("the async worker", counts.succeeded, len(ran), n)
    return n / elapsed


def _alk_async_wake_consumer(url: str, ready: Any, pipe: Any, count: int) -> None:
    """An idle async worker (concurrency 1); the handler sends its start time."""

    async def run() -> None:
        got = 0
        finished = asyncio.Event()

        def on_job() -> None:
            nonlocal got
            pipe.send(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
            got += 1
            if got >= count:
                finished.set()

        app, _ = _alk_app(url, 1, on_job)
        try:
            await _awarm(await app.astore(), 4)  # type: ignore[attr-defined]
            worker = app.worker(queues=[QUEUE], concurrency=1, handle_signals=False)
            running = asyncio.create_task(worker.run_async())  # type: ignore[attr-defined]
            ready.set()
            await _until(finished, running, 600)
            await _stop(worker)
            await running
        finally:
            await _aclose(app)

    asyncio.run(run())


def alk_wake_sync_worker(url: str, samples: int, warmup: int) -> list[float]:
    return alk_wake(
        url,
        samples,
        warmup,
        consumer=partial(worker_wake_consumer, make_app=_alk_app),
        queue=QUEUE,
        payload=TASK_PAYLOAD,
    )


def alk_wake_async_worker(url: str, samples: int, warmup: int) -> list[float]:
    return alk_wake(
        url,
        samples,
        warmup,
        consumer=_alk_async_wake_consumer,
        queue=QUEUE,
        payload=TASK_PAYLOAD,
    )


# -- loop blocking ---------------------------------------------------------------


class SlowCallbacks(logging.Handler):
    """asyncio's debug-mode reports, "Executing <Handle ...> took X seconds",
    as logged on the ``asyncio`` logger (``BaseEventLoop._run_once``), which
    time a callback by the wall clock; beside them, what each slow one cost
    the loop's thread in CPU time (``time.thread_time``), and the garbage
    collector's full collections (generation 2) meanwhile. A report whose
    thread used little CPU is a loop whose thread was not running: the OS
    ran something else (on a host whose cores the database server shares),
    or another thread of the process held the GIL. A full collection stops
    every thread of the process, whoever triggered it."""

    def __init__(self) -> None:
        super().__init__()
        self.durations: list[float] = []
        self.worst = ""
        self.began = time.perf_counter()
        #: Each slow callback's (start, end) wall-clock seconds and its CPU.
        self.slow: list[tuple[float, float, float]] = []
        #: Each full collection's (start, end), wall-clock seconds.
        self.collections: list[tuple[float, float]] = []
        self._collecting = 0.0
        self._run = asyncio.events.Handle._run

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if str(record.msg).startswith("Executing ") and isinstance(args, tuple) and args:
            took = float(args[-1])
            if not self.durations or took > max(self.durations):
                self.worst = str(args[0])
            self.durations.append(took)

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._collecting = time.time()
        else:
            self.collections.append((self._collecting, time.time()))

    @classmethod
    def watch(cls) -> SlowCallbacks:
        """Report on the running loop, which must be in debug mode."""
        loop = asyncio.get_running_loop()
        if not loop.get_debug():
            raise RuntimeError("the loop is not in debug mode")
        loop.slow_callback_duration = SLOW_S
        handler = cls()
        logging.getLogger("asyncio").addHandler(handler)
        gc.callbacks.append(handler._gc)
        run = handler._run

        def timed(callback: asyncio.Handle) -> None:
            began, cpu = time.time(), time.thread_time()
            run(callback)
            if time.time() - began >= SLOW_S:
                handler.slow.append((began, time.time(), time.thread_time() - cpu))

        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        return handler

    def report(self) -> LoopReport:
        """How many callbacks held the loop ``SLOW_S`` or longer by the wall
        clock (asyncio's reports), the longest (ms), which
        (:func:`callback_text`), the seconds watched; how many of those used
        ``SLOW_S`` of the loop thread's CPU, how many of these overlapped a
        full collection, and the longest full collection (ms). The loop's own
        teardown, after this, is not watched."""
        asyncio.events.Handle._run = self._run  # type: ignore[method-assign]
        logging.getLogger("asyncio").removeHandler(self)
        gc.callbacks.remove(self._gc)
        asyncio.get_running_loop().slow_callback_duration = 3600.0
        worst = max(self.durations, default=0.0) * 1000
        seconds = time.perf_counter() - self.began
        busy = [(start, end) for start, end, cpu in self.slow if cpu >= SLOW_S]
        during_gc = sum(
            any(start < gc_end and gc_start < end for gc_start, gc_end in self.collections)
            for start, end in busy
        )
        longest_gc = max((end - start for start, end in self.collections), default=0.0) * 1000
        return (
            len(self.durations),
            worst,
            callback_text(self.worst),
            seconds,
            len(busy),
            during_gc,
            longest_gc,
        )


def callback_text(handle: str) -> str:
    """asyncio's text of a handle or task, short: what ran and, for a
    coroutine, where it stopped (``coro=<f() running at file.py:123>``)."""
    short = " ".join(handle.split()).split(" wait_for=")[0].split(" created at ")[0]
    return re.sub(r"/\S*/", "", short)


def loop_idle(seconds: float) -> LoopReport:
    """The same watch on a loop with nothing of alkstore on it, for
    ``seconds``: a coroutine sleeping 1 ms at a time. Its reports are the
    machine's (the process descheduled), not any library's."""

    async def run() -> LoopReport:
        slow = SlowCallbacks.watch()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await asyncio.sleep(0.001)
        return slow.report()

    return asyncio.run(run(), debug=True)


def loop_store(url: str, n: int, produced: int) -> LoopReport:
    """Slow-callback reports while coroutines use ``alkstore.open_async``'s
    store: ``LOOP_CONCURRENCY`` consumers loop ``claim_batch(16)`` +
    ``ack_batch`` on ``n`` waiting jobs, except one that loops ``claim_one`` +
    ``ack`` and waits on a subscription (``store.listen``) when the queue is
    empty (the others sleep 5 ms), while one producer enqueues ``produced``
    jobs one by one and ``produced`` more in ``enqueue_many`` calls of 100."""

    async def run() -> LoopReport:
        slow = SlowCallbacks.watch()
        size = LOOP_CONCURRENCY + 3
        async with alkstore.open_async(url, pool_min_size=size, pool_max_size=size) as store:
            q = store.queue(QUEUE)
            total = n + 2 * produced
            taken = 0

            async def consume() -> None:
                nonlocal taken
                while taken < total:
                    handles = await q.claim_batch("loop", 16)
                    if handles:
                        await q.ack_batch([h.id for h in handles])
                        taken += len(handles)
                    else:
                        await asyncio.sleep(0.005)

            async def consume_one() -> None:
                nonlocal taken
                async with await store.listen(QUEUE) as sub:
                    while taken < total:
                        handle = await q.claim_one("loop")
                        if handle is None:
                            await sub.wait(0.1)
                        elif await handle.ack():
                            taken += 1

            async def produce() -> None:
                for _ in range(produced):
                    await q.enqueue(PAYLOAD)
                for start in range(0, produced, 100):
                    await q.enqueue_many([PAYLOAD] * min(100, produced - start))

            consumers = [consume() for _ in range(LOOP_CONCURRENCY - 1)]
            await asyncio.wait_for(asyncio.gather(produce(), consume_one(), *consumers), 600)
        await asyncio.sleep(0)  # the step that closed the store ends here, and is reported
        return slow.report()

    return asyncio.run(run(), debug=True)


def loop_worker(url: str, n: int, produced: int) -> LoopReport:
    """Slow-callback reports while the async worker (``LOOP_CONCURRENCY``)
    drains ``n`` waiting jobs and a coroutine beside it enqueues ``produced``
    more with ``await noop.aenqueue(args=ARGS)``; stopped once every job ran."""

    async def run() -> LoopReport:
        slow = SlowCallbacks.watch()
        ran = 0
        finished = asyncio.Event()

        def on_job() -> None:
            nonlocal ran
            ran += 1
            if ran >= n + produced:
                finished.set()

        app, noop = _alk_app(url, LOOP_CONCURRENCY, on_job)
        try:
            await app.astore()  # type: ignore[attr-defined]
            worker = app.worker(queues=[QUEUE], concurrency=LOOP_CONCURRENCY, handle_signals=False)
            running = asyncio.create_task(worker.run_async())  # type: ignore[attr-defined]
            for _ in range(produced):
                await noop.aenqueue(args=ARGS)
            await _until(finished, running, 600)
            await _stop(worker)
            await running
        finally:
            await _aclose(app)
        await asyncio.sleep(0)  # the step that closed the app ends here, and is reported
        return slow.report()

    return asyncio.run(run(), debug=True)


# -- PgQueuer ------------------------------------------------------------------


#: PgQueuer's two ways to cap one worker's concurrency at N: the entrypoint's
#: ``concurrency_limit`` (enforced by its dequeue statement, across workers),
#: and ``run(max_concurrent_tasks=N)`` (this worker's picked jobs; it must be
#: at least twice the batch, so it cannot express N = 1).
PGQ_CAPS = ("concurrency_limit", "max_concurrent_tasks")


def pgq_batch(cap: str, concurrency: int) -> int:
    """The batch each cap runs with. With ``concurrency_limit`` the batch is
    N: its job-log buffer holds ``batch_size`` outcomes (or 0.1 s) before it
    writes them, and a slot frees only then, so its default of 10 at
    N = 1 gives 10 jobs/s. ``max_concurrent_tasks`` needs a batch of at most N/2."""
    return concurrency if cap == "concurrency_limit" else max(1, concurrency // 2)


def pgq_worker_drain(url: str, n: int, concurrency: int, cap: str) -> float:
    """One ``QueueManager`` (one asyncpg connection) with a no-op async
    entrypoint, concurrency capped at N by ``cap`` (:data:`PGQ_CAPS`), and
    ``run(mode=drain, batch_size=pgq_batch(cap, N))``: timed from ``run()`` to
    its return (the queue empty, every job's outcome written)."""
    from pgqueuer import QueueManager
    from pgqueuer.types import QueueExecutionMode

    done = 0
    limit = concurrency if cap == "concurrency_limit" else 0
    most = concurrency if cap == "max_concurrent_tasks" else None

    async def run() -> float:
        queries, _ = await _pgq_queries(url)
        qm = QueueManager(queries)

        @qm.entrypoint("noop", concurrency_limit=limit)
        async def noop(job: Any) -> None:
            nonlocal done
            done += 1

        begun = time.perf_counter()
        await qm.run(
            batch_size=pgq_batch(cap, concurrency),
            mode=QueueExecutionMode.drain,
            max_concurrent_tasks=most,
        )
        return time.perf_counter() - begun

    elapsed = asyncio.run(run())
    if done != n:
        raise RuntimeError(f"PgQueuer ran {done} of {n} jobs")
    return n / elapsed


# -- the run -------------------------------------------------------------------


@dataclass
class Bench:
    systems: Systems
    sizes: Sizes
    table: Table
    #: alkstore variants that cannot run yet: the reason, once per variant.
    waiting: dict[str, str] = field(default_factory=dict)

    @property
    def alk_url(self) -> str:
        return self.systems.urls["alkstore"]

    def alkstore(self, variant: str, needs: tuple[str, ...], run: Callable[[], Any]) -> Any:
        """``run()`` on a reset alkstore database, or ``None`` (and the
        reason under the table) when the API ``variant`` needs is missing."""
        missing = async_tasks_missing(*needs)
        if missing is not None:
            self.waiting.setdefault(variant, missing)
            return None
        self.systems.reset("alkstore")
        return run()

    def peer(self, peer: str, run: Callable[[], Any]) -> Any:
        return self.systems.measure(peer, run, reset=True)


#: The API each alkstore variant needs beyond what exists today.
TASK_ENQUEUE = ("async def", "App.astore", "Task.aenqueue")
SYNC_WORKER = ("async def",)
ASYNC_WORKER = ("async def", "App.astore", "Worker.run_async")
LOOP_WORKER = ("async def", "App.astore", "Task.aenqueue", "Worker.run_async")


def enqueue_rows(bench: Bench) -> None:
    """The median of ``repeat`` rounds, the systems taking turns."""
    s, url, urls = bench.sizes, bench.alk_url, bench.systems.urls
    for batch, n, variants in (
        (
            1,
            s.single,
            {
                "AsyncQueue.enqueue": ((), lambda: in_child(alk_enqueue_async, url, s.single, 1)),
                "Task.aenqueue": (TASK_ENQUEUE, lambda: in_child(alk_task_enqueue, url, s.single)),
            },
        ),
        (
            1_000,
            s.batched,
            {
                "AsyncQueue.enqueue_many": (
                    (),
                    lambda: in_child(alk_enqueue_async, url, s.batched, 1_000),
                ),
            },
        ),
    ):
        samples: dict[str, list[float]] = {k: [] for k in [*variants, *PEERS]}
        for _ in range(s.repeat):
            for variant, (needs, measure) in variants.items():
                got = bench.alkstore(variant, needs, measure)
                if got is not None:
                    samples[variant].append(got)
            for peer, enqueue in (("PgQueuer", pgq_enqueue), ("procrastinate", proc_enqueue)):
                got = bench.peer(
                    peer, lambda f=enqueue, p=peer, k=n, b=batch: in_child(f, urls[p], k, b)
                )
                if got is not None:
                    samples[peer].append(got)
        medians = {k: statistics.median(v) if v else None for k, v in samples.items()}
        name = "enqueue one by one" if batch == 1 else f"enqueue_many ({batch:,})"
        for variant in variants:
            figures = {"alkstore": medians[variant], **{p: medians[p] for p in PEERS}}
            rate_row(bench.table, f"{name}: {variant}", figures, vs_peer=1.5)


def drain_rows(bench: Bench) -> None:
    s, url, urls = bench.sizes, bench.alk_url, bench.systems.urls
    n = s.drain
    for concurrency in (1, 4, 16):
        alk: dict[str, float | None] = {}
        for variant, needs, drain in (
            ("async worker", ASYNC_WORKER, alk_async_worker_drain),
            ("sync worker", SYNC_WORKER, alk_sync_worker_drain),
        ):

            def measure(d: Callable[..., float] = drain, c: int = concurrency) -> float:
                fill(url, n, payload=TASK_PAYLOAD)
                sql(url, "VACUUM ANALYZE")
                got = float(in_child(d, url, n, c))
                check_empty(url)
                return got

            alk[variant] = bench.alkstore(variant, needs, measure)
        peers: dict[str, float | None] = {}

        def pgq(c: int = concurrency) -> float:
            """The faster of PgQueuer's caps (one only at N = 1)."""
            got: dict[str, float] = {}
            for cap in PGQ_CAPS if c > 1 else PGQ_CAPS[:1]:
                bench.systems.reset("PgQueuer")
                in_child(pgq_fill, urls["PgQueuer"], n)
                sql(urls["PgQueuer"], "VACUUM ANALYZE")
                got[cap] = float(in_child(pgq_worker_drain, urls["PgQueuer"], n, c, cap))
            bench.systems.notes.append(
                f"drain {n:,}, concurrency {c}, PgQueuer: "
                + "; ".join(
                    f"{k}={c}, batch_size={pgq_batch(k, c)}: {v:,.0f}/s" for k, v in got.items()
                )
            )
            return max(got.values())

        def procrastinate(c: int = concurrency) -> float:
            in_child(proc_fill, urls["procrastinate"], n)
            sql(urls["procrastinate"], "VACUUM ANALYZE")
            return float(in_child(proc_drain, urls["procrastinate"], n, c))

        peers["PgQueuer"] = bench.peer("PgQueuer", pgq)
        peers["procrastinate"] = bench.peer("procrastinate", procrastinate)
        for variant, figure in alk.items():
            rate_row(
                bench.table,
                f"drain {n:,} async no-op, concurrency {concurrency}: {variant}",
                {"alkstore": figure, **peers},
                vs_peer=1.5,
            )


def latency_row(table: Table, name: str, figures: dict[str, float | None]) -> None:
    """Milliseconds; the target is below the fastest peer's."""
    shown = {k: v for k, v in figures.items() if v is not None}
    alk = shown.get("alkstore")
    peers = [shown[p] for p in PEERS if p in shown]
    best = min(peers) if peers else None
    if alk is not None and best:
        shown["alkstore/best peer"] = alk / best
    verdict = "?" if alk is None or best is None else ("ok" if alk < best else "MISS")
    table.add(Row(name, "ms", shown, "< best peer", verdict))


def wake_rows(bench: Bench) -> None:
    s, url, urls = bench.sizes, bench.alk_url, bench.systems.urls
    lat: dict[str, list[float] | None] = {}
    for variant, needs, wake in (
        ("async worker", ASYNC_WORKER, alk_wake_async_worker),
        ("sync worker", SYNC_WORKER, alk_wake_sync_worker),
    ):
        lat[variant] = bench.alkstore(
            variant, needs, lambda w=wake: in_child(w, url, s.wake, WARMUP)
        )
    for peer, wake in (("PgQueuer", pgq_wake), ("procrastinate", proc_wake)):
        lat[peer] = bench.peer(peer, lambda w=wake, p=peer: in_child(w, urls[p], s.wake, WARMUP))
    for q in (50, 99):
        at = {k: percentile(v, q) if v else None for k, v in lat.items()}
        for variant in ("async worker", "sync worker"):
            figures = {"alkstore": at[variant], **{p: at[p] for p in PEERS}}
            latency_row(bench.table, f"wake latency p{q}, commit to handler: {variant}", figures)


def _loop_worker_row(url: str, sizes: Sizes) -> LoopReport:
    fill(url, sizes.drain, payload=TASK_PAYLOAD)
    return in_child(loop_worker, url, sizes.drain, sizes.produced)  # type: ignore[no-any-return]


def _loop_store_row(url: str, sizes: Sizes) -> LoopReport:
    fill(url, sizes.drain)
    return in_child(loop_store, url, sizes.drain, sizes.produced)  # type: ignore[no-any-return]


def loop_rows(bench: Bench) -> None:
    s, url = bench.sizes, bench.alk_url
    for variant, doing, needs, measure in (
        (
            "async worker",
            f"draining {s.drain:,} (concurrency {LOOP_CONCURRENCY}) + {s.produced:,} aenqueue",
            LOOP_WORKER,
            _loop_worker_row,
        ),
        (
            "open_async store",
            f"{LOOP_CONCURRENCY} coroutines claim + ack {s.drain:,},"
            f" enqueue + enqueue_many {2 * s.produced:,}",
            (),
            _loop_store_row,
        ),
    ):
        scenario = f"loop blocking, {variant} {doing}: callbacks over {SLOW_S * 1000:g} ms"
        got = bench.alkstore(f"loop blocking, {variant}", needs, lambda m=measure: m(url, s))
        if got is None:
            bench.table.add(Row(scenario, "count", {}, "0", "?"))
            continue
        count, worst, handle, seconds, busy, during_gc, longest_gc = got
        idle, idle_worst, *_ = in_child(loop_idle, seconds)
        if count:
            scenario += f" (worst {worst:.1f} ms)"
        bench.systems.notes.append(
            f"loop blocking, {variant}: {count} report(s) in {seconds:.1f} s"
            + (f", the worst {handle}" if count else "")
            + (
                f"; {busy} of them used {SLOW_S * 1000:g} ms of the loop thread's CPU,"
                f" {during_gc} of these during a full garbage collection"
                f" (the longest {longest_gc:.1f} ms); the others' threads were not running"
                if count
                else ""
            )
            + f"; an idle loop watched as long (the machine's share): {idle} report(s)"
            + (f", the worst {idle_worst:.1f} ms" if idle else "")
        )
        verdict = "ok" if not count else "MISS"
        bench.table.add(Row(scenario, "count", {"alkstore": count}, "0", verdict))
        own = busy - during_gc
        bench.table.add(
            Row(
                f"  of which {SLOW_S * 1000:g} ms of the loop thread's CPU, outside a full GC",
                "count",
                {"alkstore": own},
                "0",
                "ok" if not own else "MISS",
            )
        )


def run(bench: Bench) -> None:
    enqueue_rows(bench)
    drain_rows(bench)
    wake_rows(bench)
    loop_rows(bench)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    add_url_option(
        parser, "a database to administer from; the role must be able to CREATE DATABASE"
    )
    args = parser.parse_args()
    began = time.perf_counter()
    server = Server(args.url)
    try:
        systems = Systems(server)
        versions = ", ".join(f"{k} {v}" for k, v in systems.versions.items())
        table = Table(
            f"asyncio: PostgreSQL {server.version} ({server.settings}), {os.cpu_count()} cores,"
            f" Python {sys.version.split()[0]}; {versions or 'no peers'}",
            ["alkstore", *PEERS, "alkstore/best peer"],
        )
        bench = Bench(systems, QUICK if args.quick else FULL, table)
        run(bench)
        systems.note_missing()
    finally:
        server.drop_all()
    print(table.render())
    for variant, why in bench.waiting.items():
        print(f"alkstore, {variant}: - ({why})")
    for note in systems.notes:
        print(note)
    print(f"\n(run took {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
