"""The paired thread/task primitives of alkstore._acompat and
alkstore._acompat_async: each pair answers the same calls the same way, on
real threads and real event loops, and the heartbeater built on them stops
within its bound on both sides."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from datetime import UTC, datetime
from typing import Any

import alkstore.engine
import alkstore.engine_async
from alkstore import _acompat, _acompat_async
from alkstore._acompat import Condition, Event, join, spawn, wait_event
from alkstore._acompat_async import ACondition, AEvent, ajoin, aspawn, await_event
from alkstore.runtime.heartbeat import Heartbeater
from alkstore.runtime.heartbeat_async import AsyncHeartbeater

#: Bounds the waits that must end early; far above what any should take.
BOUND_S = 10.0


def run(coro: Any) -> Any:
    async def main() -> Any:
        return await coro

    return asyncio.run(main(), debug=True)


def test_every_async_name_has_its_thread_twin() -> None:
    """The pairs the conversion renames (tools/async_to_sync.py's NAMES)
    exist on both sides, and engines get the same objects through
    alkstore.engine and alkstore.engine_async."""
    from test_async import TOOL

    async_names = set(_acompat_async.__all__) - {"is_async"}
    for name in async_names:
        twin = TOOL.NAMES[name]
        assert twin in _acompat.__all__, name
        assert getattr(alkstore.engine_async, name) is getattr(_acompat_async, name)
        assert getattr(alkstore.engine, twin) is getattr(_acompat, twin)
    assert {TOOL.NAMES[name] for name in async_names} == set(_acompat.__all__)


def test_a_set_event_is_seen_at_once_whatever_the_timeout() -> None:
    async def main() -> list[bool]:
        unset, done = AEvent(), AEvent()
        done.set()
        return [
            await await_event(done, 0),
            await await_event(done, -1),
            await await_event(unset, 0),
            await await_event(unset, -1),
        ]

    assert run(main()) == [True, True, False, False]
    unset, done = Event(), Event()
    done.set()
    assert [wait_event(done, 0), wait_event(done, -1)] == [True, True]
    assert [wait_event(unset, 0), wait_event(unset, -1)] == [False, False]


def test_an_event_wait_ends_when_set_or_at_its_timeout() -> None:
    async def main() -> tuple[bool, float, bool]:
        event = AEvent()
        start = time.monotonic()
        timed_out = await await_event(event, 0.05)
        took = time.monotonic() - start
        asyncio.get_running_loop().call_later(0.01, event.set)
        return timed_out, took, await await_event(event, BOUND_S)

    timed_out, took, woken = run(main())
    assert (timed_out, woken) == (False, True)
    assert 0.04 <= took < BOUND_S

    event = Event()
    start = time.monotonic()
    assert wait_event(event, 0.05) is False
    assert 0.04 <= time.monotonic() - start < BOUND_S
    threading.Timer(0.01, event.set).start()
    assert wait_event(event, BOUND_S) is True


def test_a_condition_waits_for_its_predicate_with_a_timeout() -> None:
    """``wait_for(predicate, timeout)``, threading's spelling on both sides:
    the predicate's last value, the lock held again after a timeout."""

    async def main() -> list[Any]:
        cond = ACondition()
        flag = [False]
        async with cond:
            timed_out = await cond.wait_for(lambda: flag[0], 0.05)
            held_after_timeout = cond.locked()

        async def set_flag() -> None:
            async with cond:
                flag[0] = True
                cond.notify_all()

        async with cond:
            aspawn(set_flag, name="setter")
            notified = await cond.wait_for(lambda: flag[0], BOUND_S)
        async with cond:
            no_limit = await cond.wait_for(lambda: flag[0])
        return [timed_out, held_after_timeout, notified, no_limit]

    assert run(main()) == [False, True, True, True]

    cond = Condition()
    flag = [False]
    with cond:
        assert cond.wait_for(lambda: flag[0], 0.05) is False

    def set_flag() -> None:
        with cond:
            flag[0] = True
            cond.notify_all()

    with cond:
        spawn(set_flag, name="setter")
        assert cond.wait_for(lambda: flag[0], BOUND_S) is True


def test_spawn_runs_its_function_with_args_under_its_name_and_join_is_bounded() -> None:
    seen: list[tuple[str, bool, int]] = []
    release = threading.Event()

    def work(n: int) -> None:
        seen.append((threading.current_thread().name, threading.current_thread().daemon, n))
        release.wait(BOUND_S)

    thread = spawn(work, (7,), name="worker-7")
    assert join(thread, 0.05) is False  # still running: left to run
    assert thread.is_alive()
    release.set()
    assert join(thread, BOUND_S) is True
    assert seen == [("worker-7", True, 7)]

    async def main() -> list[Any]:
        got: list[int] = []
        gate = asyncio.Event()

        async def work(n: int) -> None:
            got.append(n)
            await gate.wait()

        task = aspawn(work, (7,), name="worker-7")
        ended_early = await ajoin(task, 0.05)
        still_running = not task.done()  # a task that outlived its bound is not cancelled
        gate.set()
        ended = await ajoin(task, BOUND_S)
        return [task.get_name(), got, ended_early, still_running, ended, task.cancelled()]

    assert run(main()) == ["worker-7", [7], False, True, True, False]


class HungHandle:
    """A job handle whose heartbeat never answers (a call that hangs)."""

    visibility_timeout_s = 0.03
    claim_deadline = datetime.max.replace(tzinfo=UTC)
    id = 1
    queue = "q"

    def __init__(self) -> None:
        self.beats = 0

    async def heartbeat(self) -> bool:
        self.beats += 1
        await asyncio.Event().wait()
        return True


def test_the_async_heartbeater_cancels_a_task_that_outlives_its_stop() -> None:
    """Under ``if is_async():``: a task can be cancelled, a thread cannot."""

    async def main() -> tuple[int, bool, float]:
        beater = AsyncHeartbeater("hb")
        handle = HungHandle()
        beater.start()
        await beater.add(handle)  # type: ignore[arg-type]
        deadline = time.monotonic() + BOUND_S
        while handle.beats == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        runner = beater._runner
        assert runner is not None
        start = time.monotonic()
        await beater.stop(timeout_s=0.05)
        return handle.beats, runner.cancelled(), time.monotonic() - start

    beats, cancelled, took = run(main())
    assert beats == 1
    assert cancelled
    assert took < BOUND_S


def test_the_heartbeat_thread_idle_without_a_deadline_ends_at_stop() -> None:
    """With no job it waits with no timeout; stop's notification ends the
    wait (its predicate turns true), so the thread ends well within the bound."""
    calls = [0]

    def monotonic() -> float:
        calls[0] += 1
        return time.monotonic()

    beater = Heartbeater("hb-idle", monotonic=monotonic)
    beater.start()
    runner = beater._runner
    assert runner is not None
    # Its second reading of the clock is under the condition's lock, just
    # before the wait: once the lock is free after it, the thread waits.
    deadline = time.monotonic() + BOUND_S
    while calls[0] < 2:
        assert time.monotonic() < deadline, "the heartbeat thread never reached its wait"
        time.sleep(0.005)
    with beater._cond:
        assert beater._wake_at == math.inf
    start = time.monotonic()
    beater.stop(timeout_s=BOUND_S)
    assert not runner.is_alive()
    assert time.monotonic() - start < BOUND_S / 2
