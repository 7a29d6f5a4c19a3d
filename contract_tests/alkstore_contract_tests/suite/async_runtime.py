"""The runtime's async forms on every engine: :class:`AsyncRuntimeTests`.

:class:`~alkstore.AsyncScheduler`, :class:`~alkstore.AsyncSweeper` and
:class:`~alkstore.AsyncOutbox` over the store :func:`alkstore.open_async`
opens on the target (the engine's native async store when it has one, else
the core's thread adapter). Each scenario is written once and run twice on
one target: through the sync class on a sync store, then through the async
class on the async store, on queues and schedules of its own and from a
fresh instant; the two runs must give the same results (docs/schedules.md,
docs/operations.md, docs/outbox.md).

Every test here is named ``test_async_runtime_...``, so ``-k async_runtime``
selects them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from alkstore import (
    AsyncOutbox,
    AsyncScheduler,
    AsyncSweeper,
    Outbox,
    QueueOpts,
    Scheduler,
    Sweeper,
    ValidationError,
)
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import RecordingRng, StoreFactory
from alkstore_contract_tests.harness import StoreTarget
from alkstore_contract_tests.suite.async_surface import (
    AsyncAppFixtures,
    Call,
    async_call,
    run_on_a_loop,
    sync_call,
)
from alkstore_contract_tests.suite.outbox import FlakySend
from alkstore_contract_tests.suite.wake import WAKE_TIMEOUT_S

__all__ = ["AsyncRuntimeTests"]

#: Where each scenario's two runs start: the sync run at ``T0``, the async
#: one an hour later (both on minute boundaries, which ``@every 60s``
#: schedules fire at).
ASYNC_START = T0 + timedelta(hours=1)


def _relative(value: datetime | None, base: datetime) -> float | None:
    return None if value is None else (value - base).total_seconds()


def _first_line(text: str | None) -> str | None:
    return None if text is None else text.split("\n", 1)[0]


async def scheduler_scenario(
    store: Any, scheduler: Any, call: Call, clock: ManualClock, prefix: str
) -> list[Any]:
    """Two ``@every 60s`` schedules (one ``catch_up="skip"``) ticked before,
    at and after their boundaries, and after an outage; the schedules are
    deleted at the end. Instants relative to the run's start."""
    base = clock()
    r: list[Any] = []
    reports = store.queue(f"{prefix}-reports", QueueOpts(max_attempts=3))
    await call(store.schedule, f"{prefix}-every", "@every 60s", reports, {"n": 1}, priority=2)
    await call(
        store.schedule, f"{prefix}-skip", "@every 60s", f"{prefix}-other", "x", catch_up="skip"
    )
    r.append(await call(scheduler.tick))
    clock.set(base + timedelta(seconds=60))
    fired = await call(scheduler.tick)
    r.append(len(fired))
    for job_id in fired:
        queue = store.queue(f"{prefix}-reports" if job_id == fired[0] else f"{prefix}-other")
        job = await call(queue.get_job, job_id)
        r.append((job.payload, _relative(job.run_at, base), job.priority, job.max_attempts))
    r.append(await call(scheduler.tick))
    clock.set(base + timedelta(seconds=345))  # the 300 s boundary: 45 s late
    r.append(len(await call(scheduler.tick)))
    for schedule in await call(store.schedules):
        if schedule.name.startswith(prefix):
            r.append(
                (
                    schedule.name.replace(f"{prefix}-", "<p>-", 1),
                    _relative(schedule.next_run_at, base),
                    _relative(schedule.last_run_at, base),
                )
            )
            await call(store.unschedule, schedule.name)
    return r


