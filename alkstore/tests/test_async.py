"""The async contract (docs/async.md): the async ABCs mirror the sync ones
name for name, and the thread adapter gives a sync engine (SQLite here,
real files) the same results and errors without blocking the event loop."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Awaitable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import alkstore
from alkstore import (
    AsyncJobHandle,
    AsyncQueue,
    AsyncStore,
    AsyncSubscription,
    EngineError,
    JobHandle,
    Queue,
    QueueOpts,
    Store,
    StoreClosedError,
    Subscription,
    UnknownEngineError,
    ValidationError,
)
from alkstore.contract import threaded
from alkstore.contract.threaded import ThreadedAsyncStore
from alkstore_contract_tests._clock import ManualClock

ROOT = Path(__file__).resolve().parents[2]


def load_tool() -> ModuleType:
    """tools/async_to_sync.py, for its one map of names."""
    spec = importlib.util.spec_from_file_location("async_to_sync", ROOT / "tools/async_to_sync.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = load_tool()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jobs.db'}"


def run(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` on a fresh event loop in debug mode."""

    async def main() -> Any:
        return await coro

    return asyncio.run(main(), debug=True)


# -- the async ABCs mirror the sync ones ------------------------------------

PAIRS = [
    (AsyncStore, Store),
    (AsyncQueue, Queue),
    (AsyncJobHandle, JobHandle),
    (AsyncSubscription, Subscription),
]


def public_names(cls: type) -> set[str]:
    return {
        name
        for name in dir(cls)
        if not name.startswith("_")
        or name in {"__enter__", "__exit__", "__aenter__", "__aexit__", "__init__"}
    }


@pytest.mark.parametrize(("async_cls", "sync_cls"), PAIRS, ids=lambda c: c.__name__)
def test_the_async_abc_has_the_sync_names_and_signatures(async_cls: type, sync_cls: type) -> None:
    names = public_names(async_cls)
    assert {TOOL.rename_words(n) for n in names} == public_names(sync_cls)
    # The engine primitives too: an engine implements the same set.
    assert {TOOL.rename_words(n) for n in async_cls.__abstractmethods__} == set(
        sync_cls.__abstractmethods__
    )
    for name in names | set(async_cls.__abstractmethods__):
        a, s = (
            inspect.getattr_static(async_cls, name),
            inspect.getattr_static(sync_cls, TOOL.rename_words(name)),
        )
        assert type(a) is type(s), name
        if isinstance(a, property):
            continue
        if not callable(a):
            continue
        if isinstance(a, staticmethod | classmethod):
            a, s = a.__func__, s.__func__
        assert TOOL.rename_words(str(inspect.signature(a))) == str(inspect.signature(s)), name
        assert a.__doc__ is None or TOOL.rename_words(a.__doc__) == s.__doc__, name
        # A coroutine exactly where the sync call may do I/O.
        assert not inspect.iscoroutinefunction(s), name
        if inspect.iscoroutinefunction(a):
            continue
        assert name in {"__init__", "queue", "_open_queue", "_check_open", "_maintenance_turn"}, (
            f"{async_cls.__name__}.{name} is not a coroutine"
        )


def test_every_queue_and_handle_operation_is_a_coroutine() -> None:
    for name in [
        "enqueue",
        "enqueue_many",
        "enqueue_tx",
        "claim_one",
        "claim_batch",
        "ack_batch",
        "ack_many",
        "cancel",
        "get_job",
        "sweep_expired",
        "stats",
        "lapsed_claims",
        "pause",
        "resume",
        "is_paused",
        "dead_jobs",
        "requeue",
        "purge_dead",
    ]:
        assert inspect.iscoroutinefunction(getattr(AsyncQueue, name)), name
    for name in ("ack", "retry", "fail", "heartbeat"):
        assert inspect.iscoroutinefunction(getattr(AsyncJobHandle, name)), name
    for cls, name in [(AsyncSubscription, "wait"), (AsyncStore, "listen"), (AsyncStore, "close")]:
        assert inspect.iscoroutinefunction(getattr(cls, name)), name


# The same results, the same ValidationErrors, a closed store's refusals and
# exactly-once claims under many coroutines are the contract suite's
# (alkstore_contract_tests/suite/async_surface.py), run on every engine.


# -- the loop is never blocked ----------------------------------------------


