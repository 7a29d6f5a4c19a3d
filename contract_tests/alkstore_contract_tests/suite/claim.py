"""Claims and handle validity (docs/contract.md §3 "Claim", "Claim identity and handle
validity")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from alkstore import JobHandle, Queue, QueueOpts, Store
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, at, claim_exactly, job

__all__ = ["ClaimTests", "HandleValidityTests"]

MICRO = timedelta(microseconds=1)


class ClaimTests(ContractFixtures):
    """docs/contract.md §3 "Claim": eligibility, order, effects, the pre-claim
    dead-lettering and the ``n <= 0`` shortcut."""

    @pytest.fixture
    def ordered(self, store: Store) -> tuple[Queue, list[int]]:
        """Queue ``"jobs"`` holding seven due jobs whose claim order is
        neither their id order nor their ``run_at`` order; returns the queue
        and the ids in the expected claim order (priority DESC, run_at ASC,
        id ASC)."""
        q = store.queue("jobs")
        late_hi = q.enqueue("late-hi", priority=5, run_at=T0 - timedelta(seconds=10))
        early_hi = q.enqueue("early-hi", priority=5, run_at=T0 - timedelta(seconds=20))
        tie_a = q.enqueue("tie-a", priority=5, run_at=T0 - timedelta(seconds=10))
        low = q.enqueue("low", priority=-(2**31), run_at=T0 - timedelta(days=400))
        top = q.enqueue("top", priority=2**31 - 1)
        zero_old = q.enqueue("zero", run_at=T0 - timedelta(seconds=5))
        zero_new = q.enqueue("zero-new")
        return q, [top, early_hi, late_hi, tie_a, zero_old, zero_new, low]

    def test_claim_one_order(self, ordered: tuple[Queue, list[int]]) -> None:
        q, expected = ordered
        got = []
        while (handle := q.claim_one("w")) is not None:
            got.append(handle.id)
        assert got == expected

    def test_claim_batch_order(self, ordered: tuple[Queue, list[int]]) -> None:
        q, expected = ordered
        assert [h.id for h in q.claim_batch("w", 3)] == expected[:3]
        assert [h.id for h in q.claim_batch("w", 100)] == expected[3:]
        assert q.claim_batch("w", 5) == []

    @staticmethod
    def claim_all(q: Queue, how: str, count: int) -> list[int]:
        """Claim ``count`` jobs, ``"one"`` by one or in two ``"batch"``es
        (the best ``count - 1``, then the rest); the ids in hand-out order."""
        if how == "one":
            got: list[int] = []
            for _ in range(count):
                handle = q.claim_one("w")
                assert handle is not None, f"claimed {got}, then nothing"
                got.append(handle.id)
        else:
            got = [h.id for h in q.claim_batch("w", count - 1)]
            got += [h.id for h in q.claim_batch("w", 100)]
        assert q.claim_one("w") is None
        return got

    @pytest.mark.parametrize("how", ["one", "batch"])
    @pytest.mark.parametrize("lower_id", ["came-due", "pending"])
    def test_case_019_a_job_that_came_due_ties_with_a_pending_job_by_id(
        self, queue: Queue, clock: ManualClock, lower_id: str, how: str
    ) -> None:
        """Two paths to "due" meet: a job enqueued with a delay that has
        come due, and a job of the same priority already pending with the
        same ``run_at``. Their order is the final ``id ASC`` (docs/contract.md §3
        "Claim"), whichever was enqueued first."""
        if lower_id == "came-due":
            came_due = queue.enqueue("came-due", delay=10)
            clock.set(at(10))
            pending = queue.enqueue("pending")
        else:
            pending = queue.enqueue("pending")
            first = claim_exactly(queue, pending)
            came_due = queue.enqueue("came-due", delay=10)
            clock.set(at(10))
            assert first.retry("back", delay=0)  # pending again, run_at = now
        assert job(queue, came_due).run_at == job(queue, pending).run_at == at(10)
        assert self.claim_all(queue, how, 2) == sorted([came_due, pending])

    @pytest.mark.parametrize("how", ["one", "batch"])
    @pytest.mark.parametrize("ids", ["pending-first", "reclaims-first"])
    def test_case_019_reclaims_tie_with_a_pending_job_by_id(
        self, store: Store, clock: ManualClock, ids: str, how: str
    ) -> None:
        """A reclaim is ordered by the row's own ``run_at`` (a claim does not
        change it), so a lapsed claim ties with a pending job of the same
        priority and ``run_at``, and ``id ASC`` decides (docs/contract.md §3 "Claim").
        Three paths meet: a pending job, a claim that lapsed before this
        claim, and a claim that lapsed before an earlier claim, which
        handed out another job and left it waiting."""
        q = store.queue("jobs")
        short = store.queue("jobs", QueueOpts(visibility_timeout_s=10))
        names = ["pending", "lapsed-now", "lapsed-earlier"]
        if ids == "reclaims-first":
            names.reverse()
        made = {name: (short if name == "lapsed-earlier" else q).enqueue(name) for name in names}
        handles = {h.payload: h for h in q.claim_batch("w", 3)}
        assert handles["pending"].retry("back", delay=0)  # pending again, run_at = T0
        clock.set(at(10))
        blocker = q.enqueue("blocker", priority=1)
        claim_exactly(q, blocker).ack()  # lapsed-earlier's claim lapsed at T0+10
        clock.set(at(30))
        assert {(job(q, i).run_at, job(q, i).priority) for i in made.values()} == {(T0, 0)}
        assert self.claim_all(q, how, 3) == sorted(made.values())

    def test_claim_batch_leaves_unclaimed_rows_untouched(
        self, ordered: tuple[Queue, list[int]]
    ) -> None:
        q, expected = ordered
        before = {i: job(q, i) for i in expected}
        handles = q.claim_batch("w", 2)
        assert [h.id for h in handles] == expected[:2]
        for i in expected[2:]:
            assert job(q, i) == before[i]
        assert q.stats() == (5, 0, 2, 0)

    def test_empty_queue_claims_nothing(self, queue: Queue) -> None:
        assert queue.claim_one("w") is None
        assert queue.claim_batch("w", 5) == []

    def test_claim_sets_attempts_worker_and_deadline_from_the_row(
        self, store: Store, clock: ManualClock
    ) -> None:
        job_id = store.queue("jobs", QueueOpts(visibility_timeout_s=7)).enqueue({"k": "v"})
        claimer = store.queue("jobs", QueueOpts(visibility_timeout_s=99))
        clock.set(at(3))
        handle = claim_exactly(claimer, job_id, "worker-1")
        expected = {
            "state": "processing",
            "attempts": 1,
            "worker_id": "worker-1",
            "claim_deadline": at(10),
            "payload": {"k": "v"},
            "run_at": T0,
            "enqueued_at": T0,
            "last_error": None,
            "died_at": None,
        }
        for name, value in expected.items():
            assert getattr(handle, name) == value, name
            assert getattr(handle.job, name) == value, name
        assert job(claimer, job_id) == handle.job

    def test_future_job_is_due_exactly_at_run_at(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x", delay=60)
        clock.set(at(60) - MICRO)
        assert queue.claim_one("w") is None
        assert queue.claim_batch("w", 3) == []
        clock.set(at(60))
        claim_exactly(queue, job_id)

    def test_expired_pending_job_is_not_claimed(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x", expires=10)
        clock.set(at(10))
        assert queue.claim_one("w") is None
        pending = job(queue, job_id)
        assert (pending.state, pending.attempts) == ("pending", 0)
        clock.set(at(10) - MICRO)
        claim_exactly(queue, job_id)

    def test_claim_is_not_lapsed_before_the_deadline(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x")
        claim_exactly(queue, job_id, "w1")
        clock.set(at(30) - MICRO)
        assert queue.claim_one("w2") is None
        clock.set(at(30))
        handle = claim_exactly(queue, job_id, "w2")
        assert (handle.attempts, handle.worker_id, handle.claim_deadline) == (2, "w2", at(60))

    def test_reclaim_consumes_an_attempt(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x", max_attempts=3)
        seen = []
        for round_ in range(3):
            clock.set(at(30 * round_))
            handle = claim_exactly(queue, job_id, f"w{round_}")
            seen.append((handle.attempts, handle.worker_id, handle.claim_deadline))
        assert seen == [(1, "w0", at(30)), (2, "w1", at(60)), (3, "w2", at(90))]

    def test_lapsed_expired_claim_is_not_reclaimed(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x", expires=40)
        claim_exactly(queue, job_id)
        clock.set(at(40))
        assert queue.claim_one("w2") is None
        still = job(queue, job_id)
        assert (still.state, still.attempts, still.worker_id) == ("processing", 1, "w")

    def test_exhausted_lapsed_claim_is_dead_lettered_before_claiming(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        doomed = queue.enqueue("doomed", max_attempts=1, priority=9)
        claim_exactly(queue, doomed, "w1")
        other = queue.enqueue("other")
        clock.set(at(30) - MICRO)
        claim_exactly(queue, other, "w2").ack()
        assert job(queue, doomed).state == "processing"
        clock.set(at(30))
        assert queue.stats() == (0, 0, 1, 0)
        assert queue.claim_one("w3") is None
        dead = job(queue, doomed)
        assert (dead.state, dead.last_error, dead.died_at) == (
            "dead",
            "max attempts exceeded",
            at(30),
        )
        assert (dead.attempts, dead.worker_id, dead.claim_deadline) == (1, "w1", at(30))
        assert (dead.payload, dead.priority, dead.max_attempts) == ("doomed", 9, 1)
        assert queue.stats() == (0, 0, 0, 1)

    def test_claim_batch_dead_letters_too_and_still_claims(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        doomed = [queue.enqueue(i, max_attempts=1) for i in range(2)]
        queue.claim_batch("w1", 2)
        clock.set(at(31))
        fresh = queue.enqueue("fresh")
        assert [h.id for h in queue.claim_batch("w2", 5)] == [fresh]
        for i in doomed:
            dead = job(queue, i)
            assert (dead.state, dead.last_error, dead.died_at) == (
                "dead",
                "max attempts exceeded",
                at(31),
            )

    def test_exhausted_lapsed_claim_is_dead_lettered_even_when_expired(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x", max_attempts=1, expires=20)
        claim_exactly(queue, job_id)
        clock.set(at(45))
        assert queue.claim_one("w") is None
        dead = job(queue, job_id)
        assert (dead.state, dead.last_error, dead.died_at) == (
            "dead",
            "max attempts exceeded",
            at(45),
        )

    def test_pre_claim_dead_lettering_is_per_queue(self, store: Store, clock: ManualClock) -> None:
        a, b = store.queue("a"), store.queue("b")
        job_id = a.enqueue("x", max_attempts=1)
        claim_exactly(a, job_id)
        clock.set(at(31))
        assert b.claim_one("w") is None
        assert b.claim_batch("w", 3) == []
        assert job(a, job_id).state == "processing"
        assert a.claim_one("w") is None
        assert job(a, job_id).state == "dead"

    @pytest.mark.parametrize("n", [0, -1, -(2**70)])
    def test_claim_batch_n_not_positive_touches_nothing(
        self, queue: Queue, clock: ManualClock, n: int
    ) -> None:
        """``[]`` without I/O: the pre-claim dead-lettering does not run."""
        doomed = queue.enqueue("doomed", max_attempts=1)
        claim_exactly(queue, doomed)
        due = queue.enqueue("due")
        clock.set(at(31))
        assert queue.claim_batch("w", n) == []
        assert job(queue, doomed).state == "processing"
        assert job(queue, due).state == "pending"
        assert queue.stats() == (1, 0, 1, 0)
        claim_exactly(queue, due)
        assert job(queue, doomed).state == "dead"

    @pytest.mark.parametrize("n", [2**31, 2**63 - 1, 2**63, 2**100])
    def test_claim_batch_with_a_huge_n_claims_every_eligible_job(
        self, queue: Queue, n: int
    ) -> None:
        """``n`` is any int: ``min(n, eligible)`` rows, never an overflow."""
        ids = queue.enqueue_many(["a", "b"])
        assert [h.id for h in queue.claim_batch("w", n)] == ids

    def test_dead_rows_are_never_claimed(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x")
        assert claim_exactly(queue, job_id).fail("boom")
        clock.set(at(10_000))
        assert queue.claim_one("w") is None
        assert queue.claim_batch("w", 5) == []


class HandleValidityTests(ContractFixtures):
    """docs/contract.md §3 "Claim identity and handle validity"."""

    @staticmethod
    def refused(handle: JobHandle) -> None:
        """Every operation of ``handle`` returns ``False``."""
        assert handle.heartbeat() is False
        assert handle.heartbeat(5) is False
        assert handle.retry("late", delay=0) is False
        assert handle.retry("late") is False
        assert handle.fail("late") is False
        assert handle.fail() is False
        assert handle.ack() is False
        assert handle.release() is False

    def test_every_op_returns_true_when_it_takes_effect(self, queue: Queue) -> None:
        ids = queue.enqueue_many(["a", "b", "c"])
        a, b, c = queue.claim_batch("w", 3)
        assert [h.id for h in (a, b, c)] == ids
        assert a.heartbeat() is True
        assert a.heartbeat(10) is True
        assert a.ack() is True
        assert b.retry("e", delay=5) is True
        assert c.fail("boom") is True
        assert queue.get_job(a.id) is None
        assert job(queue, b.id).state == "pending"
        assert job(queue, c.id).state == "dead"

    def test_stale_handle_cannot_touch_the_newer_claim(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x")
        old = claim_exactly(queue, job_id, "w1")
        clock.set(at(30))
        new = claim_exactly(queue, job_id, "w2")
        clock.set(at(31))
        current = job(queue, job_id)
        assert (current.attempts, current.worker_id, current.claim_deadline) == (2, "w2", at(60))
        self.refused(old)
        assert job(queue, job_id) == current
        assert queue.stats() == (0, 0, 1, 0)
        assert new.ack() is True
        assert queue.get_job(job_id) is None

    def test_lapsed_handle_is_refused_from_the_deadline_on(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        clock.set(at(30))
        before = job(queue, job_id)
        self.refused(handle)
        assert job(queue, job_id) == before
        assert before.state == "processing"

    def test_handle_is_valid_just_before_the_deadline(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        ids = queue.enqueue_many(["a", "b", "c", "d"])
        handles = queue.claim_batch("w", 4)
        clock.set(at(30) - MICRO)
        assert handles[0].ack() is True
        assert handles[1].retry("e", delay=0) is True
        assert handles[2].fail() is True
        assert handles[3].heartbeat() is True
        assert job(queue, ids[3]).claim_deadline == at(60) - MICRO

    @pytest.mark.parametrize("op", ["ack", "retry", "fail"])
    def test_a_spent_handle_returns_false(self, queue: Queue, op: str) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        ops: dict[str, Callable[[], bool]] = {
            "ack": handle.ack,
            "retry": lambda: handle.retry("e", delay=0),
            "fail": handle.fail,
        }
        assert ops[op]() is True
        before = queue.get_job(job_id)
        self.refused(handle)
        assert queue.get_job(job_id) == before

    def test_a_retried_handle_cannot_touch_the_next_claim(self, queue: Queue) -> None:
        job_id = queue.enqueue("x")
        first = claim_exactly(queue, job_id, "w1")
        assert first.retry("e", delay=0)
        second = claim_exactly(queue, job_id, "w2")
        current = job(queue, job_id)
        self.refused(first)
        assert job(queue, job_id) == current
        assert second.ack() is True

    def test_handle_of_a_cancelled_job_is_refused(self, queue: Queue) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id)
        assert queue.cancel(job_id)
        self.refused(handle)
        assert queue.get_job(job_id) is None
        assert queue.stats() == (0, 0, 0, 0)

    def test_handle_of_a_swept_job_is_refused(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x", expires=10)
        handle = claim_exactly(queue, job_id)
        clock.set(at(10))
        assert queue.sweep_expired() == (1, 0)
        before = job(queue, job_id)
        self.refused(handle)
        assert job(queue, job_id) == before

    def test_heartbeat_does_not_spend_the_handle(self, queue: Queue) -> None:
        handle = claim_exactly(queue, queue.enqueue("x"))
        assert handle.heartbeat()
        assert handle.heartbeat()
        assert handle.ack()

    def test_handle_exposes_every_job_field(self, queue: Queue) -> None:
        handle = claim_exactly(queue, queue.enqueue({"p": 1}, priority=4))
        for name in [
            "id",
            "queue",
            "state",
            "payload",
            "payload_bytes",
            "content_type",
            "priority",
            "run_at",
            "expires_at",
            "enqueued_at",
            "attempts",
            "max_attempts",
            "visibility_timeout_s",
            "backoff_base_s",
            "backoff_cap_s",
            "worker_id",
            "claim_deadline",
            "last_error",
            "died_at",
        ]:
            assert getattr(handle, name) == getattr(handle.job, name), name
        assert (handle.queue, handle.priority, handle.payload_bytes) == ("jobs", 4, b'{"p":1}')
