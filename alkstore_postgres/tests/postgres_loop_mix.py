"""A realistic mix of the native async store's calls, run in a fresh process
under asyncio's debug mode, for test_postgres_async.py's loop-blocking test.

Usage: ``python postgres_loop_mix.py URL SCHEMA SLOW_S``. The loop's
``slow_callback_duration`` is set to ``SLOW_S`` before the store is opened;
asyncio then logs every step of the loop (a callback, or a task's run up to
its next ``await`` that yields) that took longer. Debug mode's own file
reads are done first (:func:`read_sources`). The last line printed is
JSON: ``{"operations": n, "slow": [asyncio's messages]}``. The schema is
created (the store migrates it) and dropped.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import linecache
import logging
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql

import alkstore
from alkstore import QueueOpts
from alkstore_postgres import AsyncPostgresStore
from alkstore_postgres._clock_sample import RESAMPLE_AFTER_S
from alkstore_postgres._compact_async import compact

T = TypeVar("T")


class SlowSteps(logging.Handler):
    """asyncio's reports of slow steps ("Executing ... took N seconds"),
    while :attr:`recording` (the mix runs: not asyncio.run's own teardown,
    which shuts its default executor down on a new thread)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.recording = True

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.recording and message.startswith("Executing") and " took " in message:
            self.messages.append(message)


class Mix:
    def __init__(self) -> None:
        self.operations = 0

    async def __call__(self, call: Awaitable[T]) -> T:
        self.operations += 1
        return await call


async def mix(url: str, schema: str, slow_s: float, slow: SlowSteps) -> int:
    asyncio.get_running_loop().slow_callback_duration = slow_s
    op = Mix()
    # Opening migrates the new schema; the server's clock is sampled.
    async with alkstore.open_async(url, schema=schema) as opened:
        assert isinstance(opened, AsyncPostgresStore)
        store = opened
        q = store.queue("mix", QueueOpts(visibility_timeout_s=30, max_attempts=3))
        sub = await op(store.listen("mix"))
        await op(q.enqueue_many([{"n": i} for i in range(200)]))
        for i in range(100):
            await op(q.enqueue({"n": i}, priority=i % 3))

        async def worker(n: int) -> None:
            while handles := await op(q.claim_batch(f"w{n}", 1 + n % 4)):
                for handle in handles:
                    await op(handle.heartbeat())
                    if handle.id % 7 == 0 and handle.attempts < 2:
                        await op(handle.retry("again", delay=0))
                    elif handle.id % 11 == 0:
                        await op(handle.fail("bad"))
                    elif n % 2:
                        await op(handle.ack())
                    else:
                        await op(q.ack_many([handle]))

        await asyncio.gather(*(worker(n) for n in range(8)))

        # Wakes: a producer's enqueues wake a consumer waiting on the
        # subscription, which claims and acks.
        async def producer() -> None:
            for i in range(20):
                await op(q.enqueue({"wake": i}))
                await asyncio.sleep(0.005)

        async def consumer() -> None:
            taken = 0
            while taken < 20:
                handle = await op(q.claim_one("consumer"))
                if handle is None:
                    await op(sub.wait(1.0))
                    continue
                await op(handle.ack())
                taken += 1

        await asyncio.gather(producer(), consumer())

        # The caller's transactions.
        async with await psycopg.AsyncConnection.connect(url) as app:
            for i in range(10):
                async with app.transaction():
                    await op(q.enqueue_tx(app, {"tx": i}))
        for handle in await op(q.claim_batch("w", 10)):
            await op(handle.ack())

        # The operator's calls.
        await op(q.stats())
        await op(q.lapsed_claims())
        dead = await op(q.dead_jobs())
        if dead:
            await op(q.requeue(dead[0].id))
        await op(q.purge_dead())
        await op(q.pause())
        await op(q.is_paused())
        await op(q.resume())
        job_id = await op(q.enqueue("cancelled"))
        await op(q.get_job(job_id))
        await op(q.cancel(job_id))
        await op(store.queue_names())
        await op(q.sweep_expired())
        await op(store.vacuum_report())

        # Schedules, and a maintenance turn with its sweep.
        await op(store.schedule("tick", "@every 1m", q, {"s": 1}))
        await op(store.schedules())
        await op(store.unreadable_schedules())
        await op(store.unschedule("tick"))
        async with store._maintenance_turn("sweep", 0) as taken:
            if taken:
                await op(q.sweep_expired())

        # A re-sample of the server's clock: the sample made a minute old.
        base = store._server_clock._base
        assert base is not None
        store._server_clock._base = (base[0], base[1] - RESAMPLE_AFTER_S)
        await op(q.enqueue("after a re-sample"))

        # A compaction (the engine runs one after a slow claim).
        await op(compact(store, horizon_min_s=0, dead_min=0, interval_s=0))
        await op(store.migrate())
        await op(sub.close())
    # Steps end with the close's: the step that returns from here is that
    # of the close's last await.
    slow.recording = False
    return op.operations + 1  # and the close


#: The packages whose source lines asyncio's debug mode reads for its
#: tracebacks (see read_sources).
PACKAGES = ("asyncio", "concurrent", "alkstore", "alkstore_postgres", "psycopg", "psycopg_pool")


def read_sources() -> None:
    """Read the source lines of every module of :data:`PACKAGES` into
    ``linecache``, without importing anything. asyncio's debug mode records
    where each future and task was created, reading the lines of every
    frame of the stack from their files the first time (several ms): file
    I/O of the measuring tool, not of the store, which would otherwise be
    counted against the first steps. The engine's own first imports are
    not done here, so they still count."""
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None, package
        assert spec.submodule_search_locations is not None, package
        for folder in spec.submodule_search_locations:
            for path in Path(folder).rglob("*.py"):
                linecache.getlines(str(path))


def main() -> None:
    url, schema, slow_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    read_sources()
    slow = SlowSteps()
    logging.getLogger("asyncio").addHandler(slow)
    try:
        operations = asyncio.run(mix(url, schema, slow_s, slow), debug=True)
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
            admin.execute(drop.format(sql.Identifier(schema)))
    report: dict[str, Any] = {"operations": operations, "slow": slow.messages}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
