"""What handle operations do: retry and backoff, fail, heartbeat, release,
dead letters (docs/contract.md §3 "Claim identity and handle validity",
"Backoff", "Release", "Dead letters")."""

from __future__ import annotations

import dataclasses
import math
import random
from datetime import timedelta

import pytest

from alkstore import Queue, QueueOpts, Store
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import (
    ContractFixtures,
    RecordingRng,
    StoreFactory,
    at,
    claim_exactly,
    job,
)
from alkstore_contract_tests.suite.claim import HandleValidityTests
from alkstore_contract_tests.suite.wake import QUIET_S, WAKE_TIMEOUT_S

__all__ = ["DeadLetterTests", "FailTests", "HeartbeatTests", "ReleaseTests", "RetryTests"]


class RetryTests(ContractFixtures):
    """``JobHandle.retry`` and the backoff curve."""

    def test_retry_below_budget_returns_the_job_to_pending(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x", max_attempts=3)
        handle = claim_exactly(queue, job_id, "w1")
        clock.set(at(10))
        assert handle.retry("first error", delay=15) is True
        got = job(queue, job_id)
        assert (got.state, got.run_at, got.last_error, got.attempts) == (
            "pending",
            at(25),
            "first error",
            1,
        )
        assert (got.worker_id, got.claim_deadline, got.died_at) == (None, None, None)
        assert (got.enqueued_at, got.payload, got.max_attempts) == (T0, "x", 3)
        assert queue.stats() == (0, 1, 0, 0)
        clock.set(at(25))
        again = claim_exactly(queue, job_id, "w2")
        assert again.attempts == 2
        assert again.last_error == "first error"

    @pytest.mark.parametrize(
        ("delay", "due"),
        [(0, at(10)), (0.5, at(10.5)), (timedelta(minutes=1), at(70))],
        ids=["zero", "float", "timedelta"],
    )
    def test_explicit_delay(
        self, queue: Queue, clock: ManualClock, delay: float | timedelta, due: object
    ) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        clock.set(at(10))
        assert handle.retry("e", delay=delay)
        assert job(queue, job_id).run_at == due

    def test_retry_at_the_budget_dead_letters(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x", max_attempts=2)
        assert claim_exactly(queue, job_id).retry("one", delay=0)
        handle = claim_exactly(queue, job_id, "w2")
        clock.set(at(12))
        assert handle.retry("two", delay=0) is True
        dead = job(queue, job_id)
        assert (dead.state, dead.last_error, dead.died_at) == (
            "dead",
            "max attempts exceeded",
            at(12),
        )
        assert (dead.attempts, dead.worker_id, dead.claim_deadline) == (2, "w2", at(30))
        assert queue.stats() == (0, 0, 0, 1)
        assert handle.ack() is False

    def test_retry_at_budget_one(self, queue: Queue) -> None:
        job_id = queue.enqueue("x", max_attempts=1)
        assert claim_exactly(queue, job_id).retry("e") is True
        assert job(queue, job_id).last_error == "max attempts exceeded"

    def test_backoff_draws_from_the_store_rng_over_the_row_stamps(
        self, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        rng = RecordingRng()
        store = open_store(rng=rng)
        q = store.queue("jobs", QueueOpts(backoff_base_s=3, backoff_cap_s=20, max_attempts=9))
        job_id = q.enqueue("x")
        seen = []
        for attempt in range(1, 6):
            handle = claim_exactly(q, job_id)
            assert handle.attempts == attempt
            assert handle.retry("e")
            due = job(q, job_id).run_at
            seen.append(int((due - clock()).total_seconds()))
            clock.set(due)
        # exp = min(20, 3 * 2**(attempt-1)): 3, 6, 12, 20, 20
        assert rng.calls == [(2, 3), (3, 6), (6, 12), (10, 20), (10, 20)]
        assert seen == [3, 6, 12, 20, 20]

    def test_backoff_with_a_seeded_rng_stays_in_range(
        self, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        store = open_store(rng=random.Random(1234))
        q = store.queue("jobs", QueueOpts(backoff_base_s=5, max_attempts=1000))
        job_id = q.enqueue("x")
        for attempt in range(1, 16):
            handle = claim_exactly(q, job_id)
            assert handle.retry("e")
            got = job(q, job_id)
            delay = (got.run_at - clock()).total_seconds()
            exp = min(3600, 5 * 2 ** (attempt - 1))
            assert delay == int(delay)
            assert math.ceil(exp / 2) <= delay <= exp, (attempt, delay)
            clock.set(got.run_at)

    def test_backoff_base_zero_retries_at_once(
        self, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        rng = RecordingRng()
        q = open_store(rng=rng).queue("jobs", QueueOpts(backoff_base_s=0))
        job_id = q.enqueue("x")
        clock.set(at(7))
        assert claim_exactly(q, job_id).retry("e")
        assert job(q, job_id).run_at == at(7)
        assert rng.calls == []
        claim_exactly(q, job_id)

    def test_backoff_cap_zero_retries_at_once(self, store: Store, clock: ManualClock) -> None:
        q = store.queue("jobs", QueueOpts(backoff_base_s=100, backoff_cap_s=0))
        job_id = q.enqueue("x")
        assert claim_exactly(q, job_id).retry("e")
        assert job(q, job_id).run_at == T0


class FailTests(ContractFixtures):
    """``JobHandle.fail``."""

    def test_fail_moves_the_job_to_the_dead_table(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue({"p": 1}, priority=3, max_attempts=4, expires=3600)
        handle = claim_exactly(queue, job_id, "w1")
        clock.set(at(5))
        assert handle.fail("boom") is True
        dead = job(queue, job_id)
        assert dead == dataclasses.replace(
            handle.job, state="dead", last_error="boom", died_at=at(5)
        )
        assert queue.stats() == (0, 0, 0, 1)

    def test_fail_keeps_the_heartbeat_deadline_of_the_last_claim(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        clock.set(at(20))
        assert handle.heartbeat(100)
        clock.set(at(40))
        assert handle.fail() is True
        dead = job(queue, job_id)
        assert (dead.claim_deadline, dead.died_at, dead.last_error) == (at(120), at(40), "failed")


class HeartbeatTests(ContractFixtures):
    """``JobHandle.heartbeat``: absolute, repeatable, refused when late."""

    def test_default_extension_is_the_row_visibility_timeout_from_now(
        self, store: Store, clock: ManualClock
    ) -> None:
        job_id = store.queue("jobs", QueueOpts(visibility_timeout_s=30)).enqueue("x")
        handle = claim_exactly(store.queue("jobs", QueueOpts(visibility_timeout_s=500)), job_id)
        clock.set(at(20))
        assert handle.heartbeat() is True
        assert job(store.queue("jobs"), job_id).claim_deadline == at(50)

    @pytest.mark.parametrize(
        ("seconds", "micros"),
        [
            (2.5e-6, 2),
            (3.5e-6, 4),
            (1.7e-6, 2),
            (30.0000005, 30_000_000),
            # seconds * 1e6 is a half in binary, the exact value just below.
            (18.0340635, 18_034_064),
        ],
    )
    def test_a_claim_and_a_heartbeat_round_a_timeout_alike(
        self, store: Store, clock: ManualClock, seconds: float, micros: int
    ) -> None:
        """Sub-microsecond timeouts round to the nearest microsecond, halves
        to even (IEEE rint of seconds * 1e6): the claim's
        deadline from the row's stamp and a heartbeat's from its argument
        lapse at the same instant, on every engine."""
        q = store.queue("jobs", QueueOpts(visibility_timeout_s=seconds))
        handle = claim_exactly(q, q.enqueue("x"))
        assert handle.claim_deadline == T0 + timedelta(microseconds=micros)
        assert handle.heartbeat(seconds) is True
        assert job(q, handle.id).claim_deadline == T0 + timedelta(microseconds=micros)

    @pytest.mark.parametrize(
        ("seconds", "micros"), [(18.0340635, 18_034_064), (4.1057185, 4_105_718), (2.5e-6, 2)]
    )
    def test_every_duration_rounds_by_the_claims_rule(
        self, store: Store, clock: ManualClock, seconds: float, micros: int
    ) -> None:
        """Every duration argument becomes whole microseconds by one rule
        (D26): ``seconds * 1e6`` rounded half to even, as the claim's deadline
        from the row's stamp; the exact binary value, rounded, would differ
        by one microsecond for the first two."""
        q = store.queue("jobs", QueueOpts(visibility_timeout_s=seconds))
        then = T0 + timedelta(microseconds=micros)
        assert job(q, q.enqueue("later", delay=seconds)).run_at == then
        expiring = q.enqueue("expiring", expires=seconds)
        assert job(q, expiring).expires_at == then
        assert q.cancel(expiring)
        handle = claim_exactly(q, q.enqueue("claimed"))
        assert handle.claim_deadline == then
        assert handle.heartbeat(seconds) is True
        assert job(q, handle.id).claim_deadline == then
        assert handle.retry("again", delay=seconds) is True
        assert job(q, handle.id).run_at == then
        dead = claim_exactly(q, q.enqueue("dead"))
        assert dead.fail("boom") is True
        assert q.requeue(dead.id, delay=seconds) is True
        assert job(q, dead.id).run_at == then

    def test_heartbeat_is_absolute_not_additive(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        clock.set(at(20))
        assert handle.heartbeat(100) is True
        assert job(queue, job_id).claim_deadline == at(120)
        clock.set(at(25))
        assert handle.heartbeat(5) is True
        assert job(queue, job_id).claim_deadline == at(30)
        assert handle.heartbeat(timedelta(seconds=1.5)) is True
        assert job(queue, job_id).claim_deadline == at(26.5)

    def test_heartbeat_keeps_the_claim_valid_past_the_old_deadline(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        for now in (20, 40, 60, 80):
            clock.set(at(now))
            assert handle.heartbeat() is True
        clock.set(at(109))
        assert queue.claim_one("other") is None
        assert handle.ack() is True

    def test_late_heartbeat_is_refused(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        clock.set(at(30))
        assert handle.heartbeat() is False
        assert handle.heartbeat(1000) is False
        assert job(queue, job_id).claim_deadline == at(30)
        claim_exactly(queue, job_id, "w2")

    def test_handle_snapshot_is_not_refreshed(self, queue: Queue, clock: ManualClock) -> None:
        handle = claim_exactly(queue, queue.enqueue("x"))
        snapshot = handle.job
        clock.set(at(10))
        assert handle.heartbeat(100)
        assert handle.job == snapshot
        assert handle.claim_deadline == at(30)
        assert handle.state == "processing"


class ReleaseTests(ContractFixtures):
    """``JobHandle.release``: a claim given back unused (docs/contract.md §3
    "Release")."""

    def test_a_released_job_is_due_at_once_in_its_old_place(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        first = queue.enqueue("first", max_attempts=3)
        second = queue.enqueue("second")
        handle = claim_exactly(queue, first, "w1")
        clock.set(at(7))
        assert handle.release() is True
        released = job(queue, first)
        assert released == dataclasses.replace(
            handle.job, state="pending", worker_id=None, claim_deadline=None, max_attempts=4
        )
        assert released.run_at == T0  # no backoff, its place kept
        assert queue.stats() == (2, 0, 0, 0)
        again = claim_exactly(queue, first, "w2")  # before the later job
        assert (again.attempts, again.max_attempts, again.worker_id) == (2, 4, "w2")
        assert claim_exactly(queue, second, "w2").attempts == 1

    def test_the_released_claim_is_not_counted_against_the_budget(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x", max_attempts=1)
        assert claim_exactly(queue, job_id).release() is True
        last = claim_exactly(queue, job_id)
        assert (last.attempts, last.max_attempts) == (2, 2)
        # Its one real attempt retries as any last attempt does: dead.
        assert last.retry("boom", delay=0) is True
        assert job(queue, job_id).state == "dead"

    def test_the_released_handle_never_touches_the_next_claim(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x")
        old = claim_exactly(queue, job_id, "w1")
        assert old.release() is True
        new = claim_exactly(queue, job_id, "w1")  # the same worker, even
        clock.set(at(10))
        HandleValidityTests.refused(old)
        assert job(queue, job_id) == new.job
        assert new.attempts == old.attempts + 1
        assert new.ack() is True

    def test_a_lapsed_or_reclaimed_claim_cannot_be_released(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        clock.set(at(30))
        before = job(queue, job_id)
        assert handle.release() is False
        assert job(queue, job_id) == before
        newer = claim_exactly(queue, job_id, "w2")
        assert handle.release() is False
        assert job(queue, job_id).worker_id == "w2"
        assert newer.release() is True

    def test_release_spends_the_handle(self, queue: Queue) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        assert handle.release() is True
        assert handle.release() is False
        assert handle.heartbeat() is False
        assert job(queue, job_id).state == "pending"

    def test_release_keeps_the_last_error_and_the_expiry(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x", expires=100)
        assert claim_exactly(queue, job_id).retry("boom", delay=0) is True
        handle = claim_exactly(queue, job_id)
        assert handle.release() is True
        released = job(queue, job_id)
        assert (released.last_error, released.expires_at) == ("boom", at(100))

    def test_release_wakes_the_queues_subscribers(self, store: Store, queue: Queue) -> None:
        with store.listen(queue.name) as sub:
            handle = claim_exactly(queue, queue.enqueue("x"))
            assert sub.wait(WAKE_TIMEOUT_S) is True  # the enqueue's
            assert sub.wait(QUIET_S) is False
            assert handle.release() is True
            assert sub.wait(WAKE_TIMEOUT_S) is True


class DeadLetterTests(ContractFixtures):
    """docs/contract.md §3 "Dead letters": the dead table keeps the job visible."""

    def test_dead_job_keeps_everything_and_cannot_be_revived(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue(b"\x00bytes", priority=2, max_attempts=3, delay=1)
        clock.set(at(1))
        handle = claim_exactly(queue, job_id, "w9")
        assert handle.fail("why")
        dead = job(queue, job_id)
        assert dead.state == "dead"
        assert (dead.payload, dead.payload_bytes, dead.content_type) == (
            b"\x00bytes",
            b"\x00bytes",
            "application/octet-stream",
        )
        assert (dead.priority, dead.max_attempts, dead.run_at, dead.enqueued_at) == (
            2,
            3,
            at(1),
            T0,
        )
        assert (dead.attempts, dead.worker_id, dead.claim_deadline) == (1, "w9", at(31))
        assert (dead.visibility_timeout_s, dead.backoff_base_s, dead.backoff_cap_s) == (30, 4, 3600)
        assert (dead.last_error, dead.died_at) == ("why", at(1))
        assert queue.cancel(job_id) is False
        assert queue.ack_batch([job_id]) == 0
        assert job(queue, job_id) == dead

    def test_live_jobs_have_no_died_at(self, queue: Queue) -> None:
        job_id = queue.enqueue("x")
        assert job(queue, job_id).died_at is None
        handle = claim_exactly(queue, job_id)
        assert handle.died_at is None
        assert handle.retry("e", delay=0)
        assert job(queue, job_id).died_at is None
