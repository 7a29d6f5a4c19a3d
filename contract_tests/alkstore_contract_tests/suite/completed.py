"""Completed jobs (docs/contract.md §3 "Completed jobs"): an ack through a
queue handle with ``keep_completed_s`` keeps the job as ``"completed"``
with ``finished_at`` and its result, out of every claim's sight, until a
sweep through such a handle purges it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from alkstore import Queue, QueueOpts, Store, ValidationError
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, at, claim_exactly, job

__all__ = ["CompletedJobTests"]

KEEP_S = 3600


class CompletedJobTests(ContractFixtures):
    """Kept, read, never claimed, purged after the retention."""

    @pytest.fixture
    def keeping(self, store: Store) -> Queue:
        """Queue ``"jobs"`` through a handle that keeps completed jobs an hour."""
        return store.queue("jobs", QueueOpts(keep_completed_s=KEEP_S))

    def test_an_ack_keeps_the_job_completed_with_its_result(
        self, keeping: Queue, clock: ManualClock
    ) -> None:
        job_id = keeping.enqueue({"n": 1}, unique_key="k", priority=2)
        handle = claim_exactly(keeping, job_id)
        clock.advance(5)
        assert handle.ack({"total": 42, "items": [1, 2]})
        done = job(keeping, job_id)
        assert (done.state, done.finished_at, done.result) == (
            "completed",
            at(5),
            {"total": 42, "items": [1, 2]},
        )
        assert done.result_bytes == b'{"total":42,"items":[1,2]}'
        # Everything else as the claim left it.
        assert (done.payload, done.priority, done.attempts, done.worker_id) == ({"n": 1}, 2, 1, "w")
        assert (done.claim_deadline, done.unique_key, done.died_at) == (at(30), "k", None)
        assert handle.job.finished_at is None  # the claim's snapshot
        assert not handle.ack()  # spent

    def test_a_completed_job_is_never_claimed_counted_cancelled_or_requeued(
        self, keeping: Queue, clock: ManualClock
    ) -> None:
        job_id = keeping.enqueue("x", unique_key="k")
        assert claim_exactly(keeping, job_id).ack()
        clock.advance(100)  # past any deadline
        assert keeping.claim_batch("w", 10) == []
        assert keeping.stats() == (0, 0, 0, 0)
        assert keeping.lapsed_claims() == 0
        assert not keeping.cancel(job_id)
        assert not keeping.requeue(job_id)
        assert keeping.dead_jobs() == []
        assert job(keeping, job_id).state == "completed"
        # Its unique key is free: the job is not live.
        assert keeping.enqueue("y", unique_key="k") != job_id

    def test_without_a_result_the_result_is_none(self, keeping: Queue) -> None:
        job_id = keeping.enqueue("x")
        assert claim_exactly(keeping, job_id).ack()
        assert (job(keeping, job_id).result_bytes, job(keeping, job_id).result) == (None, None)

    def test_a_handle_that_does_not_keep_deletes_and_another_that_does_keeps(
        self, store: Store, keeping: Queue
    ) -> None:
        plain = store.queue("jobs")
        first, second = plain.enqueue_many(["a", "b"])
        assert claim_exactly(plain, first).ack({"ignored": True})
        assert plain.get_job(first) is None
        assert claim_exactly(keeping, second).ack()
        assert job(plain, second).state == "completed"

    def test_ack_many_keeps_each_result_and_ack_batch_keeps_without(
        self, keeping: Queue, clock: ManualClock
    ) -> None:
        ids = keeping.enqueue_many(["a", "b", "c", "d"])
        handles = keeping.claim_batch("w", 4)
        assert [h.id for h in handles] == ids
        clock.advance(1)
        assert keeping.ack_many(handles[:3], results=[1, None, "three"]) == [True, True, True]
        assert [job(keeping, i).result for i in ids[:3]] == [1, None, "three"]
        assert {job(keeping, i).finished_at for i in ids[:3]} == {at(1)}
        assert keeping.ack_batch([ids[3], ids[0]]) == 1
        last = job(keeping, ids[3])
        assert (last.state, last.result, last.finished_at) == ("completed", None, at(1))

    def test_results_are_checked_before_anything_is_written(self, keeping: Queue) -> None:
        job_id = keeping.enqueue("x")
        handle = claim_exactly(keeping, job_id)
        for bad in (b"bytes", float("nan"), {1: "int key"}, (1, 2)):
            with pytest.raises(ValidationError, match="result"):
                handle.ack(bad)
            with pytest.raises(ValidationError, match=r"results\[0\]"):
                keeping.ack_many([handle], results=[bad])
        with pytest.raises(ValidationError, match="one result per handle"):
            keeping.ack_many([handle], results=[1, 2])
        assert job(keeping, job_id).state == "processing"
        assert handle.ack([1.5, "ok", None, True])
        assert job(keeping, job_id).result == [1.5, "ok", None, True]

    def test_a_sweep_purges_completed_jobs_after_the_retention(
        self, store: Store, keeping: Queue, clock: ManualClock
    ) -> None:
        first, second = keeping.enqueue_many(["a", "b"])
        assert claim_exactly(keeping, first).ack()
        clock.advance(10)
        assert claim_exactly(keeping, second).ack()
        clock.set(at(KEEP_S) - timedelta(microseconds=1))  # just before the first's end
        assert keeping.sweep_expired() == (0, 0)
        # A handle that does not keep completed jobs purges none of them.
        clock.set(at(KEEP_S + 10))
        assert store.queue("jobs").sweep_expired() == (0, 0)
        clock.set(at(KEEP_S))  # finished_at + keep <= now, for the first only
        assert keeping.sweep_expired() == (0, 1)
        assert keeping.get_job(first) is None
        assert job(keeping, second).state == "completed"
        assert store.queue("jobs", QueueOpts(keep_completed_s=0)).sweep_expired() == (0, 1)
        assert keeping.get_job(second) is None

    def test_a_queue_with_only_completed_jobs_is_listed(self, store: Store, keeping: Queue) -> None:
        job_id = keeping.enqueue("x")
        assert claim_exactly(keeping, job_id).ack()
        assert store.queue_names() == ["jobs"]

    def test_a_lapsed_claim_is_not_completed(self, keeping: Queue, clock: ManualClock) -> None:
        job_id = keeping.enqueue("x")
        handle = claim_exactly(keeping, job_id)
        clock.advance(30)
        assert not handle.ack("late")
        assert job(keeping, job_id).state == "processing"
        assert keeping.ack_many([handle], results=["late"]) == [False]
        assert keeping.ack_batch([job_id]) == 0

    def test_ack_many_keeps_each_claims_own_result_by_its_identity(
        self, keeping: Queue, clock: ManualClock
    ) -> None:
        job_id = keeping.enqueue("x")
        stale = claim_exactly(keeping, job_id)
        clock.advance(30)  # lapsed: the next claim is the job's
        fresh = claim_exactly(keeping, job_id)
        assert keeping.ack_many([stale, fresh], results=["old", "new"]) == [False, True]
        done = job(keeping, job_id)
        assert (done.state, done.attempts, done.result) == ("completed", 2, "new")
