"""The async surface on every engine: the store that :func:`alkstore.open_async`
opens on the harness's target, whether the engine has native async
primitives (its factory's ``open_async``) or only sync ones, which the
core's thread adapter runs on its threads (docs/async.md).

What it checks:

- every :class:`~alkstore.AsyncQueue`, :class:`~alkstore.AsyncJobHandle` and
  :class:`~alkstore.AsyncStore` operation gives the result the sync
  operation gives (one scenario, run through both surfaces on one target
  and compared), and every bad argument the same ``ValidationError``,
  before any write (docs/contract.md §3 "Validation");
- exactly-once claims with many coroutines on one async store, and with
  several processes each running an event loop of coroutines
  (docs/contract.md §3 "Claim");
- the state machine of :mod:`.stateful` driving the async API against the
  model;
- ``enqueue_tx`` through the async surface on the harness's application
  connection for it (``async_app_connection``; docs/contract.md §3
  "Transactional enqueue");
- the event loop is never blocked: every operation that reads or writes
  the database yields to the loop while it waits, and a ticker keeps
  ticking while many coroutines work.

Every test here is named ``test_async_surface_...``, so
``-k async_surface`` selects them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from alkstore import (
    AsyncJobHandle,
    AsyncQueue,
    AsyncStore,
    Job,
    JobHandle,
    QueueOpts,
    QueueStats,
    Store,
    StoreClosedError,
    ValidationError,
)
from alkstore_contract_tests import _children
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, StoreFactory
from alkstore_contract_tests.harness import EngineHarness, StoreTarget, resolved
from alkstore_contract_tests.suite.concurrency import SpawnFixtures, _Spawner
from alkstore_contract_tests.suite.stateful import QueueMachine, stateful_settings
from alkstore_contract_tests.suite.validation import (
    BAD_DURATIONS,
    BAD_ERRORS,
    BAD_INT32_PRIORITIES,
    BAD_MAX_ATTEMPTS,
    BAD_N,
    BAD_POSITIVE_DURATIONS,
    BAD_RUN_AT,
    BAD_WORKER_IDS,
)
from alkstore_contract_tests.suite.wake import QUIET_S, WAKE_TIMEOUT_S

__all__ = [
    "AsyncAppFixtures",
    "AsyncApp",
    "AsyncConcurrencyTests",
    "AsyncLoopTests",
    "AsyncStatefulTests",
    "AsyncSurfaceTests",
    "AsyncTransactionalTests",
    "OnLoop",
    "async_call",
    "run_on_a_loop",
    "sync_call",
]

T = TypeVar("T")
#: ``call(fn, *args, **kwargs)``: one operation through one surface.
Call = Callable[..., Awaitable[Any]]

#: The longest step of the event loop a test tolerates, in seconds: above
#: the stalls a busy host's scheduler alone causes (tens of milliseconds),
#: far below one blocked database wait (docs/async.md).
SLOW_STEP_S = 0.25


def run_on_a_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh event loop in debug mode (asyncio then also
    checks that no callback is scheduled from a wrong thread)."""
    return asyncio.run(coro, debug=True)


async def sync_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One operation of the sync surface."""
    return fn(*args, **kwargs)


async def async_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One operation of the async surface: the coroutine, awaited."""
    result = fn(*args, **kwargs)
    assert inspect.isawaitable(result), f"{fn.__qualname__} returned {result!r}, not a coroutine"
    return await result


class AsyncFixtures(ContractFixtures):
    """:meth:`async_store`: the async store of the test's target."""

    @pytest.fixture
    def async_store(self, alkstore_target: StoreTarget) -> Callable[..., Any]:
        """``async with async_store(**options) as store``: an
        :class:`~alkstore.AsyncStore` on the test's target, opened with
        the harness's :meth:`~alkstore_contract_tests.EngineHarness.open_async_store`
        (``options`` such as ``clock=`` and ``rng=`` override the target's)
        and closed on leaving."""

        @asynccontextmanager
        async def opened(**options: Any) -> AsyncIterator[AsyncStore]:
            store = await self.open_async_store(alkstore_target, **options)
            assert isinstance(store, AsyncStore), store
            try:
                yield store
            finally:
                await store.close()

        return opened


# -- the same results through both surfaces ----------------------------------


