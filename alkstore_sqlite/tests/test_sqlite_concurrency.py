"""Exactly-once claims and no "database is locked" under contention (handed
case 001), with threads and processes on one WAL file."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlite_children

from alkstore import JobHandle
from alkstore_sqlite import SqliteStore


def _in_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def test_eight_stores_race_for_one_job(open_sqlite: Callable[..., SqliteStore]) -> None:
    threads, rounds = 8, 200
    stores = [open_sqlite() for _ in range(threads)]
    producer = stores[0].queue("race")
    barrier = threading.Barrier(threads)
    outcomes: list[list[JobHandle | None]] = [[] for _ in range(rounds)]
    lock = threading.Lock()

    def worker(i: int) -> None:
        queue = stores[i].queue("race")
        for r in range(rounds):
            if i == 0:
                producer.enqueue(r)
            barrier.wait()
            handle = queue.claim_one(f"w{i}")
            with lock:
                outcomes[r].append(handle)
            barrier.wait()

    _in_threads(threads, worker)
    for r, handles in enumerate(outcomes):
        won = [h for h in handles if h is not None]
        assert len(won) == 1, r
        assert won[0].attempts == 1
        assert won[0].payload == r
        assert won[0].ack()


def test_five_stores_batch_claim_fifty_jobs(open_sqlite: Callable[..., SqliteStore]) -> None:
    stores = [open_sqlite() for _ in range(5)]
    ids = stores[0].queue("race").enqueue_many(list(range(50)))
    barrier = threading.Barrier(5)

    def worker(i: int) -> list[JobHandle]:
        barrier.wait()
        return stores[i].queue("race").claim_batch(f"w{i}", 20)

    handles = [h for batch in _in_threads(5, worker) for h in batch]
    assert sorted(h.id for h in handles) == ids
    assert {h.attempts for h in handles} == {1}


def test_threads_share_one_store(store: SqliteStore) -> None:
    queue = store.queue("shared")
    queue.enqueue_many(list(range(400)))

    def worker(i: int) -> list[int]:
        got = []
        while (handle := queue.claim_one(f"w{i}")) is not None:
            assert handle.ack()
            got.append(handle.id)
        return got

    claimed = [i for batch in _in_threads(8, worker) for i in batch]
    assert len(claimed) == len(set(claimed)) == 400


@pytest.mark.slow
def test_four_processes_race_for_one_job(db_url: str) -> None:
    processes, rounds = 4, 200
    with SqliteStore(db_url.removeprefix("sqlite:///")) as store:
        ids = store.queue("race").enqueue_many(list(range(rounds)))
    barrier = sqlite_children.barrier(processes)
    won = sqlite_children.run_children(
        sqlite_children.claim_rounds,
        [(db_url, barrier, f"w{i}", rounds) for i in range(processes)],
    )
    claims = [claim for per_process in won for claim in per_process]
    assert sorted(job_id for job_id, _ in claims) == ids
    assert {attempts for _, attempts in claims} == {1}


@pytest.mark.slow
def test_processes_churn_without_lock_errors(db_url: str) -> None:
    processes, jobs = 4, 300
    acked = sqlite_children.run_children(
        sqlite_children.churn, [(db_url, f"w{i}", jobs) for i in range(processes)]
    )
    with SqliteStore(db_url.removeprefix("sqlite:///")) as store:
        stats = store.queue("churn").stats()
    assert sum(acked) + stats.pending == processes * jobs
    assert stats.processing == 0
