"""What the suite's child processes run.

Children are started with multiprocessing's ``"spawn"`` method, so they run
no engine-specific code of the parent: each opens the target with
:func:`alkstore.open` (after importing the harness's
``child_process_imports``) and a fixed clock given as an ISO string.
Everything a child reports goes through a result queue as plain tuples; an
exception of any kind is reported, never raised, so the parent sees it.
"""

from __future__ import annotations

import asyncio
import importlib
import traceback
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import alkstore
from alkstore import Store

__all__ = [
    "BARRIER_TIMEOUT_S",
    "EPOCH",
    "ChildSpec",
    "FixedClock",
    "SharedClock",
    "async_claim_child",
    "claim_batch_child",
    "claim_race_child",
    "enqueue_child",
    "epoch_us",
    "open_child_store",
    "scheduler_tick_child",
    "unique_enqueue_child",
]

#: How long a child waits at a barrier before giving up (a hung sibling).
BARRIER_TIMEOUT_S = 120.0

#: ``(url, options, clock ISO string, modules to import)``.
ChildSpec = tuple[str, Mapping[str, Any], str, Sequence[str]]


class FixedClock:
    """A picklable clock frozen at an ISO instant."""

    def __init__(self, iso: str) -> None:
        self._now = datetime.fromisoformat(iso)

    def __call__(self) -> datetime:
        return self._now


#: The Unix epoch, aware UTC.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class SharedClock:
    """A clock read from a shared integer of microseconds since the Unix
    epoch (a ``multiprocessing`` ``Value("q")``), which the parent moves:
    every process reading it sees the same instant."""

    def __init__(self, micros: Any) -> None:
        self._micros = micros

    def __call__(self) -> datetime:
        return EPOCH + timedelta(microseconds=self._micros.value)