class _Shown:
    """Results made comparable between two runs on one target: job ids as
    their order of enqueue in the run, the run's queue-name prefix as
    ``<p>``, a handle as its claim-time job."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.ids: list[int] = []

    def new(self, got: int | list[int]) -> list[int]:
        ids = got if isinstance(got, list) else [got]
        assert all(type(i) is int and i not in self.ids for i in ids), ids
        self.ids.extend(ids)
        return [self.index(i) for i in ids]

    def index(self, job_id: int) -> int:
        return self.ids.index(job_id) if job_id in self.ids else -1

    def __call__(self, value: Any) -> Any:
        if isinstance(value, JobHandle | AsyncJobHandle):
            return ("handle", self(value.job))
        if isinstance(value, Job):
            return ("job", self({**vars(value), "id": self.index(value.id)}))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return (type(value).__name__, self(vars(value)))
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items() if k != "payload"}
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return (type(value).__name__, tuple(self(v) for v in value))
        if isinstance(value, list | tuple):
            return type(value)(self(v) for v in value)
        if isinstance(value, str):
            return value.replace(self.prefix, "<p>")
        return value


async def surface_scenario(store: Any, call: Call, clock: ManualClock, prefix: str) -> list[Any]:
    """Every queue, handle and store operation at least once, on queues
    named ``prefix-...``; the results, as :class:`_Shown`."""
    shown = _Shown(prefix)
    q = store.queue(
        f"{prefix}-q", QueueOpts(visibility_timeout_s=30, max_attempts=2, expires_s=600)
    )
    r: list[Any] = []
    r.append(shown.new(await call(q.enqueue, {"a": 1})))
    r.append(shown.new(await call(q.enqueue, b"raw", delay=5, priority=2, expires=60)))
    r.append(shown.new(await call(q.enqueue_many, [1, 2, 3], priority=1, max_attempts=3)))
    r.append(shown.new(await call(q.enqueue_many, [])))
    r.append(await call(q.stats))
    first = await call(q.claim_one, "w1")
    pair = await call(q.claim_batch, "w2", 2)
    r += [first, pair, await call(q.claim_batch, "w2", 0)]
    r.append(await call(first.heartbeat, 10))
    r += [await call(first.ack), await call(first.ack)]  # the second: spent
    r.append(await call(pair[0].retry, "boom"))  # the backoff draws from rng
    r.append(await call(pair[1].fail, "bad"))
    r += [await call(q.get_job, pair[0].id), await call(q.get_job, pair[1].id)]
    r += [await call(q.dead_jobs), await call(q.dead_jobs, 1, after_id=0)]
    r += [await call(q.requeue, pair[1].id, delay=1), await call(q.requeue, 10**12)]
    lapsing = await call(q.claim_one, "w3")
    r += [lapsing, await call(q.lapsed_claims)]
    clock.advance(31)
    r += [await call(q.lapsed_claims), await call(lapsing.ack), await call(lapsing.retry, "x")]
    r.append(await call(q.ack_batch, [lapsing.id, 10**12]))
    # ack_many by claim identity: a held claim, the same handle again, a
    # spent one, and one whose claim lapsed.
    held, stale = await call(q.claim_batch, "w5", 2)
    clock.advance(1)
    r += [held, stale, await call(q.ack_many, [])]
    r.append(await call(q.ack_many, [held, held, first]))
    clock.advance(30)
    r.append(await call(q.ack_many, [stale]))
    # release: a claim given back, due again at once; the handle is spent.
    given = await call(q.claim_one, "w6")
    r += [given, await call(given.release), await call(given.release)]
    r += [await call(q.get_job, given.id), await call(q.claim_one, "w7")]
    r += [await call(q.pause), await call(q.pause), await call(q.is_paused)]
    r += [await call(q.claim_one, "w4"), await call(q.resume), await call(q.resume)]
    r += [await call(q.is_paused), await call(q.cancel, shown.ids[4])]
    r.append(await call(q.cancel, 10**12))
    clock.advance(700)
    r += [await call(q.sweep_expired), await call(q.purge_dead, 10), await call(q.purge_dead)]
    r += [await call(q.stats), await call(q.get_job, shown.ids[0])]
    # The store's own operations.
    tick = f"{prefix}-tick"
    r.append(await call(store.schedule, tick, "@every 1m", q, {"s": 1}, priority=4))
    r.append(await call(store.schedule, tick, "@every 1m", q.name, {"s": 1}, priority=4))
    r.append([s for s in await call(store.schedules) if s.name.startswith(prefix)])
    r.append(await call(store.unreadable_schedules))
    r += [await call(store.unschedule, tick), await call(store.unschedule, tick)]
    r.append([n for n in await call(store.queue_names) if n.startswith(prefix)])
    r.append(await call(store.migrate))
    # A subscription: woken by an enqueue on its queue.
    subscription = await call(store.listen, q.name)
    try:
        r.append(shown.new(await call(q.enqueue, "wake")))
        r.append(await call(subscription.wait, WAKE_TIMEOUT_S))
    finally:
        await call(subscription.close)
    return [shown(v) for v in r]


def _bad_calls() -> list[tuple[str, str, tuple[Any, ...], dict[str, Any]]]:
    """``(object, method, args, kwargs)``: one bad argument each, drawn from
    the sync suite's tables of bad values (:mod:`.validation`); ``object``
    is ``"queue"``, ``"handle"``, ``"store"`` or ``"subscription"``. Built
    once, as :data:`BAD_CALLS`, so both surfaces get the same objects."""
    calls: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = []
    for name in ("enqueue", "enqueue_many"):
        payload: Any = "x" if name == "enqueue" else ["x", "y"]
        calls += [("queue", name, (payload,), {"delay": d}) for d in BAD_DURATIONS]
        calls += [("queue", name, (payload,), {"expires": d}) for d in BAD_POSITIVE_DURATIONS]
        calls += [("queue", name, (payload,), {"run_at": r}) for r in BAD_RUN_AT]
        calls += [
            ("queue", name, (payload,), {"priority": p})
            for p in BAD_INT32_PRIORITIES
            if p is not None
        ]
        calls += [("queue", name, (payload,), {"max_attempts": m}) for m in BAD_MAX_ATTEMPTS]
        calls.append(("queue", name, (payload,), {"delay": 10, "expires": 5}))
    for payload in (object(), float("nan"), {"s": "\ud800"}, {1: "int key"}):
        calls.append(("queue", "enqueue", (payload,), {}))
        calls.append(("queue", "enqueue_many", (["ok", payload],), {}))
    calls += [("queue", "enqueue_many", (bad,), {}) for bad in ("abc", b"abc", {"a": 1}, 5)]
    calls += [
        ("queue", "enqueue_tx", (object(), 1), {}),
        ("queue", "enqueue_tx", (None, 1), {}),
    ]
    for worker_id in BAD_WORKER_IDS:
        calls += [
            ("queue", "claim_one", (worker_id,), {}),
            ("queue", "claim_batch", (worker_id, 3), {}),
        ]
    calls += [("queue", "claim_batch", ("w", n), {}) for n in BAD_N]
    calls += [
        ("queue", "ack_batch", ("12",), {}),
        ("queue", "ack_many", ("12",), {}),
        ("queue", "ack_many", ([12],), {}),
        ("queue", "cancel", ("1",), {}),
        ("queue", "get_job", (1.5,), {}),
        ("queue", "dead_jobs", (0,), {}),
        ("queue", "dead_jobs", (10, -1), {}),
        ("queue", "requeue", (1,), {"delay": -1}),
        ("queue", "purge_dead", ("old",), {}),
    ]
    calls += [("handle", "retry", (e,), {}) for e in BAD_ERRORS]
    calls += [("handle", "fail", (e,), {}) for e in BAD_ERRORS if e is not None]
    calls += [("handle", "retry", ("e",), {"delay": d}) for d in BAD_DURATIONS]
    calls += [("handle", "heartbeat", (d,), {}) for d in BAD_POSITIVE_DURATIONS]
    calls += [("store", "listen", (name,), {}) for name in ("", "a b", 3)]
    calls += [
        ("store", "schedule", ("s", "every day", "jobs", 1), {}),
        ("store", "schedule", ("s", "@hourly", "jobs", 1), {"delay": 5}),
        ("store", "schedule", ("s", "@hourly", "jobs", object()), {}),
    ]
    calls += [("subscription", "wait", (d,), {}) for d in BAD_DURATIONS]
    return calls


BAD_CALLS = _bad_calls()


#: What one call did: ``(call, error type or "accepted", message, what it
#: wrote)``, the last ``""`` when the queue's stats and held job are as before.
Refusal = tuple[str, str, str, str]


async def refusals(store: Any, call: Call, queue: str) -> list[Refusal]:
    """Each bad call of :data:`BAD_CALLS` on the queue ``queue`` (one due
    job, one held claim), as a :data:`Refusal` (``queue`` shown as
    ``<q>``); then the refused queue names and options; then the final
    stats."""
    q = store.queue(queue)
    await call(q.enqueue, "held")
    handle = await call(q.claim_one, "w")
    await call(q.enqueue, "due")
    held = await call(q.get_job, handle.id)
    before = await call(q.stats)
    subscription = await call(store.listen, queue)
    targets = {"queue": q, "handle": handle, "store": store, "subscription": subscription}
    seen: list[Refusal] = []
    try:
        for kind, name, args, kwargs in BAD_CALLS:
            outcome = ("accepted", "")
            try:
                await call(getattr(targets[kind], name), *args, **kwargs)
            except Exception as error:  # ValidationError, or the finding
                # The core words every refusal but the connection's, which
                # the engine checks: a native async engine takes another type.
                text = "" if name == "enqueue_tx" else str(error).replace(queue, "<q>")
                outcome = (type(error).__name__, text)
            now = await call(q.stats)
            wrote = "" if now == before and await call(q.get_job, handle.id) == held else repr(now)
            before = now
            seen.append((f"{kind}.{name}{args!r}{kwargs!r}", *outcome, wrote))
        for bad_name in ("", "a b", 3):
            try:
                store.queue(bad_name)
            except ValidationError as error:
                seen.append((f"store.queue({bad_name!r})", type(error).__name__, str(error), ""))
        try:
            store.queue(queue, opts={"priority": 1})
        except ValidationError as error:
            seen.append(("store.queue(opts=dict)", type(error).__name__, str(error), ""))
    finally:
        await call(subscription.close)
    seen.append(("stats", "", repr(await call(q.stats)), ""))
    return seen


class AsyncSurfaceTests(AsyncFixtures):
    """docs/async.md "The contract, with await": the same results, the same
    errors, the same closed-store refusals as the sync surface."""

    def test_async_surface_gives_the_sync_results(
        self, open_store: StoreFactory, async_store: Callable[..., Any]
    ) -> None:
        """One scenario of every operation, through the sync store and then
        the async store, on queues of their own on the test's target, each
        with its own clock at ``T0`` and ``rng=random.Random(7)``."""
        sync_clock, async_clock = ManualClock(T0), ManualClock(T0)
        sync_store = open_store(clock=sync_clock, rng=random.Random(7))
        expected = run_on_a_loop(surface_scenario(sync_store, sync_call, sync_clock, "sync"))

        async def on_async() -> list[Any]:
            async with async_store(clock=async_clock, rng=random.Random(7)) as store:
                return await surface_scenario(store, async_call, async_clock, "async")

        got = run_on_a_loop(on_async())
        assert len(got) == len(expected)
        for index, (a, s) in enumerate(zip(got, expected, strict=True)):
            assert a == s, f"result {index}"
        # The scenario did what it says: jobs, a handle, a sweep that expired some.
        assert expected[0] == [0]
        assert expected[3] == []
        assert expected[5][0] == "handle"
        assert ("SweepResult", (2, 0)) in expected
        assert expected[-1] is True

    def test_async_surface_refuses_bad_input_as_the_sync_surface_does(
        self, open_store: StoreFactory, async_store: Callable[..., Any]
    ) -> None:
        """docs/contract.md §3 "Validation": every bad argument raises the
        sync surface's ``ValidationError`` (the same message, but for the
        engine's own words on a connection ``enqueue_tx`` cannot use), and
        writes nothing."""
        expected = run_on_a_loop(refusals(open_store(), sync_call, "sync-jobs"))

        async def on_async() -> list[Refusal]:
            async with async_store(clock=ManualClock(T0)) as store:
                return await refusals(store, async_call, "async-jobs")

        got = run_on_a_loop(on_async())
        assert len(got) == len(expected)
        wrong = [(a, s) for a, s in zip(got, expected, strict=True) if a != s]
        assert wrong == [], f"{len(wrong)} calls differ (async, sync); the first: {wrong[0]}"
        assert {(kind, wrote) for _, kind, _, wrote in expected[:-1]} == {("ValidationError", "")}
        assert expected[-1][2] == repr(QueueStats(1, 0, 1, 0))

    def test_async_surface_closed_store_refuses_every_operation(
        self, async_store: Callable[..., Any]
    ) -> None:
        """docs/contract.md §3 "Closed store": ``StoreClosedError``, checked
        before validation; closing again is a no-op."""

        async def main() -> list[str]:
            async with async_store() as store:
                q = store.queue("jobs")
                await q.enqueue(1)
                handle = await q.claim_one("w")
                assert handle is not None
                subscription = await store.listen("jobs")
                await store.close()
                await store.close()
                assert store.closed
                refused = []
                calls: list[tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]] = [
                    (q.enqueue, (1,)),
                    (q.enqueue, (object(),)),  # closed is checked before validation
                    (q.enqueue_many, ([1],)),
                    (q.claim_one, ("w",)),
                    (q.claim_batch, ("w", 2)),
                    (q.stats, ()),
                    (q.get_job, (1,)),
                    (q.ack_batch, ([1],)),
                    (q.ack_many, ([handle],)),
                    (q.pause, ()),
                    (q.dead_jobs, ()),
                    (handle.ack, ()),
                    (handle.retry, ("e",)),
                    (handle.heartbeat, (5,)),
                    (subscription.wait, (0,)),
                    (store.listen, ("jobs",)),
                    (store.queue_names, ()),
                    (store.schedules, ()),
                ]
                for fn, args in calls:
                    try:
                        await fn(*args)
                    except StoreClosedError as error:
                        refused.append(type(error).__name__)
                with pytest.raises(StoreClosedError):
                    store.queue("jobs")
                await subscription.close()
                return refused

        assert run_on_a_loop(main()) == ["StoreClosedError"] * 18


# -- exactly once, with coroutines and processes -----------------------------


class AsyncConcurrencyTests(AsyncFixtures, SpawnFixtures):
    """docs/contract.md §3 "Claim": exactly once under any concurrency,
    here coroutines on one async store and event loops in several
    processes."""

    COROUTINES = 32
    PROCESSES = 4
    COROUTINES_PER_PROCESS = 8

    def test_async_surface_coroutines_claim_each_job_exactly_once(
        self, async_store: Callable[..., Any]
    ) -> None:
        """32 coroutines on one async store claim and ack 320 jobs, in
        batches of 1 to 4: each job once, at attempt 1."""

        async def main() -> tuple[list[int], list[tuple[int, int]], list[int], QueueStats]:
            async with async_store() as store:
                q = store.queue("race")
                ids = await q.enqueue_many(list(range(320)))
                claimed: list[tuple[int, int]] = []
                refused: list[int] = []

                async def work(n: int) -> None:
                    while handles := await q.claim_batch(f"w{n}", 1 + n % 4):
                        claimed.extend((h.id, h.attempts) for h in handles)
                        if n % 2:
                            acked = await q.ack_many(handles)
                            refused.extend(
                                h.id for h, ok in zip(handles, acked, strict=True) if not ok
                            )
                        else:
                            for handle in handles:
                                if not await handle.ack():
                                    refused.append(handle.id)

                await asyncio.gather(*(work(n) for n in range(self.COROUTINES)))
                return ids, claimed, refused, await q.stats()

        ids, claimed, refused, stats = run_on_a_loop(main())
        assert Counter(i for i, _ in claimed) == Counter(ids)
        assert {a for _, a in claimed} == {1}
        assert refused == []
        assert stats == (0, 0, 0, 0)

    def test_async_surface_coroutines_racing_for_one_job_hand_it_to_one(
        self, async_store: Callable[..., Any]
    ) -> None:
        """Each round, 32 coroutines ``claim_one`` the one job at once: one
        wins it, at attempt 1; repeated."""
        rounds = 20

        async def main() -> list[list[tuple[int, int]]]:
            async with async_store() as store:
                q = store.queue("race")
                winners = []
                for round_ in range(rounds):
                    job_id = await q.enqueue(round_)
                    got = await asyncio.gather(
                        *(q.claim_one(f"w{n}") for n in range(self.COROUTINES))
                    )
                    won = [(h.id - job_id, h.attempts) for h in got if h is not None]
                    for handle in got:
                        if handle is not None:
                            assert await handle.ack()
                    winners.append(won)
                return winners

        assert run_on_a_loop(main()) == [[(0, 1)]] * rounds

    @pytest.mark.slow
    def test_async_surface_processes_of_coroutines_claim_each_job_exactly_once(
        self, spawn: _Spawner, store: Store
    ) -> None:
        """Four processes, each an event loop of eight coroutines on its own
        async store, drain 800 jobs together: each job claimed once."""
        producer = store.queue("race")
        ids = producer.enqueue_many(list(range(800)))
        reports = self.run_together(
            spawn,
            _children.async_claim_child,
            self.PROCESSES,
            queue_name="race",
            coroutines=self.COROUTINES_PER_PROCESS,
            batch=3,
        )
        claimed = [job_id for r in reports for job_id in r[3]]
        assert Counter(claimed) == Counter(ids)
        assert producer.stats() == (0, 0, 0, 0)


# -- the state machine through the async API ---------------------------------


class OnLoop:
    """A sync view of an async store, queue or handle: each call whose
    result is a coroutine runs to completion on ``loop``
    (``loop.run_until_complete``), and what it returns is viewed the same
    way, so the sync state machine drives the async API unchanged."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop

    def _view(self, value: Any) -> Any:
        if isinstance(value, AsyncStore | AsyncQueue | AsyncJobHandle):
            return OnLoop(value, self._loop)
        if isinstance(value, list):
            return [self._view(v) for v in value]
        return value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return self._view(value)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = value(*_unview(args), **{k: _unview(v) for k, v in kwargs.items()})
            if inspect.iscoroutine(result):
                result = self._loop.run_until_complete(result)
            return self._view(result)

        return call