def test_slow_operations_never_block_the_loop(url: str, caplog: pytest.LogCaptureFixture) -> None:
    """8 coroutines claim and ack while another connection holds the
    database's write lock: their operations wait on the pool's threads,
    the loop keeps ticking, and debug mode reports no slow callback."""
    path = url.removeprefix("sqlite:///")
    jobs = 80
    locked, release = threading.Event(), threading.Event()

    def hold_write_lock() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            locked.set()
            release.wait(30)
            conn.execute("COMMIT")
        finally:
            conn.close()

    async def main() -> tuple[int, int, list[int]]:
        loop = asyncio.get_running_loop()
        loop.slow_callback_duration = 0.005
        store = await alkstore.open_async(url, busy_timeout_s=30)
        assert isinstance(store, ThreadedAsyncStore)
        try:
            q = store.queue("q")
            ids = await q.enqueue_many(list(range(jobs)))
            holder = threading.Thread(target=hold_write_lock)
            holder.start()
            assert await store._run(locked.wait, 10)  # on the started pool
            done: list[int] = []
            ticks_while_locked = 0

            async def worker(n: int) -> None:
                while True:
                    handles = await q.claim_batch(f"w{n}", 3)
                    if not handles:
                        return
                    assert await q.ack_batch([h.id for h in handles]) == len(handles)
                    done.extend(h.id for h in handles)

            async def ticker() -> None:
                nonlocal ticks_while_locked
                while not done and ticks_while_locked < 50:
                    ticks_while_locked += 1
                    await asyncio.sleep(0.001)
                release.set()

            try:
                await asyncio.gather(ticker(), *(worker(n) for n in range(8)))
            finally:
                release.set()
                holder.join(30)
            return ticks_while_locked, len(done), sorted(done) == ids and done
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        ticks, acked, ok = run(main())
    # The ticker ran 50 times while every claim waited for the lock (had
    # one blocked the loop, the lock would never have been released).
    assert ticks == 50
    assert acked == jobs
    assert ok
    # An operation run on the loop would wait there for the lock: until
    # the ticker's 50th tick, which could then never come, so for the
    # busy timeout (30 s). Debug mode reports steps above 5 ms; on a busy
    # host (here 2 cores, 9 threads of ours, other tests beside) the OS
    # alone stalls a step by 5 to 110 ms now and then: scheduling, not
    # blocking. So a step counts as blocked from 0.25 s.
    took = [
        float(m.group(1))
        for r in caplog.records
        if r.name == "asyncio" and (m := re.search(r"took (\d+\.\d+) seconds", r.getMessage()))
    ]
    assert [t for t in took if t >= 0.25] == []


# -- subscriptions ------------------------------------------------------------


@pytest.fixture
def short_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threaded, "WAIT_SLICE_S", 0.05)


def test_a_wait_returns_on_a_wake_and_a_poll_consumes_it(url: str) -> None:
    async def main() -> list[bool]:
        async with alkstore.open_async(url) as store:
            q = store.queue("q")
            async with await store.listen("q") as sub:
                waiting = asyncio.create_task(sub.wait(10))
                await q.enqueue(1)
                woken = await asyncio.wait_for(waiting, 10)
                await q.enqueue(2)
                await q.enqueue(3)
                return [woken, await sub.wait(5), await sub.wait(0)]

    assert run(main()) == [True, True, False]


async def cancelled_wait(sub: AsyncSubscription) -> asyncio.Future[bool]:
    """Start ``sub.wait(3600)``, cancel it once its blocking slice runs;
    return that slice, left running."""
    assert isinstance(sub, threaded.ThreadedAsyncSubscription)
    waiting = asyncio.create_task(sub.wait(3600))
    while sub._inflight is None:
        await asyncio.sleep(0.001)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    inflight = sub._inflight
    assert inflight is not None
    assert not inflight.done()
    return inflight


@pytest.mark.usefixtures("short_slices")
def test_a_cancelled_wait_frees_its_thread_within_a_slice(url: str) -> None:
    async def main() -> bool:
        async with alkstore.open_async(url) as store, await store.listen("q") as sub:
            inflight = await cancelled_wait(sub)
            # The abandoned slice ends by itself (0.05 s here, not 3600 s).
            return await asyncio.wait_for(asyncio.shield(inflight), 5)

    assert run(main()) is False


def test_a_wake_taken_by_a_cancelled_wait_goes_to_the_next_wait(url: str) -> None:
    async def main() -> list[bool]:
        async with alkstore.open_async(url) as store, await store.listen("q") as sub:
            inflight = await cancelled_wait(sub)
            await store.queue("q").enqueue(1)
            # The abandoned slice (1 s) consumes the wake; the next wait
            # gets it rather than waiting out its 5 s for a wake gone.
            assert await asyncio.wait_for(asyncio.shield(inflight), 5) is True
            return [await sub.wait(5), await sub.wait(0)]

    assert run(main()) == [True, False]