def epoch_us(instant: datetime) -> int:
    """``instant`` as whole microseconds since :data:`EPOCH`."""
    delta = instant - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _child_options(spec: ChildSpec, extra: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The URL and options ``spec`` describes, after its imports."""
    url, options, iso, imports = spec
    for module in imports:
        importlib.import_module(module)
    return url, {**options, "clock": FixedClock(iso), **extra}


def open_child_store(spec: ChildSpec, **extra: Any) -> Store:
    """Open the target described by ``spec`` in this (child) process."""
    url, options = _child_options(spec, extra)
    return alkstore.open(url, **options)


def async_claim_child(
    spec: ChildSpec,
    *,
    index: int,
    queue_name: str,
    coroutines: int,
    batch: int,
    barrier: Any,
    results: Any,
) -> None:
    """Open the target with :func:`alkstore.open_async` on an event loop of
    this process, wait at the barrier with the siblings (off the loop), then
    run ``coroutines`` coroutines that each ``claim_batch(batch)`` and ack
    every handle until the queue is empty; report
    ``("async-claim", 0, index, [claimed ids], error)``, where ``error``
    names any ack that returned ``False``."""

    async def main() -> tuple[list[int], str | None]:
        url, options = _child_options(spec, {})
        claimed: list[int] = []
        refused: list[int] = []
        async with alkstore.open_async(url, **options) as store:
            q = store.queue(queue_name)
            await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S)

            async def work(n: int) -> None:
                while handles := await q.claim_batch(f"p{index}c{n}", batch):
                    claimed.extend(h.id for h in handles)
                    for handle in handles:
                        if not await handle.ack():
                            refused.append(handle.id)

            await asyncio.gather(*(work(n) for n in range(coroutines)))
        return claimed, (f"acks of jobs {refused} returned False" if refused else None)

    try:
        claimed, error = asyncio.run(main())
        results.put(("async-claim", 0, index, claimed, error))
    except BaseException:
        results.put(("crash", -1, index, None, traceback.format_exc()))
        barrier.abort()


def claim_race_child(
    spec: ChildSpec,
    *,
    index: int,
    queue_name: str,
    rounds: int,
    barrier: Any,
    results: Any,
) -> None:
    """Each round: wait at the barrier with the siblings, ``claim_one``, ack a
    won job, report ``("claim", round, index, (id, attempts) | None, error)``,
    then wait at the barrier again for the parent's next enqueue."""
    try:
        store = open_child_store(spec)
        try:
            q = store.queue(queue_name)
            for round_ in range(rounds):
                barrier.wait(BARRIER_TIMEOUT_S)
                outcome: tuple[int, int] | None = None
                error = None
                try:
                    handle = q.claim_one(f"p{index}")
                    if handle is not None:
                        outcome = (handle.id, handle.attempts)
                        if not handle.ack():
                            error = f"ack of job {handle.id} returned False"
                except BaseException:
                    error = traceback.format_exc()
                results.put(("claim", round_, index, outcome, error))
                barrier.wait(BARRIER_TIMEOUT_S)
        finally:
            store.close()
    except BaseException:
        results.put(("crash", -1, index, None, traceback.format_exc()))
        barrier.abort()


def claim_batch_child(
    spec: ChildSpec,
    *,
    index: int,
    queue_name: str,
    n: int,
    barrier: Any,
    results: Any,
) -> None:
    """Wait at the barrier, ``claim_batch(n)`` once, report
    ``("batch", 0, index, [(id, attempts), ...], error)``."""
    try:
        store = open_child_store(spec)
        try:
            q = store.queue(queue_name)
            barrier.wait(BARRIER_TIMEOUT_S)
            try:
                got = [(h.id, h.attempts) for h in q.claim_batch(f"p{index}", n)]
                results.put(("batch", 0, index, got, None))
            except BaseException:
                results.put(("batch", 0, index, [], traceback.format_exc()))
        finally:
            store.close()
    except BaseException:
        results.put(("crash", -1, index, None, traceback.format_exc()))
        barrier.abort()


def enqueue_child(
    spec: ChildSpec,
    *,
    index: int,
    queue_name: str,
    count: int,
    barrier: Any,
    results: Any,
) -> None:
    """Open the target (migrating it) together with the siblings, enqueue
    ``count`` jobs ``{"child": index, "i": i}``, report
    ``("enqueue", 0, index, [ids], error)``."""
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
        store = open_child_store(spec)
        try:
            q = store.queue(queue_name)
            ids = [q.enqueue({"child": index, "i": i}) for i in range(count)]
            results.put(("enqueue", 0, index, ids, None))
        finally:
            store.close()
    except BaseException:
        results.put(("crash", -1, index, None, traceback.format_exc()))
        barrier.abort()


def unique_enqueue_child(
    spec: ChildSpec,
    *,
    index: int,
    queue_name: str,
    rounds: int,
    barrier: Any,
    results: Any,
) -> None:
    """Open the target, then in each round, together with the siblings,
    enqueue ``{"child": index}`` with the key ``round-<round>``; report
    ``("unique", 0, index, [id per round], error)``."""
    try:
        store = open_child_store(spec)
        try:
            q = store.queue(queue_name)
            ids = []
            for round_ in range(rounds):
                barrier.wait(BARRIER_TIMEOUT_S)
                ids.append(q.enqueue({"child": index}, unique_key=f"round-{round_}"))
            results.put(("unique", 0, index, ids, None))
        finally:
            store.close()
    except BaseException:
        results.put(("crash", -1, index, None, traceback.format_exc()))
        barrier.abort()


def scheduler_tick_child(
    spec: ChildSpec,
    *,
    index: int,
    rounds: int,
    ticks: int,
    micros: Any,
    barrier: Any,
    results: Any,
) -> None:
    """Each round: wait at the barrier while the parent has moved the shared
    clock (``micros``, see :class:`SharedClock`) to a due boundary, call
    ``Scheduler.tick()`` ``ticks`` times, report ``("tick", round, index,
    [job ids], error)``, then wait at the barrier again."""
    try:
        store = open_child_store(spec, clock=SharedClock(micros))
        try:
            scheduler = alkstore.Scheduler(store)
            for round_ in range(rounds):
                barrier.wait(BARRIER_TIMEOUT_S)
                fired: list[int] = []
                error = None
                try:
                    for _ in range(ticks):
                        fired += scheduler.tick()
                except BaseException:
                    error = traceback.format_exc()
                results.put(("tick", round_, index, fired, error))
                barrier.wait(BARRIER_TIMEOUT_S)
        finally:
            store.close()
    except BaseException:
        results.put(("crash", -1, index, None, traceback.format_exc()))
        barrier.abort()