def _unview(value: Any) -> Any:
    """``value`` with every :class:`OnLoop` in it (or in a list or tuple
    of it) replaced by the async object it views, for passing it back in
    (``ack_many`` takes handles)."""
    if isinstance(value, OnLoop):
        return value._target
    if isinstance(value, list | tuple):
        return type(value)(_unview(v) for v in value)
    return value


class AsyncQueueMachine(QueueMachine):
    """:class:`~.stateful.QueueMachine`, whose store is the async store of
    the target viewed through :class:`OnLoop`: one event loop per example,
    closed with the store."""

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            cast(OnLoop, self.store)._loop.close()


def async_stateful_settings() -> settings:
    """The sync machine's settings, with fewer examples by default (6;
    ``ALKSTORE_ASYNC_STATEFUL_EXAMPLES`` sets them): the async machine
    drives the same rules, and mostly checks the surface, not the engine."""
    return settings(
        stateful_settings(),
        max_examples=int(os.environ.get("ALKSTORE_ASYNC_STATEFUL_EXAMPLES", "6")),
    )


class AsyncStatefulTests(AsyncFixtures):
    """The async surface against the model over random operation sequences."""

    @pytest.mark.slow
    def test_async_surface_matches_the_model(self, alkstore_target: StoreTarget) -> None:
        """:class:`~.stateful.QueueMachine`'s rules and invariant, unchanged,
        through :class:`OnLoop`: every operation is an ``await`` of the
        async store the harness opens, on one event loop per example."""
        opened: list[asyncio.AbstractEventLoop] = []

        def open_on_a_loop(**options: Any) -> Store:
            loop = asyncio.new_event_loop()
            opened.append(loop)
            store = loop.run_until_complete(self.open_async_store(alkstore_target, **options))
            return cast(Store, OnLoop(store, loop))

        machine = type(
            "EngineAsyncQueueMachine",
            (AsyncQueueMachine,),
            {"open_store": staticmethod(open_on_a_loop)},
        )
        try:
            run_state_machine_as_test(machine, settings=async_stateful_settings())
        finally:
            for loop in opened:
                if not loop.is_closed():
                    loop.close()
        assert opened, "the machine ran no example"