def test_closing_the_store_releases_a_waiting_subscription(url: str) -> None:
    async def main() -> None:
        store = await alkstore.open_async(url)
        sub = await store.listen("q")
        waiting = asyncio.create_task(sub.wait(3600))
        while sub._inflight is None:  # type: ignore[attr-defined]
            await asyncio.sleep(0.001)
        await store.close()
        with pytest.raises(StoreClosedError):
            await asyncio.wait_for(waiting, 10)
        await sub.close()

    run(main())


def test_a_store_over_a_store_its_owner_closed_counts_as_closed(url: str) -> None:
    """``owns_store=False`` (an app's async store over the app's given
    store): once the owner closes the sync store, the async one is closed
    too, by its flag as by its operations, so the loops that stop on a
    closed store stop: ``AsyncScheduler.run`` raises ``StoreClosedError``
    as ``Scheduler.run`` does."""
    given = alkstore.open(url)

    async def main() -> bool:
        astore = threaded.threaded_over(given, owns_store=False, max_threads=2)
        assert not astore.closed
        ticking = asyncio.create_task(alkstore.AsyncScheduler(astore).run(interval_s=0.05))
        await asyncio.sleep(0)  # it ticks
        given.close()
        with pytest.raises(StoreClosedError):
            await astore.queue("q").stats()
        with pytest.raises(StoreClosedError):
            await asyncio.wait_for(ticking, 10)
        closed = astore.closed
        await astore.close()
        return closed

    assert run(main()) is True


