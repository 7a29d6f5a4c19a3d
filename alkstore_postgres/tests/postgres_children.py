"""Functions run in child processes by the tests (importable by ``spawn``).

Children open their own stores from a URL and a schema name, with the
server's clock (no injected clock crosses a process boundary here).
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime
from multiprocessing.synchronize import Barrier
from typing import Any

import alkstore

#: How long a test waits for its children, seconds.
CHILD_TIMEOUT_S = 120


def _report(results: Any, index: int, target: Callable[..., Any], args: Sequence[Any]) -> None:
    try:
        results.put((index, True, target(*args)))
    except BaseException:
        results.put((index, False, traceback.format_exc()))


def run_children(target: Callable[..., Any], args: Sequence[Sequence[Any]]) -> list[Any]:
    """Run ``target(*a)`` for each ``a`` in its own spawned process at once;
    return the results in order, or fail with a child's traceback."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    processes = [
        ctx.Process(target=_report, args=(results, i, target, a)) for i, a in enumerate(args)
    ]
    for process in processes:
        process.start()
    try:
        collected = {
            index: (ok, value)
            for index, ok, value in (results.get(timeout=CHILD_TIMEOUT_S) for _ in processes)
        }
    finally:
        for process in processes:
            process.join(CHILD_TIMEOUT_S)
        results.close()
        results.join_thread()
    failures = [value for ok, value in collected.values() if not ok]
    assert not failures, "\n".join(failures)
    return [collected[i][1] for i in range(len(processes))]


def barrier(parties: int) -> Barrier:
    """A barrier that spawned children can inherit."""
    return multiprocessing.get_context("spawn").Barrier(parties)


def open_at_once(url: str, schema: str, barrier: Barrier) -> int:
    """Open (and so migrate) a store together with siblings; return the
    schema version found afterwards."""
    from alkstore_postgres import SCHEMA_VERSION

    barrier.wait()
    with alkstore.open(url, schema=schema):
        return SCHEMA_VERSION


def drain(url: str, schema: str, worker: str, barrier: Barrier) -> list[int]:
    """Claim batches of 3 from the queue ``drain`` and ack them until a claim
    comes back empty; return the ids this process claimed (each with
    ``attempts == 1`` checked)."""
    claimed: list[int] = []
    with alkstore.open(url, schema=schema, pool_max_size=2) as store:
        q = store.queue("drain")
        barrier.wait()
        while True:
            handles = q.claim_batch(worker, 3)
            if not handles:
                return claimed
            for handle in handles:
                assert handle.attempts == 1, handle
                claimed.append(handle.id)
            # Half acked one by one, half by ack_batch.
            if len(claimed) % 2:
                assert q.ack_batch([h.id for h in handles]) == len(handles)
            else:
                assert all(h.ack() for h in handles)


# -- operations (test_postgres_operations.py) --------------------------------


def wake_after_barrier(
    url: str, schema: str, queue: str, at: datetime, barrier: Barrier
) -> tuple[bool, object]:
    """Subscribe to ``queue``, meet the parent at ``barrier`` (twice: the
    parent acts after the second), then wait for a wake and claim, with the
    clock stopped at ``at``.

    Returns whether a wake came before the parent acted (waiting 0.3 s
    between the barriers), and the payload claimed after the wake (``None``
    if the wake did not come within the timeout)."""
    from alkstore_contract_tests import ManualClock

    with alkstore.open(url, schema=schema, clock=ManualClock(at), pool_max_size=2) as store:
        sub = store.listen(queue)
        q = store.queue(queue)
        barrier.wait()
        early = sub.wait(0.3)
        barrier.wait()
        if not sub.wait(CHILD_TIMEOUT_S / 4):
            return early, None
        handle = q.claim_one("child")
        return early, None if handle is None else handle.payload


def fire_rounds(
    url: str, schema: str, name: str, rounds: int, barrier: Barrier
) -> list[int | None]:
    """Race the siblings to fire the schedule ``name`` (``@every 30s``,
    created at T0) on each of ``rounds`` boundaries: every process reads the
    same snapshot, then all call ``_fire_schedule`` at once. Returns what
    each call returned."""
    from datetime import timedelta

    from alkstore.engine import EncodedPayload
    from alkstore.logic.resolution import EnqueueOptions, resolve
    from alkstore_contract_tests import T0, ManualClock

    clock = ManualClock()
    results: list[int | None] = []
    with alkstore.open(url, schema=schema, clock=clock, pool_max_size=2) as store:
        for r in range(rounds):
            boundary = T0 + timedelta(seconds=30 * (r + 1))
            clock.set(boundary + timedelta(seconds=1))
            barrier.wait()  # the previous round is over everywhere
            (schedule,) = store._list_schedules(clock())
            assert schedule.name == name, schedule
            assert schedule.next_run_at == boundary, schedule
            resolved = resolve(
                clock(),
                schedule.queue_opts,
                EnqueueOptions(run_at=boundary, priority=schedule.priority),
            )
            payload = EncodedPayload(schedule.payload_bytes, schedule.content_type)
            barrier.wait()  # everyone holds the same snapshot
            results.append(
                store._fire_schedule(
                    schedule, boundary, boundary + timedelta(seconds=30), resolved, payload
                )
            )
    return results


def maintenance_phases(url: str, schema: str, index: int, barrier: Barrier) -> list[bool]:
    """Ask for maintenance turns together with the siblings; each turn's
    block waits at ``barrier``, so every sibling asks while a taker holds
    its turn.

    1. task ``lock``, interval 1 s, this process's clock ``index`` hours
       after T0: the row is due for everyone, only the advisory lock keeps
       a second taker out;
    2. task ``interval`` (3600 s), everyone at T0 + 100 h;
    3. the same at T0 + 100 h + 3599 s: nobody holds it, none is due;
    4. the same at T0 + 100 h + 3600 s.

    Returns what each phase's turn yielded."""
    from datetime import timedelta

    from alkstore_contract_tests import T0, ManualClock

    clock = ManualClock(T0 + timedelta(hours=index))
    late = T0 + timedelta(hours=100)
    phases = [
        ("lock", 1.0, None),
        ("interval", 3600.0, late),
        ("interval", 3600.0, late + timedelta(seconds=3599)),
        ("interval", 3600.0, late + timedelta(seconds=3600)),
    ]
    got: list[bool] = []
    with alkstore.open(url, schema=schema, clock=clock, pool_max_size=1) as store:
        for task, interval_s, instant in phases:
            if instant is not None:
                clock.set(instant)
            barrier.wait()
            with store._maintenance_turn(task, interval_s) as mine:
                got.append(mine)
                barrier.wait()  # a taker holds its turn until all have asked
    return got