# -- transactional enqueue through the async surface -------------------------


class AsyncApp:
    """The application's side of the async transactional tests: its
    connection (the harness's :meth:`~alkstore_contract_tests.EngineHarness.async_app_connection`,
    a sync or an async driver's) and its own table, every call awaited
    when the driver's result is awaitable."""

    def __init__(self, harness: EngineHarness, conn: Any, table: str) -> None:
        self.harness = harness
        self.conn = conn
        self.table = table

    async def begin(self) -> None:
        await self.harness.begin_async(self.conn)

    async def execute(self, sql: str) -> list[Any] | None:
        """Run ``sql``; its rows, or ``None`` for a statement without."""
        cursor = await resolved(self.conn.execute(sql.replace("orders", self.table)))
        if cursor.description is None:
            return None
        return list(await resolved(cursor.fetchall()))

    async def commit(self) -> None:
        await resolved(self.conn.commit())

    async def rollback(self) -> None:
        await resolved(self.conn.rollback())

    async def orders(self) -> list[int]:
        return sorted(row[0] for row in await self.execute("SELECT id FROM orders") or [])


class AsyncAppFixtures(AsyncFixtures):
    """``async_app``: the application's own connection (the harness's
    ``async_app_connection``) and table, for tests of the async surface that
    write in the caller's transaction."""

    @asynccontextmanager
    async def async_app(self, target: StoreTarget) -> AsyncIterator[AsyncApp]:
        """The application's connection and its own empty table ``orders (id
        INTEGER PRIMARY KEY)``, unique to the test, dropped afterwards;
        taken once the test's async store is open."""
        async with self.async_app_connection(target) as conn:
            app = AsyncApp(self, conn, f"orders_{uuid.uuid4().hex[:12]}")
            await app.begin()
            await app.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
            await app.commit()
            try:
                yield app
            finally:
                await app.rollback()  # a no-op unless a failed test left one open
                await app.begin()
                await app.execute("DROP TABLE orders")
                await app.commit()