def test_closing_a_subscription_after_its_store_is_quiet(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As on the sync store: the store's close closed it; closing it again
    neither raises nor logs."""

    async def main() -> None:
        store = await alkstore.open_async(url)
        sub = await store.listen("q")
        await store.close()
        await sub.close()
        with pytest.raises(StoreClosedError):
            await sub.wait(0)

    with caplog.at_level(logging.WARNING, logger="alkstore"):
        run(main())
    assert caplog.records == []


# A fresh interpreter (no zone's data cached, no module of the cron yet):
# an audit hook records the files opened by the event loop's thread while
# a schedule is saved and ticked through the async surface.
_SCHEDULE_ON_THE_LOOP = """
import asyncio, sys, threading
from datetime import UTC, datetime, timedelta
import alkstore
from alkstore_contract_tests import ManualClock

seen, watching = [], []
def hook(event, args):
    if watching and event in ("open", "os.listdir", "os.scandir") and (
        threading.current_thread() is watching[0]
    ):
        seen.append(f"{event} {args[0]}")
sys.addaudithook(hook)

async def main():
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    async with alkstore.open_async(sys.argv[1], clock=clock) as store:
        watching.append(threading.current_thread())
        await store.schedule("s", "0 9 * * *", "q", 1, timezone="Asia/Tokyo")
        clock.advance(timedelta(days=1))
        fired = await alkstore.AsyncScheduler(store).tick()
        watching.clear()
        return fired

print(asyncio.run(main()), seen)
"""


def test_saving_and_ticking_a_schedule_reads_no_file_on_the_loop(url: str) -> None:
    """A zone's first use reads its data, and the cron module's first use
    imports it: ``AsyncStore.schedule`` and ``AsyncScheduler.tick`` do that
    off the event loop."""
    done = subprocess.run(
        [sys.executable, "-c", _SCHEDULE_ON_THE_LOOP, url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[1] []"


# -- open_async ---------------------------------------------------------------


def test_open_async_checks_the_url_at_the_call(tmp_path: Path) -> None:
    for bad in ("no-scheme", "sqlite:///a\x00b", 5):
        with pytest.raises(ValidationError) as got:
            alkstore.open_async(bad)  # type: ignore[arg-type]
        with pytest.raises(ValidationError) as expected:
            alkstore.open(bad)  # type: ignore[arg-type]
        assert str(got.value) == str(expected.value)
    # The engine is found off the loop, when the store opens.
    opening = alkstore.open_async("nosuch://x")
    with pytest.raises(UnknownEngineError, match="'nosuch'"):
        run(opening)


def test_open_async_raises_the_engines_errors_on_await(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ValidationError) as expected:
        alkstore.open(url, busy_timeout_s=-1)

    async def main() -> None:
        opening = alkstore.open_async(url, busy_timeout_s=-1)
        with pytest.raises(ValidationError) as got:
            await opening
        assert str(got.value) == str(expected.value)
        with pytest.raises(ValidationError, match="unknown"):
            async with alkstore.open_async(url, no_such_option=1):
                pass

    run(main())


def test_a_store_opened_after_open_async_was_cancelled_is_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The factory runs on a thread: a cancelled ``open_async`` cannot stop
    it, so the store it opens after the cancellation is closed, and nothing
    is left for asyncio to report."""
    opening, release = threading.Event(), threading.Event()
    opened: list[Store] = []

    def slow_factory(url: str, **options: Any) -> Store:
        opening.set()
        assert release.wait(30)  # a slow open (connecting, migrating)
        store = alkstore.open(f"sqlite:///{tmp_path / 'slow.db'}", **options)
        opened.append(store)
        return store

    alkstore.register("slow-test", slow_factory)

    async def main() -> None:
        task = asyncio.create_task(alkstore.open_async("slow-test://x"))  # type: ignore[arg-type]
        assert await asyncio.to_thread(opening.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        deadline = asyncio.get_running_loop().time() + 30
        while not (opened and opened[0].closed):
            assert asyncio.get_running_loop().time() < deadline, "the store was left open"
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.ERROR):
        run(main())
    assert [r.getMessage() for r in caplog.records] == []


def test_an_engine_with_native_async_is_used(tmp_path: Path) -> None:
    opened: list[str] = []

    def factory(url: str, **options: Any) -> Store:
        raise AssertionError("the sync factory must not be called")

    async def open_native(url: str, **options: Any) -> AsyncStore:
        opened.append(url)
        sync = alkstore.open(f"sqlite:///{tmp_path / 'n.db'}", **options)
        return ThreadedAsyncStore(sync, max_threads=2)

    factory.open_async = open_native  # type: ignore[attr-defined]
    alkstore.register("native-test", factory)

    async def main() -> int:
        async with alkstore.open_async("native-test://x", migrate=True) as store:
            return await store.queue("q").enqueue(1)

    assert run(main()) == 1
    assert opened == ["native-test://x"]

    async def wrong(url: str, **options: Any) -> object:
        return object()

    factory.open_async = wrong  # type: ignore[attr-defined]
    with pytest.raises(EngineError, match="not an AsyncStore"):
        run(alkstore.open_async("native-test://x"))


def test_threaded_store_checks_its_arguments(url: str) -> None:
    with pytest.raises(ValidationError, match="needs a Store"):
        ThreadedAsyncStore(object())  # type: ignore[arg-type]
    with alkstore.open(url) as store, pytest.raises(ValidationError, match="max_threads"):
        ThreadedAsyncStore(store, max_threads=0)


def test_importing_alkstore_imports_no_asyncio() -> None:
    code = (
        "import sys, alkstore; "
        "print(sorted(m for m in ('asyncio', 'concurrent.futures', 'alkstore.contract.threaded')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_store_primitives_the_runtime_uses_run_on_the_pool(url: str) -> None:
    """The maintenance turn, schema version and schedule firing, as the
    sync store gives them."""

    async def main() -> list[Any]:
        async with alkstore.open_async(url, clock=ManualClock()) as store:
            assert isinstance(store, ThreadedAsyncStore)
            seen: list[Any] = [await store._schema_version()]
            assert seen[0] == store.sync_store._schema_version()
            async with store._maintenance_turn("sweep", 60) as granted:
                seen.append(granted)
            async with store._maintenance_turn("sweep", 60) as granted:
                seen.append(granted)  # the last turn was less than 60 s ago

            async def failing_turn() -> None:
                async with store._maintenance_turn("other", 0) as granted:
                    seen.append(granted)
                    raise KeyError("the turn is released on an error")

            with pytest.raises(KeyError):
                await failing_turn()
            async with store._maintenance_turn("other", 0) as granted:
                seen.append(granted)
            schedule = await store.schedule("tick", "@every 1m", "q", {"n": 1})
            resolved = alkstore.resolve(
                schedule.next_run_at, QueueOpts(), alkstore.enqueue_options()
            )
            payload = alkstore.encode_payload({"n": 1})
            fired = await store._fire_schedule(
                schedule, schedule.next_run_at, schedule.next_run_at, resolved, payload
            )
            seen += [fired, await store._skip_schedule(schedule, schedule.next_run_at)]
            seen.append(await store.queue("q").stats())
            return seen

    got = run(main())
    # The sync store's answer: the schema version SQLite's engine writes.
    assert isinstance(got[0], int)
    assert got[0] >= 1
    # The skip finds the schedule as the fire left it (the same boundary);
    # the job is due at the boundary, a minute ahead.
    assert got[1:] == [True, False, True, True, 1, True, alkstore.QueueStats(0, 1, 0, 0)]
