"""Exactly-once claims under concurrency (regression case 001, the task card's
"two workers, one row" and "6x40 concurrent drain"), on threads with their
own stores and on processes."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import postgres_children
import pytest
from postgres_helpers import in_threads

from alkstore import JobHandle, QueueOpts
from alkstore_postgres import PostgresStore

pytestmark = pytest.mark.postgres


def test_two_workers_one_row(open_pg: Callable[..., PostgresStore]) -> None:
    stores = [open_pg(), open_pg()]
    producer = stores[0].queue("race")
    rounds = 100
    barrier = threading.Barrier(2)
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

    in_threads(2, worker)
    for r, handles in enumerate(outcomes):
        won = [h for h in handles if h is not None]
        assert len(won) == 1, r
        assert won[0].attempts == 1
        assert won[0].payload == r


def test_eight_stores_race_for_one_job(open_pg: Callable[..., PostgresStore]) -> None:
    threads, rounds = 8, 200
    stores = [open_pg(pool_max_size=1) for _ in range(threads)]
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
            if handle is not None:
                assert handle.ack()
            with lock:
                outcomes[r].append(handle)
            barrier.wait()

    in_threads(threads, worker)
    for r, handles in enumerate(outcomes):
        won = [h for h in handles if h is not None]
        assert len(won) == 1, r
        assert won[0].attempts == 1
        assert won[0].payload == r


def test_five_batches_split_fifty_jobs(open_pg: Callable[..., PostgresStore]) -> None:
    stores = [open_pg(pool_max_size=1) for _ in range(5)]
    ids = stores[0].queue("race").enqueue_many(list(range(50)))
    barrier = threading.Barrier(5)

    def worker(i: int) -> list[JobHandle]:
        barrier.wait()
        return stores[i].queue("race").claim_batch(f"w{i}", 20)

    handles = [h for batch in in_threads(5, worker) for h in batch]
    assert sorted(h.id for h in handles) == ids
    assert all(h.attempts == 1 for h in handles)


def test_six_threads_drain_240_jobs(open_pg: Callable[..., PostgresStore]) -> None:
    stores = [open_pg() for _ in range(6)]
    ids = stores[0].queue("drain").enqueue_many([{"i": i} for i in range(240)])
    barrier = threading.Barrier(6)

    def worker(i: int) -> list[int]:
        q = stores[i].queue("drain")
        claimed: list[int] = []
        barrier.wait()
        while handles := q.claim_batch(f"w{i}", 4):
            for handle in handles:
                assert handle.attempts == 1
                claimed.append(handle.id)
            assert q.ack_batch([h.id for h in handles]) == len(handles)
        return claimed

    claimed = [job_id for part in in_threads(6, worker) for job_id in part]
    assert Counter(claimed) == Counter(ids)  # every id exactly once
    assert stores[0].queue("drain").stats() == (0, 0, 0, 0)


def test_one_store_shared_by_six_threads(open_pg: Callable[..., PostgresStore]) -> None:
    store = open_pg(pool_max_size=4)
    q = store.queue("drain")
    ids = q.enqueue_many(list(range(240)))

    def worker(i: int) -> list[int]:
        claimed = []
        while handle := q.claim_one(f"w{i}"):
            claimed.append(handle.id)
            assert handle.ack()
        return claimed

    claimed = [job_id for part in in_threads(6, worker) for job_id in part]
    assert Counter(claimed) == Counter(ids)


@pytest.mark.slow
def test_six_processes_drain_240_jobs(
    postgres_url: str, schema: str, open_pg: Callable[..., PostgresStore]
) -> None:
    store = open_pg(clock=None)  # the children use the server's clock too
    ids = store.queue("drain").enqueue_many([{"i": i} for i in range(240)])
    barrier = postgres_children.barrier(6)
    parts = postgres_children.run_children(
        postgres_children.drain,
        [(postgres_url, schema, f"p{i}", barrier) for i in range(6)],
    )
    claimed = [job_id for part in parts for job_id in part]
    assert Counter(claimed) == Counter(ids)  # no double claim, none missing
    assert store.queue("drain").stats() == (0, 0, 0, 0)


def test_lapsed_claims_are_reclaimed_once(
    open_pg: Callable[..., PostgresStore], clock: Any
) -> None:
    stores = [open_pg() for _ in range(4)]
    q0 = stores[0].queue("lapse", QueueOpts(visibility_timeout_s=10))
    ids = q0.enqueue_many(list(range(40)))
    first = q0.claim_batch("dead-worker", 40)
    assert len(first) == 40
    clock.advance(10)  # every claim lapses (now >= deadline)
    barrier = threading.Barrier(4)

    def worker(i: int) -> list[JobHandle]:
        barrier.wait()
        return stores[i].queue("lapse").claim_batch(f"w{i}", 15)

    handles = [h for batch in in_threads(4, worker) for h in batch]
    # The first claim to lock the lapsed claims moves them all to 'lapsed'
    # (D25); a claim running beside it skips the rows it holds, so the
    # others may come back short (as beside a claim that moves came-due
    # rows) and find the rest on their next claim.
    assert handles
    while len(handles) < len(ids):
        more = stores[0].queue("lapse").claim_batch("w0", 15)
        assert more
        handles += more
    assert sorted(h.id for h in handles) == ids  # none twice, none missing
    assert {h.attempts for h in handles} == {2}
    assert not any(h.ack() for h in first)  # the stale handles touch nothing
    assert all(h.ack() for h in handles)


def test_concurrent_sweeps_split_the_work(
    open_pg: Callable[..., PostgresStore], clock: Any
) -> None:
    stores = [open_pg() for _ in range(4)]
    opts = QueueOpts(expires_s=60, dead_letter_retention_s=0)
    q0 = stores[0].queue("sweep", opts)
    ids = q0.enqueue_many(list(range(300)))
    q0.claim_batch("w", 100)  # expiry takes processing rows too
    clock.advance(60)
    barrier = threading.Barrier(4)

    def sweeper(i: int) -> tuple[int, int]:
        barrier.wait()
        expired, purged = stores[i].queue("sweep", opts).sweep_expired()
        return expired, purged

    results = in_threads(4, sweeper)
    assert sum(expired for expired, _ in results) == len(ids)  # each row once
    assert sum(purged for _, purged in results) == len(ids)  # retention 0: gone at once
    assert q0.stats() == (0, 0, 0, 0)
