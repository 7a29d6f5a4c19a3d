"""Functions run in child processes by the tests (importable by ``spawn``).

Children open their own stores from a URL and a schema name, with the
server's clock (no injected clock crosses a process boundary here).
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable, Sequence
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