async def sweeper_scenario(
    store: Any, sweeper: Any, call: Call, clock: ManualClock, prefix: str
) -> list[Any]:
    """An expired job, a claimed expired job and a dead letter past its
    queue's retention, swept in the sweep's turn, then not again within
    the interval, then again after it."""
    base = clock()
    r: list[Any] = []
    a, b, c = (store.queue(f"{prefix}-{n}") for n in "abc")
    expiring = await call(a.enqueue, "x", expires=10)
    working = await call(b.enqueue, "y", expires=10)
    assert (await call(b.claim_one, "w")).id == working
    buried = await call(c.enqueue, "z")
    assert await call((await call(c.claim_one, "w")).fail, "bad")
    clock.set(base + timedelta(seconds=10))

    def own(result: dict[str, Any] | None) -> Any:
        if result is None:
            return None
        mine = f"{prefix}-"
        return {
            k.replace(mine, "<p>-", 1): tuple(v) for k, v in result.items() if k.startswith(mine)
        }

    r.append(own(await call(sweeper.run_once)))
    for queue, job_id in ((a, expiring), (b, working), (c, buried)):
        job = await call(queue.get_job, job_id)
        r.append(None if job is None else (job.state, job.last_error, _relative(job.died_at, base)))
    clock.set(base + timedelta(seconds=69))
    r.append(own(await call(sweeper.run_once)))
    clock.set(base + timedelta(seconds=70))
    r.append(own(await call(sweeper.run_once)))
    return r


class AsyncFlakySend(FlakySend):
    """The outbox suite's ``FlakySend`` as a coroutine function's object:
    each call yields to the loop, then fails or delivers as ``FlakySend``."""

    async def __call__(self, message: Any) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        super().__call__(message)


async def outbox_scenario(
    outbox: Any, send: Callable[[Any], object], call: Call, clock: ManualClock
) -> list[Any]:
    """The outbox suite's flaky-send scenario: over repeated ``relay_once``
    calls every message but the poison one is delivered once, failures are
    retried with the backoff, and the poison message dies at its budget."""
    base = clock()
    q = outbox.queue
    ids = await call(q.enqueue_many, ["m0", "m1", "m2", "poison", "m3", "m4"])
    r: list[Any] = []

    async def states() -> list[Any]:
        out = []
        for job_id in ids:
            job = await call(q.get_job, job_id)
            out.append(
                None
                if job is None
                else (
                    job.state,
                    job.attempts,
                    _relative(job.run_at, base),
                    _first_line(job.last_error),
                )
            )
        return out

    for at_s in (0, 4, 12, 1000):
        clock.set(base + timedelta(seconds=at_s))
        r.append(await call(outbox.relay_once, send, worker_id="relay"))
        r.append(await states())
    r.append(tuple(await call(q.stats)))
    return r