class AsyncTransactionalTests(AsyncAppFixtures):
    """``AsyncQueue.enqueue_tx`` inside the caller's transaction, on the
    harness's ``async_app_connection``: by default the engine's sync
    driver connection, which the thread adapter passes to the sync
    ``enqueue_tx`` on one of the async store's threads while the test
    drives the transaction from the loop's thread, never both at once
    (docs/async.md "Sync engines under asyncio"); for an engine with native
    async primitives, its async driver's connection."""

    def test_async_surface_tx_commit_makes_the_job_visible_and_wakes(
        self, alkstore_target: StoreTarget, async_store: Callable[..., Any]
    ) -> None:
        async def main() -> list[Any]:
            async with (
                async_store() as store,
                await store.listen("jobs") as sub,
                self.async_app(alkstore_target) as app,
            ):
                q = store.queue("jobs")
                await app.begin()
                await app.execute("INSERT INTO orders (id) VALUES (43)")
                job_id = await q.enqueue_tx(app.conn, {"order": 43}, priority=2, delay=0)
                hidden = [await q.get_job(job_id), await q.stats()]
                await app.commit()
                woken = await sub.wait(WAKE_TIMEOUT_S)
                handle = await q.claim_one("w")
                assert handle is not None
                got = [type(job_id), *hidden, woken, handle.id == job_id, handle.payload]
                return [*got, await app.orders()]

        got = run_on_a_loop(main())
        assert got == [int, None, (0, 0, 0, 0), True, True, {"order": 43}, [43]]

    def test_async_surface_tx_rollback_leaves_no_job_and_no_wake(
        self, alkstore_target: StoreTarget, async_store: Callable[..., Any]
    ) -> None:
        async def main() -> list[Any]:
            async with (
                async_store() as store,
                await store.listen("jobs") as sub,
                self.async_app(alkstore_target) as app,
            ):
                q = store.queue("jobs")
                await app.begin()
                await app.execute("INSERT INTO orders (id) VALUES (42)")
                job_id = await q.enqueue_tx(app.conn, {"order": 42})
                await app.rollback()
                got = [await sub.wait(QUIET_S), await q.get_job(job_id), await q.stats()]
                return [*got, await app.orders()]

        assert run_on_a_loop(main()) == [False, None, (0, 0, 0, 0), []]

    def test_async_surface_tx_refusals_leave_the_callers_transaction_usable(
        self, alkstore_target: StoreTarget, async_store: Callable[..., Any]
    ) -> None:
        """Regression case 007 through the async surface: a refused payload
        or option raises ``ValidationError`` and the caller's transaction
        goes on; a connection outside a transaction is refused."""

        async def main() -> list[Any]:
            async with async_store() as store, self.async_app(alkstore_target) as app:
                q = store.queue("jobs")
                refused = []
                with pytest.raises(ValidationError):
                    await q.enqueue_tx(app.conn, "outside a transaction")
                await app.begin()
                await app.execute("INSERT INTO orders (id) VALUES (7)")
                for payload, options in [
                    (float("nan"), {}),
                    ({1: "int key"}, {}),
                    ("fine", {"delay": -1}),
                    ("fine", {"delay": 10, "expires": 5}),
                ]:
                    try:
                        await q.enqueue_tx(app.conn, payload, **options)
                    except ValidationError:
                        refused.append(True)
                assert [tuple(row) for row in await app.execute("SELECT 1") or []] == [(1,)]
                job_id = await q.enqueue_tx(app.conn, {"s": "a\u0000b"})
                await app.commit()
                handle = await q.claim_one("w")
                assert handle is not None
                got = [refused, handle.id == job_id, handle.payload, await q.stats()]
                return [*got, await app.orders()]

        got = run_on_a_loop(main())
        assert got == [[True] * 4, True, {"s": "a\u0000b"}, (0, 0, 1, 0), [7]]


