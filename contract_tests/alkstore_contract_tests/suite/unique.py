"""Unique keys (docs/contract.md §3 "Unique keys"): while a live job of a
queue holds a key, an enqueue with the same key stores nothing and returns
that job's id; race-free under threads and processes."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from alkstore import Queue, QueueOpts, Store, ValidationError
from alkstore_contract_tests import _children
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import StoreFactory, at, claim_exactly, job
from alkstore_contract_tests.suite.concurrency import (
    BARRIER_TIMEOUT_S,
    SpawnFixtures,
    _Crew,
    _Spawner,
    rounds,
)
from alkstore_contract_tests.suite.transactional import App, AppFixtures

__all__ = ["UniqueKeyConcurrencyTests", "UniqueKeyTests"]


class UniqueKeyTests(AppFixtures):
    """One live job per key and queue; the key is free again once the job
    has left the live rows."""

    def test_a_held_key_returns_the_live_job_and_stores_nothing(self, queue: Queue) -> None:
        first = queue.enqueue({"n": 1}, unique_key="report:7", priority=3)
        assert queue.enqueue({"n": 2}, unique_key="report:7", priority=9, delay=60) == first
        held = job(queue, first)
        assert (held.payload, held.priority, held.run_at, held.unique_key) == (
            {"n": 1},
            3,
            at(0),
            "report:7",
        )
        assert queue.stats() == (1, 0, 0, 0)
        plain = queue.enqueue({"n": 3})
        assert plain > first
        assert job(queue, plain).unique_key is None

    def test_scheduled_processing_and_lapsed_jobs_hold_their_keys(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        later = queue.enqueue("later", unique_key="a", delay=3600)
        assert queue.enqueue("again", unique_key="a") == later
        running = queue.enqueue("running", unique_key="b")
        claim_exactly(queue, running)
        assert queue.enqueue("again", unique_key="b") == running
        clock.advance(31)  # the claim lapsed, with attempts left
        assert queue.enqueue("again", unique_key="b") == running
        assert queue.stats() == (0, 1, 1, 0)

    def test_retry_and_release_keep_the_key(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x", unique_key="k")
        assert claim_exactly(queue, job_id).retry("later", delay=10)
        assert queue.enqueue("y", unique_key="k") == job_id
        clock.advance(10)
        assert claim_exactly(queue, job_id).release()
        assert queue.enqueue("z", unique_key="k") == job_id
        assert (job(queue, job_id).payload, queue.stats()) == ("x", (1, 0, 0, 0))

    def test_the_key_is_free_once_the_job_is_acked_cancelled_or_dead(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        acked = queue.enqueue(1, unique_key="k")
        assert claim_exactly(queue, acked).ack()
        cancelled = queue.enqueue(2, unique_key="k")
        assert cancelled > acked
        assert queue.cancel(cancelled)
        failed = queue.enqueue(3, unique_key="k")
        assert failed > cancelled
        assert claim_exactly(queue, failed).fail("boom")
        dead = job(queue, failed)
        assert (dead.state, dead.unique_key) == ("dead", "k")
        expiring = queue.enqueue(4, unique_key="k", expires=5)
        assert expiring > failed
        clock.advance(5)
        assert queue.sweep_expired().expired == 1
        fresh = queue.enqueue(5, unique_key="k")
        assert fresh > expiring
        assert queue.stats() == (1, 0, 0, 2)

    def test_keys_belong_to_their_queue(self, store: Store) -> None:
        a = store.queue("a").enqueue("x", unique_key="k")
        b = store.queue("b").enqueue("x", unique_key="k")
        assert a != b
        assert store.queue("a").enqueue("y", unique_key="k") == a
        assert store.queue("b").get_job(a) is None

    def test_enqueue_many_takes_a_key_per_item(self, queue: Queue) -> None:
        live = queue.enqueue("live", unique_key="held")
        ids = queue.enqueue_many(
            ["a", "b", "c", "d", "e"], unique_keys=["k1", None, "k1", "held", "k2"]
        )
        assert ids[0] == ids[2]
        assert ids[3] == live
        new = [ids[0], ids[1], ids[4]]
        assert new == sorted(new)
        assert min(new) > live
        assert [job(queue, i).payload for i in new] == ["a", "b", "e"]
        assert [job(queue, i).unique_key for i in new] == ["k1", None, "k2"]
        assert queue.stats() == (4, 0, 0, 0)
        assert queue.enqueue_many([], unique_keys=[]) == []

    def test_a_dead_job_stays_dead_while_a_live_job_holds_its_key(self, queue: Queue) -> None:
        first = queue.enqueue("first", unique_key="k")
        assert claim_exactly(queue, first).fail("boom")
        second = queue.enqueue("second", unique_key="k")
        assert not queue.requeue(first)
        assert job(queue, first).state == "dead"
        assert claim_exactly(queue, second).ack()
        assert queue.requeue(first)
        back = job(queue, first)
        assert (back.state, back.unique_key) == ("pending", "k")
        assert queue.enqueue("third", unique_key="k") == first

    @pytest.mark.parametrize(
        "key",
        ["", "k" * 256, 7, b"k", "a\x00b", "\ud800"],
        ids=["empty", "long", "int", "bytes", "nul", "surrogate"],
    )
    def test_bad_keys_are_refused_before_anything_is_written(
        self, queue: Queue, key: object
    ) -> None:
        with pytest.raises(ValidationError, match="unique_key"):
            queue.enqueue("x", unique_key=key)
        with pytest.raises(ValidationError, match=r"unique_keys\[1\]"):
            queue.enqueue_many(["x", "y"], unique_keys=[None, key])
        assert queue.stats() == (0, 0, 0, 0)

    @pytest.mark.parametrize(
        "keys", ["ab", ["k"], ["a", "b", "c"], 5], ids=["str", "short", "long", "int"]
    )
    def test_unique_keys_must_be_one_per_payload(self, queue: Queue, keys: object) -> None:
        with pytest.raises(ValidationError, match="unique_keys"):
            queue.enqueue_many(["x", "y"], unique_keys=keys)
        assert queue.stats() == (0, 0, 0, 0)

    def test_the_longest_key_is_kept_exactly(self, queue: Queue) -> None:
        key = "é" * 254 + "k"
        job_id = queue.enqueue("x", unique_key=key)
        assert job(queue, job_id).unique_key == key
        assert queue.enqueue("y", unique_key=key) == job_id

    def test_enqueue_tx_sees_its_own_transaction_and_a_rollback_frees_the_key(
        self, app: App, store: Store, queue: Queue, open_store: StoreFactory
    ) -> None:
        other = open_store().queue("jobs")
        self.begin(app.conn)
        inside = queue.enqueue_tx(app.conn, "one", unique_key="order:1")
        assert queue.enqueue_tx(app.conn, "two", unique_key="order:1") == inside
        app.rollback()
        assert other.get_job(inside) is None
        committed = other.enqueue("three", unique_key="order:1")
        self.begin(app.conn)
        assert queue.enqueue_tx(app.conn, "four", unique_key="order:1") == committed
        app.commit()
        assert other.stats() == (1, 0, 0, 0)
        assert job(other, committed).payload == "three"


class UniqueKeyConcurrencyTests(SpawnFixtures):
    """Many enqueues of one key at once store exactly one job: the engine's
    unique index decides, not a check before the insert."""

    THREADS = 32
    PROCESSES = 4

    def test_threads_enqueueing_one_key_at_once_store_one_job(
        self, open_store: StoreFactory
    ) -> None:
        total = rounds("ALKSTORE_UNIQUE_RACE_ROUNDS", 10)
        queues = [open_store().queue("race", QueueOpts()) for _ in range(self.THREADS)]
        barrier = threading.Barrier(self.THREADS)
        got: list[list[int]] = [[0] * self.THREADS for _ in range(total)]

        def worker(index: int) -> None:
            for round_ in range(total):
                barrier.wait(BARRIER_TIMEOUT_S)
                got[round_][index] = queues[index].enqueue(
                    {"from": index}, unique_key=f"round-{round_}"
                )

        with _Crew(self.THREADS, worker) as crew:
            pass
        assert not crew.errors, crew.errors[0]
        queue = queues[0]
        for round_, ids in enumerate(got):
            assert len(set(ids)) == 1, f"round {round_}: {Counter(ids)}"
            assert job(queue, ids[0]).unique_key == f"round-{round_}"
        assert queue.stats() == (total, 0, 0, 0)

    @pytest.mark.slow
    def test_processes_enqueueing_one_key_at_once_store_one_job(
        self, spawn: _Spawner, store: Store
    ) -> None:
        total = rounds("ALKSTORE_UNIQUE_RACE_ROUNDS", 10)
        reports = self.run_together(
            spawn,
            _children.unique_enqueue_child,
            self.PROCESSES,
            queue_name="race",
            rounds=total,
        )
        queue = store.queue("race")
        for round_ in range(total):
            ids = {r[3][round_] for r in reports}
            assert len(ids) == 1, f"round {round_}: {reports}"
            assert job(queue, ids.pop()).unique_key == f"round-{round_}"
        assert queue.stats() == (total, 0, 0, 0)