class AsyncRuntimeTests(AsyncAppFixtures):
    """:class:`~alkstore.AsyncScheduler`, :class:`~alkstore.AsyncSweeper`
    and :class:`~alkstore.AsyncOutbox` give the results of their sync forms
    on this engine."""

    def test_async_runtime_scheduler_ticks_as_the_sync_one(
        self, open_store: StoreFactory, async_store: Callable[..., Any], clock: ManualClock
    ) -> None:
        store = open_store()
        sync = run_on_a_loop(scheduler_scenario(store, Scheduler(store), sync_call, clock, "s1"))

        async def on_async() -> list[Any]:
            clock.set(ASYNC_START)
            async with async_store(clock=clock) as astore:
                scheduler = AsyncScheduler(astore, misfire_grace_s=60)
                return await scheduler_scenario(astore, scheduler, async_call, clock, "a1")

        assert run_on_a_loop(on_async()) == sync
        assert sync == [
            [],
            2,
            ({"n": 1}, 60.0, 2, 3),
            ("x", 60.0, 0, 5),
            [],
            2,  # both fire the 300 s boundary: 45 s late is within 60 s of grace
            ("<p>-every", 360.0, 300.0),
            ("<p>-skip", 360.0, 300.0),
        ]

    def test_async_runtime_scheduler_run_stops_on_its_event(
        self, async_store: Callable[..., Any], clock: ManualClock
    ) -> None:
        """``AsyncScheduler.run`` ticks until its ``asyncio.Event`` is set,
        letting the loop turn between ticks."""

        async def main() -> list[Any]:
            async with async_store(clock=clock) as astore:
                await astore.schedule("every", "@every 60s", "reports", "x")
                clock.set(T0 + timedelta(seconds=60))
                stop = asyncio.Event()
                run = asyncio.create_task(AsyncScheduler(astore).run(interval_s=0.01, stop=stop))
                queue = astore.queue("reports")

                async def fired() -> None:
                    while (await queue.stats()).pending == 0:
                        await asyncio.sleep(0.01)

                await asyncio.wait_for(fired(), WAKE_TIMEOUT_S)
                stop.set()
                await asyncio.wait_for(run, WAKE_TIMEOUT_S)
                with pytest.raises(ValidationError, match="interval_s"):
                    await AsyncScheduler(astore).run(interval_s=0)
                return [tuple(await queue.stats())]

        assert run_on_a_loop(main()) == [(1, 0, 0, 0)]

    def test_async_runtime_sweeper_sweeps_as_the_sync_one(
        self, open_store: StoreFactory, async_store: Callable[..., Any], clock: ManualClock
    ) -> None:
        store = open_store()
        retention = {"s1-c": 5}
        sync = run_on_a_loop(
            sweeper_scenario(
                store, Sweeper(store, interval_s=60, retention=retention), sync_call, clock, "s1"
            )
        )

        async def on_async() -> list[Any]:
            clock.set(ASYNC_START)
            async with async_store(clock=clock) as astore:
                sweeper = AsyncSweeper(astore, interval_s=60, retention={"a1-c": 5})
                assert sweeper.interval_s == 60
                return await sweeper_scenario(astore, sweeper, async_call, clock, "a1")

        assert run_on_a_loop(on_async()) == sync
        assert sync == [
            {"<p>-a": (1, 0), "<p>-b": (1, 0), "<p>-c": (0, 1)},
            ("dead", "expired", 10.0),
            ("dead", "expired", 10.0),
            None,
            None,
            {"<p>-a": (0, 0), "<p>-b": (0, 0)},
        ]

    def test_async_runtime_outbox_relays_as_the_sync_one(
        self, open_store: StoreFactory, async_store: Callable[..., Any], clock: ManualClock
    ) -> None:
        """The same flaky sends, relayed by :class:`Outbox` from sync code
        and by :class:`AsyncOutbox` with an ``async def`` send, end the
        same: delivered once each, retried with the backoff, the poison
        message dead at its budget."""
        opts = QueueOpts(max_attempts=3, backoff_base_s=4)
        store = open_store(rng=RecordingRng())
        flaky = FlakySend(every=3)
        sync = run_on_a_loop(
            outbox_scenario(Outbox(store.queue("s-outbox", opts)), flaky, sync_call, clock)
        )
        async_flaky = AsyncFlakySend(every=3)

        async def on_async() -> list[Any]:
            clock.set(ASYNC_START)
            async with async_store(clock=clock, rng=RecordingRng()) as astore:
                outbox = AsyncOutbox(astore.queue("a-outbox", opts))
                return await outbox_scenario(outbox, async_flaky, async_call, clock)

        assert run_on_a_loop(on_async()) == sync
        assert async_flaky.delivered == flaky.delivered == ["m0", "m1", "m3", "m2", "m4"]
        assert sync[0] == 3
        assert sync[-1] == (0, 0, 0, 1)
        poison = sync[-2][3]
        assert poison[:3] == ("dead", 3, 12.0)
        assert poison[3] is not None
        assert poison[3].startswith("max attempts exceeded; last error: RuntimeError: poison")

    def test_async_runtime_outbox_add_commits_with_the_callers_transaction(
        self, alkstore_target: StoreTarget, async_store: Callable[..., Any], clock: ManualClock
    ) -> None:
        """``AsyncOutbox.add`` writes in the caller's transaction (the
        harness's ``async_app_connection``): a rollback leaves no message, a
        commit one that ``relay`` delivers, woken, until its
        ``asyncio.Event`` is set."""

        async def main() -> list[Any]:
            async with (
                async_store(clock=clock) as astore,
                self.async_app(alkstore_target) as app,
            ):
                outbox = AsyncOutbox(astore.queue("outbox"))
                await app.begin()
                await app.execute("INSERT INTO orders (id) VALUES (1)")
                rolled_back = await outbox.add(app.conn, {"order": 1})
                await app.rollback()
                gone = await outbox.queue.get_job(rolled_back)
                sent: list[Any] = []
                delivered = asyncio.Event()
                stop = asyncio.Event()

                async def send(message: Any) -> None:
                    sent.append(message)
                    delivered.set()

                relay = asyncio.create_task(
                    outbox.relay(send, worker_id="relay", stop=stop, poll_interval_s=WAKE_TIMEOUT_S)
                )
                await app.begin()
                await app.execute("INSERT INTO orders (id) VALUES (2)")
                await outbox.add(app.conn, {"order": 2}, priority=3)
                await app.commit()
                await asyncio.wait_for(delivered.wait(), 2 * WAKE_TIMEOUT_S)
                stop.set()
                total = await asyncio.wait_for(relay, 2 * WAKE_TIMEOUT_S)
                return [gone, sent, total, tuple(await outbox.queue.stats()), await app.orders()]

        assert run_on_a_loop(main()) == [None, [{"order": 2}], 1, (0, 0, 0, 0), [2]]

    def test_async_runtime_outbox_refuses_what_the_sync_one_refuses(
        self, open_store: StoreFactory, async_store: Callable[..., Any], clock: ManualClock
    ) -> None:
        """The same arguments are refused with the same words (the sync
        module is generated from the async one: only the class names and
        the event's kind differ)."""
        store = open_store()
        outbox = Outbox(store.queue("outbox"))
        expected = []
        sync_calls: list[Callable[[], object]] = [
            lambda: outbox.relay_once(print, worker_id="relay", batch_size=0),
            lambda: outbox.relay_once("nope", worker_id="relay"),  # type: ignore[arg-type]
            lambda: outbox.relay_once(print, worker_id=""),
            lambda: outbox.relay(print, worker_id="relay", stop=True),  # type: ignore[arg-type]
            lambda: Outbox("outbox"),  # type: ignore[arg-type]
        ]
        for sync_refused in sync_calls:
            with pytest.raises(ValidationError) as refused:
                sync_refused()
            expected.append(str(refused.value))

        async def main() -> list[str]:
            got = []
            async with async_store(clock=clock) as astore:
                aoutbox = AsyncOutbox(astore.queue("outbox"))
                async_calls: list[Callable[[], Awaitable[object]]] = [
                    lambda: aoutbox.relay_once(print, worker_id="relay", batch_size=0),
                    lambda: aoutbox.relay_once("nope", worker_id="relay"),  # type: ignore[arg-type]
                    lambda: aoutbox.relay_once(print, worker_id=""),
                    lambda: aoutbox.relay(print, worker_id="relay", stop=True),  # type: ignore[arg-type]
                ]
                for async_refused in async_calls:
                    with pytest.raises(ValidationError) as refused:
                        await async_refused()
                    got.append(str(refused.value))
                with pytest.raises(ValidationError) as refused:
                    AsyncOutbox("outbox")  # type: ignore[arg-type]
                got.append(str(refused.value))
            return got

        got = run_on_a_loop(main())
        assert [g.replace("AsyncOutbox", "Outbox") for g in got] == [
            e.replace("a threading.Event", "an asyncio.Event").replace("a Queue", "an AsyncQueue")
            for e in expected
        ]