# -- the loop is never blocked -----------------------------------------------


class _Ticker:
    """A coroutine that counts the loop's turns (one per
    ``asyncio.sleep(0)``) and the longest time between two of them."""

    def __init__(self) -> None:
        self.ticks = 0
        self.longest_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0)
            now = time.monotonic()
            self.ticks += 1
            self.longest_s = max(self.longest_s, now - last)
            last = now

    def __enter__(self) -> _Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


@dataclasses.dataclass
class _Yields:
    """Which operations let the loop turn while they ran."""

    ticker: _Ticker
    blocked: list[str] = dataclasses.field(default_factory=list)
    ran: int = 0

    async def __call__(self, label: str, operation: Awaitable[T]) -> T:
        before = self.ticker.ticks
        result = await operation
        self.ran += 1
        if self.ticker.ticks == before:
            self.blocked.append(label)
        return result


class AsyncLoopTests(AsyncFixtures):
    """docs/async.md: no operation blocks the event loop. An operation that
    reads or writes the database waits for it; a correct async store lets
    the loop run other tasks meanwhile (a thread's future, a socket), so
    the loop turns at least once during every such ``await``. An async
    store that ran its I/O on the loop would never let it turn."""

    def test_async_surface_every_operation_yields_to_the_loop(
        self, async_store: Callable[..., Any], clock: ManualClock
    ) -> None:
        """Each operation that reads or writes the database, awaited with a
        ticker task beside it: the ticker ticks during every one."""

        async def main() -> _Yields:
            async with async_store(clock=clock) as store:
                q = store.queue("jobs", QueueOpts(max_attempts=2))
                with _Ticker() as ticker:
                    op = _Yields(ticker)
                    await op("enqueue", q.enqueue("a"))
                    ids = await op("enqueue_many", q.enqueue_many(["b", "c", "d", "e"]))
                    first = await op("claim_one", q.claim_one("w"))
                    batch = await op("claim_batch", q.claim_batch("w", 4))
                    assert first is not None
                    assert len(batch) == 4
                    await op("heartbeat", first.heartbeat(60))
                    await op("retry", batch[0].retry("again", delay=0))
                    await op("fail", batch[1].fail("bad"))
                    await op("ack", first.ack())
                    await op("ack_many", q.ack_many([batch[2]]))
                    await op("ack_batch", q.ack_batch([batch[3].id]))
                    await op("get_job", q.get_job(ids[0]))
                    await op("stats", q.stats())
                    await op("lapsed_claims", q.lapsed_claims())
                    await op("dead_jobs", q.dead_jobs())
                    await op("requeue", q.requeue(ids[1]))
                    await op("cancel", q.cancel(ids[1]))
                    await op("pause", q.pause())
                    await op("is_paused", q.is_paused())
                    await op("resume", q.resume())
                    clock.advance(3600)
                    await op("sweep_expired", q.sweep_expired())
                    await op("purge_dead", q.purge_dead())
                    await op("schedule", store.schedule("tick", "@hourly", q, 1))
                    await op("schedules", store.schedules())
                    await op("unreadable_schedules", store.unreadable_schedules())
                    await op("unschedule", store.unschedule("tick"))
                    await op("queue_names", store.queue_names())
                return op

        got = run_on_a_loop(main())
        assert got.blocked == [], f"these operations never let the loop turn: {got.blocked}"
        assert got.ran == 26

    def test_async_surface_a_ticker_keeps_ticking_while_coroutines_work(
        self, async_store: Callable[..., Any]
    ) -> None:
        """Eight coroutines enqueue, claim and ack 120 jobs beside a
        ticker: the loop turns at least once per operation of the busiest
        coroutine, and no step of the loop lasts :data:`SLOW_STEP_S`."""
        workers = 8

        async def main() -> tuple[int, int, float, int]:
            async with async_store() as store:
                q = store.queue("jobs")
                done: list[int] = []
                operations = [0] * workers

                async def work(n: int) -> None:
                    for i in range(15):
                        await q.enqueue({"n": n, "i": i})
                        operations[n] += 1
                    while handles := await q.claim_batch(f"w{n}", 2):
                        operations[n] += 1
                        for handle in handles:
                            assert await handle.ack()
                            operations[n] += 1
                            done.append(handle.id)
                    operations[n] += 1  # the claim that found nothing

                with _Ticker() as ticker:
                    await asyncio.gather(*(work(n) for n in range(workers)))
                return len(done), ticker.ticks, ticker.longest_s, max(operations)

        done, ticks, longest_s, busiest = run_on_a_loop(main())
        assert done == 120
        assert ticks >= busiest, f"the loop turned {ticks} times for {busiest} awaited operations"
        assert longest_s < SLOW_STEP_S, f"one step of the loop took {longest_s:.3f} s"
