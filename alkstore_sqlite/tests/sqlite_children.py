"""Functions run in child processes by the tests (importable by ``spawn``)."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Barrier, Event
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
    return the results in order, or fail with a child's traceback.

    Barriers and other synchronisation objects in ``args`` are inherited at
    spawn, which a process pool cannot do.
    """
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    processes = [
        ctx.Process(target=_report, args=(results, i, target, a)) for i, a in enumerate(args)
    ]
    for process in processes:
        process.start()
    try:
        collected = dict(
            (index, (ok, value))
            for index, ok, value in (results.get(timeout=CHILD_TIMEOUT_S) for _ in processes)
        )
    finally:
        for process in processes:
            process.join(CHILD_TIMEOUT_S)
    failures = [value for ok, value in collected.values() if not ok]
    assert not failures, "\n".join(failures)
    return [collected[i][1] for i in range(len(processes))]


def barrier(parties: int) -> Barrier:
    """A barrier that spawned children can inherit."""
    return multiprocessing.get_context("spawn").Barrier(parties)


def event() -> Event:
    """An event that spawned children can inherit."""
    return multiprocessing.get_context("spawn").Event()


def start_child(target: Callable[..., Any], args: Sequence[Any]) -> BaseProcess:
    """Start ``target(*args)`` in a spawned process and return it; the
    caller joins it and checks its exit code."""
    process = multiprocessing.get_context("spawn").Process(target=target, args=tuple(args))
    process.start()
    return process


def hold_write_lock(path: str, held: Event, release: Event) -> None:
    """Hold the write lock of the database ``path`` until ``release``."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        held.set()
        if not release.wait(CHILD_TIMEOUT_S):
            raise TimeoutError("never released")
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def enqueue_one(url: str, queue: str, payload: Any) -> int:
    """Open a store, enqueue ``payload`` and close it."""
    with alkstore.open(url) as store:
        return store.queue(queue).enqueue(payload)


def pending_payloads(url: str, queue: str) -> list[Any]:
    """The payloads of the jobs ``queue`` holds, in claim order (claimed
    and never acked)."""
    with alkstore.open(url) as store:
        return [handle.payload for handle in store.queue(queue).claim_batch("check", 1000)]


def drain_until_refused(url: str, ready: Event, changed: Event, report: str) -> None:
    """Claim and ack until the store refuses (its file replaced once
    ``changed`` is set); write whether the error was permanent and its
    message to ``report``."""
    import time

    with alkstore.open(url) as store:
        queue = store.queue("q")
        queue.enqueue_many(list(range(1000)))
        ready.set()
        if not changed.wait(CHILD_TIMEOUT_S):
            raise TimeoutError("never changed")
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                handle = queue.claim_one("child")
                if handle is not None:
                    handle.ack()
                else:
                    queue.stats()
            except alkstore.EngineError as error:
                with open(report, "w") as out:
                    out.write(f"{error.permanent}\n{error}")
                return
        raise TimeoutError("the store never refused")


def open_at_once(url: str, barrier: Barrier) -> str:
    """Open (and so migrate) a store on ``url`` together with siblings."""
    barrier.wait()
    with alkstore.open(url) as store:
        return type(store).__name__


def enqueue_after(url: str, barrier: Barrier, queue: str, payload: Any) -> int:
    """Enqueue ``payload`` once the parent is listening."""
    with alkstore.open(url) as store:
        barrier.wait()
        return store.queue(queue).enqueue(payload)


def claim_rounds(url: str, barrier: Barrier, worker: str, rounds: int) -> list[tuple[int, int]]:
    """Claim once per round in step with siblings; ack what was won.

    Returns the (id, attempts) of every job this process won.
    """
    won: list[tuple[int, int]] = []
    with alkstore.open(url) as store:
        queue = store.queue("race")
        for _ in range(rounds):
            barrier.wait()
            handle = queue.claim_one(worker)
            if handle is not None:
                won.append((handle.id, handle.attempts))
                handle.ack()
            barrier.wait()
    return won


def churn(url: str, worker: str, jobs: int) -> int:
    """Enqueue, claim and ack ``jobs`` jobs as fast as possible; return how
    many this process acked."""
    acked = 0
    with alkstore.open(url) as store:
        queue = store.queue("churn")
        for i in range(jobs):
            queue.enqueue({"worker": worker, "i": i})
            handle = queue.claim_one(worker)
            if handle is not None and handle.ack():
                acked += 1
    return acked


def resume_after(url: str, barrier: Barrier, queue: str) -> bool:
    """Resume ``queue`` once the parent is listening."""
    with alkstore.open(url) as store:
        barrier.wait()
        return store.queue(queue).resume()


def requeue_after(url: str, barrier: Barrier, queue: str, job_id: int) -> bool:
    """Requeue the dead job ``job_id`` once the parent is listening."""
    with alkstore.open(url) as store:
        barrier.wait()
        return store.queue(queue).requeue(job_id)


def fire_at_once(url: str, barrier: Barrier, name: str, boundary: datetime) -> int | None:
    """Fire the schedule ``name`` at ``boundary`` together with siblings that
    read the same revision; return the job id, or ``None`` if another won."""
    from alkstore.engine import EncodedPayload
    from alkstore.logic.resolution import EnqueueOptions, resolve

    with alkstore.open(url) as store:
        (schedule,) = [s for s in store._list_schedules(None) if s.name == name]
        resolved = resolve(boundary, schedule.queue_opts, EnqueueOptions(run_at=boundary))
        payload = EncodedPayload(schedule.payload_bytes, schedule.content_type)
        next_run_at = boundary + timedelta(minutes=1)
        barrier.wait()
        return store._fire_schedule(schedule, boundary, next_run_at, resolved, payload)


def maintenance_turn_at_once(
    url: str, barrier: Barrier, task: str, interval_s: float, now: datetime
) -> bool:
    """Ask for a turn of ``task`` at the instant ``now`` together with
    siblings; return whether this process got it."""
    from alkstore_contract_tests import ManualClock

    with alkstore.open(url, clock=ManualClock(now)) as store:
        barrier.wait()
        with store._maintenance_turn(task, interval_s) as mine:
            # Everyone decides before anyone leaves its block.
            barrier.wait()
            return mine


def take_turn_and_die(url: str, task: str, interval_s: float, now: datetime) -> None:
    """Take the turn of ``task`` at ``now`` and die inside the block, as a
    crashed sweeper would (exit code 3; 4 if the turn was not given)."""
    from alkstore_contract_tests import ManualClock

    store = alkstore.open(url, clock=ManualClock(now))
    with store._maintenance_turn(task, interval_s) as mine:
        os._exit(3 if mine else 4)
