"""Queue operations other than enqueue and claim: ``ack_batch``, ``ack_many``, ``cancel``,
``get_job``, ``sweep_expired``, ``stats`` and ``lapsed_claims``, and queue
isolation (docs/contract.md §3)."""

from __future__ import annotations

from datetime import timedelta
from typing import NamedTuple

import pytest

from alkstore import (
    Queue,
    QueueOpts,
    QueueStats,
    Store,
    StoreClosedError,
    SweepResult,
    ValidationError,
)
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, at, claim_exactly, job

__all__ = [
    "AckBatchTests",
    "AckManyTests",
    "CancelTests",
    "GetJobTests",
    "IsolationTests",
    "StatsTests",
    "SweepTests",
]

MICRO = timedelta(microseconds=1)


class AckScene(NamedTuple):
    queue: Queue
    valid: list[int]
    lapsed: int
    pending: int
    dead: int
    foreign: int


class AckBatchTests(ContractFixtures):
    """docs/contract.md §3 "ack_batch(ids)"."""

    @pytest.fixture
    def ack_scene(self, store: Store, clock: ManualClock) -> AckScene:
        """At ``T0+10`` in queue ``"jobs"``: three valid claims by three
        different workers (deadline ``T0+30``), one lapsed claim (5 s
        visibility timeout), one pending job, one dead job; and a valid claim
        in queue ``"other"``."""
        q = store.queue("jobs")
        short = store.queue("jobs", QueueOpts(visibility_timeout_s=5))
        lapsed = short.enqueue("lapsed", priority=9)
        valid = q.enqueue_many(["a", "b", "c"], priority=5)
        dead = q.enqueue("dead", priority=1)
        claim_exactly(q, lapsed, "w0")
        for i, job_id in enumerate(valid):
            claim_exactly(q, job_id, f"w{i + 1}")
        assert claim_exactly(q, dead).fail()
        pending = q.enqueue("pending")
        other = store.queue("other")
        foreign = other.enqueue("foreign")
        claim_exactly(other, foreign)
        clock.set(at(10))
        assert q.stats() == (1, 0, 4, 1)
        return AckScene(q, valid, lapsed, pending, dead, foreign)

    def test_empty_batch_is_zero(self, queue: Queue) -> None:
        assert queue.ack_batch([]) == 0
        assert queue.ack_batch(()) == 0

    def test_acks_valid_claims_of_any_worker_each_id_once(self, ack_scene: AckScene) -> None:
        q = ack_scene.queue
        a, b, c = ack_scene.valid
        assert q.ack_batch([a, b, a, a, b]) == 2
        assert q.get_job(a) is None
        assert q.get_job(b) is None
        assert job(q, c).state == "processing"
        assert q.ack_batch([a, b]) == 0
        assert q.ack_batch({c}) == 1

    def test_unknown_lapsed_pending_dead_and_foreign_ids_are_not_counted(
        self, store: Store, ack_scene: AckScene
    ) -> None:
        q = ack_scene.queue
        before = {i: job(q, i) for i in (ack_scene.lapsed, ack_scene.pending, ack_scene.dead)}
        others = [ack_scene.lapsed, ack_scene.pending, ack_scene.dead, ack_scene.foreign, 10**12]
        assert q.ack_batch([*others, ack_scene.valid[1]]) == 1
        for i, was in before.items():
            assert job(q, i) == was
        assert job(store.queue("other"), ack_scene.foreign).state == "processing"
        assert q.stats() == (1, 0, 3, 1)

    def test_lapse_boundary(self, queue: Queue, clock: ManualClock) -> None:
        first, second = queue.enqueue_many(["a", "b"])
        queue.claim_batch("w", 2)
        clock.set(at(30) - MICRO)
        assert queue.ack_batch([first]) == 1
        clock.set(at(30))
        assert queue.ack_batch([second]) == 0
        assert job(queue, second).state == "processing"


class AckManyTests(ContractFixtures):
    """docs/contract.md §3 "ack_many(handles)": each claim acked exactly as
    its own handle's ``ack`` would, by claim identity."""

    def test_empty_is_empty(self, queue: Queue) -> None:
        assert queue.ack_many([]) == []
        assert queue.ack_many(()) == []

    def test_acks_each_valid_claim_once_in_order(self, store: Store, clock: ManualClock) -> None:
        q = store.queue("jobs")
        a, b, c = q.enqueue_many(["a", "b", "c"])
        ha, hb, hc = (claim_exactly(q, job_id, f"w{job_id}") for job_id in (a, b, c))
        clock.advance(1)
        assert q.ack_many([hb, ha]) == [True, True]
        assert q.get_job(a) is None
        assert q.get_job(b) is None
        assert job(q, c).state == "processing"
        # Listed twice: acked once. Spent handles: False, as their ack().
        assert q.ack_many([hc, hc, ha]) == [True, False, False]
        assert q.get_job(c) is None
        assert hc.ack() is False
        assert q.stats() == (0, 0, 0, 0)

    def test_a_stale_handle_acks_nothing_and_leaves_the_newer_claim(
        self, store: Store, clock: ManualClock
    ) -> None:
        q = store.queue("jobs", QueueOpts(visibility_timeout_s=5))
        job_id = q.enqueue("x")
        old = claim_exactly(q, job_id, "w1")
        clock.advance(6)  # the first claim lapses; the job is claimed again
        new = claim_exactly(q, job_id, "w2")
        assert (old.attempts, new.attempts) == (1, 2)
        assert q.ack_many([old]) == [False]
        assert (job(q, job_id).state, job(q, job_id).attempts) == ("processing", 2)
        assert q.ack_many([old, new]) == [False, True]
        assert q.get_job(job_id) is None

    def test_a_lapsed_claim_is_not_acked(self, store: Store, clock: ManualClock) -> None:
        q = store.queue("jobs", QueueOpts(visibility_timeout_s=5))
        lapsing, holding = q.enqueue_many(["lapsing", "holding"])
        h1 = claim_exactly(q, lapsing)
        clock.advance(3)
        h2 = claim_exactly(q, holding)
        clock.advance(2)  # h1's deadline (T0+5) is now; h2's is T0+8
        assert q.ack_many([h1, h2]) == [False, True]
        assert job(q, lapsing).attempts == 1
        assert q.get_job(holding) is None

    def test_a_cancelled_or_dead_job_is_not_acked(self, store: Store) -> None:
        q = store.queue("jobs")
        gone, dead, kept = q.enqueue_many(["gone", "dead", "kept"])
        h_gone = claim_exactly(q, gone)
        h_dead = claim_exactly(q, dead)
        h_kept = claim_exactly(q, kept)
        assert q.cancel(gone)
        assert h_dead.fail("no")
        assert q.ack_many([h_gone, h_dead, h_kept]) == [False, False, True]
        assert q.stats() == (0, 0, 0, 1)

    @pytest.mark.parametrize("bad", [None, 7, "abc", b"abc", {"a": 1}])
    def test_not_an_iterable_of_handles_is_refused(self, queue: Queue, bad: object) -> None:
        with pytest.raises(ValidationError, match="handles must be"):
            queue.ack_many(bad)  # type: ignore[arg-type]

    def test_a_foreign_handle_is_refused_and_nothing_is_acked(self, store: Store) -> None:
        q = store.queue("jobs")
        other = store.queue("other")
        mine = claim_exactly(q, q.enqueue("mine"))
        theirs = claim_exactly(other, other.enqueue("theirs"))
        for bad in ([mine, theirs], [mine, mine.id]):
            with pytest.raises(ValidationError):
                q.ack_many(bad)  # type: ignore[arg-type]
        assert job(q, mine.id).state == "processing"
        assert job(other, theirs.id).state == "processing"
        assert q.ack_many([mine]) == [True]


class CancelTests(ContractFixtures):
    """docs/contract.md §3 "cancel(id)"."""

    def test_cancel_pending(self, queue: Queue) -> None:
        job_id = queue.enqueue("x", delay=100)
        assert queue.cancel(job_id) is True
        assert queue.get_job(job_id) is None
        assert queue.cancel(job_id) is False
        assert queue.stats() == (0, 0, 0, 0)

    def test_cancel_processing_even_when_lapsed(self, queue: Queue, clock: ManualClock) -> None:
        first, second = queue.enqueue_many(["a", "b"])
        handle_a, handle_b = queue.claim_batch("w", 2)
        assert queue.cancel(first) is True
        clock.set(at(100))
        assert queue.cancel(second) is True
        assert handle_a.ack() is False
        assert handle_b.fail() is False
        assert queue.stats() == (0, 0, 0, 0)

    def test_cancel_expired_pending(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x", expires=5)
        clock.set(at(50))
        assert queue.cancel(job_id) is True

    def test_cancel_dead_or_unknown_is_false(self, queue: Queue) -> None:
        job_id = queue.enqueue("x")
        assert claim_exactly(queue, job_id).fail()
        assert queue.cancel(job_id) is False
        assert job(queue, job_id).state == "dead"
        assert queue.cancel(10**12) is False
        assert queue.cancel(-1) is False


class GetJobTests(ContractFixtures):
    """``Queue.get_job``."""

    def test_unknown_id_is_none(self, queue: Queue) -> None:
        assert queue.get_job(10**12) is None
        assert queue.get_job(0) is None
        assert queue.get_job(-5) is None

    def test_ids_beyond_any_column_are_unknown(self, queue: Queue) -> None:
        """Any int is a valid id argument; ids no store can hold are unknown."""
        queue.enqueue("x")
        for job_id in (2**63, -(2**63) - 1, 2**100):
            assert queue.get_job(job_id) is None
            assert queue.cancel(job_id) is False
        assert queue.ack_batch([2**63, 2**100, -(2**100)]) == 0
        assert queue.stats() == (1, 0, 0, 0)

    def test_acked_job_is_gone(self, queue: Queue) -> None:
        job_id = queue.enqueue("x")
        assert claim_exactly(queue, job_id).ack()
        assert queue.get_job(job_id) is None


class SweepTests(ContractFixtures):
    """docs/contract.md §3 "sweep_expired()"."""

    def test_sweep_moves_expired_pending_and_processing_rows(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        pending = queue.enqueue("p", expires=10, priority=-1)
        working = queue.enqueue("w", expires=10)
        lasting = queue.enqueue("l", expires=11, priority=-2)
        forever = queue.enqueue("f", priority=-3)
        handle = claim_exactly(queue, working, "w1")
        clock.set(at(10) - MICRO)
        assert queue.sweep_expired() == (0, 0)
        clock.set(at(10))
        result = queue.sweep_expired()
        assert isinstance(result, SweepResult)
        assert (result.expired, result.purged) == (1 + 1, 0)
        dead_p, dead_w = job(queue, pending), job(queue, working)
        assert (dead_p.state, dead_p.last_error, dead_p.died_at) == ("dead", "expired", at(10))
        assert (dead_p.attempts, dead_p.worker_id, dead_p.claim_deadline) == (0, None, None)
        assert (dead_w.state, dead_w.last_error, dead_w.died_at) == ("dead", "expired", at(10))
        assert (dead_w.attempts, dead_w.worker_id, dead_w.claim_deadline) == (1, "w1", at(30))
        assert job(queue, lasting).state == "pending"
        assert job(queue, forever).state == "pending"
        assert handle.ack() is False
        assert queue.sweep_expired() == (0, 0)
        assert queue.stats() == (2, 0, 0, 2)

    def test_sweep_sees_only_its_queue(self, store: Store, clock: ManualClock) -> None:
        a, b = store.queue("a"), store.queue("b", QueueOpts(dead_letter_retention_s=0))
        assert claim_exactly(a, a.enqueue("y")).fail()
        expiring = a.enqueue("x", expires=1)
        clock.set(at(5))
        assert b.sweep_expired() == (0, 0)
        assert job(a, expiring).state == "pending"
        assert a.stats() == (1, 0, 0, 1)

    def test_retention_none_keeps_dead_rows_forever(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x")
        assert claim_exactly(queue, job_id).fail()
        clock.set(at(3_000_000_000))
        assert queue.sweep_expired() == (0, 0)
        assert job(queue, job_id).state == "dead"

    def test_retention_zero_purges_at_once_including_just_expired_rows(
        self, store: Store, clock: ManualClock
    ) -> None:
        q = store.queue("jobs", QueueOpts(dead_letter_retention_s=0))
        failed = q.enqueue("failed")
        assert claim_exactly(q, failed).fail()
        expiring = q.enqueue("expiring", expires=5)
        clock.set(at(5))
        assert q.sweep_expired() == (1, 2)
        assert q.get_job(failed) is None
        assert q.get_job(expiring) is None
        assert q.stats() == (0, 0, 0, 0)

    def test_positive_retention_boundary(self, store: Store, clock: ManualClock) -> None:
        """Purged iff ``died_at + retention <= now``."""
        q = store.queue("jobs", QueueOpts(dead_letter_retention_s=100, max_attempts=1))
        early, late = q.enqueue_many(["early", "late"])
        assert claim_exactly(q, early).fail()
        clock.set(at(50))
        claim_exactly(q, late)
        clock.set(at(80))
        assert q.claim_one("w") is None  # late's claim lapsed at T0+80: dead now
        assert job(q, late).died_at == at(80)
        clock.set(at(100) - MICRO)
        assert q.sweep_expired() == (0, 0)
        clock.set(at(100))
        assert q.sweep_expired() == (0, 1)
        assert q.get_job(early) is None
        clock.set(at(180) - MICRO)
        assert q.sweep_expired() == (0, 0)
        assert job(q, late).state == "dead"
        clock.set(at(180))
        assert q.sweep_expired() == (0, 1)
        assert q.stats() == (0, 0, 0, 0)

    def test_retention_is_read_from_the_calling_handle(
        self, store: Store, clock: ManualClock
    ) -> None:
        keeper = store.queue("jobs", QueueOpts(dead_letter_retention_s=None))
        purger = store.queue("jobs", QueueOpts(dead_letter_retention_s=60))
        job_id = purger.enqueue("x")
        assert claim_exactly(purger, job_id).fail()
        clock.set(at(1000))
        assert keeper.sweep_expired() == (0, 0)
        assert job(keeper, job_id).state == "dead"
        assert store.queue("jobs", QueueOpts(dead_letter_retention_s=5000)).sweep_expired() == (
            0,
            0,
        )
        assert purger.sweep_expired() == (0, 1)
        assert keeper.get_job(job_id) is None


class StatsTests(ContractFixtures):
    """docs/contract.md §3 "stats()"."""

    def test_each_field(self, queue: Queue, clock: ManualClock) -> None:
        assert queue.stats() == QueueStats(0, 0, 0, 0)
        due = queue.enqueue("due")
        queue.enqueue("boundary", delay=10)
        queue.enqueue("future", delay=11)
        queue.enqueue("expired-unswept", expires=5)
        working = queue.enqueue("working", delay=1, priority=1)
        dead = queue.enqueue("dead", delay=2, priority=2)
        clock.set(at(2))
        assert claim_exactly(queue, dead).fail()
        claim_exactly(queue, working)
        clock.set(at(10))
        stats = queue.stats()
        assert isinstance(stats, QueueStats)
        # pending: due, boundary (run_at == now), expired-unswept
        assert stats == (3, 1, 1, 1)
        assert (stats.pending, stats.scheduled, stats.processing, stats.dead) == (3, 1, 1, 1)
        clock.set(at(40))  # working's claim lapsed: still processing
        assert queue.stats() == (4, 0, 1, 1)
        assert queue.cancel(due)
        assert queue.stats() == (3, 0, 1, 1)

    def test_lapsed_claims_counts_processing_jobs_past_their_deadline(
        self, store: Store, clock: ManualClock
    ) -> None:
        """``lapsed_claims()``: processing rows with ``now >= claim_deadline``,
        part of ``stats().processing``, whatever state the claims, sweeps
        and clock moves since left them in."""
        short = store.queue("jobs", QueueOpts(visibility_timeout_s=10))
        long = store.queue("jobs", QueueOpts(visibility_timeout_s=100))
        first, second = short.enqueue("first"), short.enqueue("second")
        held = long.enqueue("held")
        spent = short.enqueue("spent", max_attempts=1)
        expiring = short.enqueue("expiring", expires=15)
        claimed = short.claim_batch("w", 5)
        assert [h.id for h in claimed] == [first, second, held, spent, expiring]
        short.enqueue("waiting")
        short.enqueue("later", delay=1000)
        assert claim_exactly(short, short.enqueue("dead", priority=1)).fail()
        assert short.stats() == (1, 1, 5, 1)
        assert short.lapsed_claims() == 0

        clock.set(at(10) - MICRO)
        assert short.lapsed_claims() == 0
        clock.set(at(10))  # the boundary: lapsed at claim_deadline itself
        assert short.lapsed_claims() == 4  # all but held
        assert short.stats().processing == 5  # lapsed claims included
        assert long.lapsed_claims() == 4  # a handle's opts do not matter

        # A claim dead-letters spent, reclaims first (due at T0, lowest id),
        # and moves second and expiring to the engine's lapsed state.
        assert claim_exactly(short, first, "w2").claim_deadline == at(20)
        assert short.lapsed_claims() == 2  # second, expiring
        assert short.stats() == (1, 1, 4, 2)

        clock.set(at(15))  # expiring expires: lapsed and expired alike
        assert claim_exactly(short, second, "w2").claim_deadline == at(25)
        assert short.lapsed_claims() == 1  # expiring
        clock.set(at(20))
        assert short.lapsed_claims() == 2  # first again, expiring
        clock.set(at(12))  # an injected clock moved back: by the instants
        assert short.lapsed_claims() == 1  # expiring (deadline 10)
        clock.set(at(20))
        assert short.sweep_expired() == (1, 0)
        assert short.lapsed_claims() == 1  # first
        assert short.stats() == (1, 1, 3, 3)
        assert store.queue("other").lapsed_claims() == 0

    def test_lapsed_claims_on_a_closed_store_raises(self, store: Store, queue: Queue) -> None:
        store.close()
        with pytest.raises(StoreClosedError):
            queue.lapsed_claims()

    # The engines keep private row states (docs/decisions.md D16, D25): a
    # claim sets lapsed and expired rows aside and moves rows that came due.
    # stats() counts by the public states and the instants, whatever a
    # row's private state, before and after a claim has moved it.

    def test_case_019_lapsed_claims_count_as_processing_before_and_after_a_reclaim(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        ids = queue.enqueue_many(["a", "b", "c"])
        queue.claim_batch("w1", 3)
        assert queue.stats() == (0, 0, 3, 0)
        clock.set(at(30))  # all three lapsed
        assert queue.stats() == (0, 0, 3, 0)
        claim_exactly(queue, ids[0], "w2")  # a reclaim; b and c wait, lapsed
        assert queue.stats() == (0, 0, 3, 0)
        higher = queue.enqueue("higher", priority=1)
        claim_exactly(queue, higher, "w3")  # the lapsed two are passed over
        assert queue.stats() == (0, 0, 4, 0)
        assert [h.id for h in queue.claim_batch("w4", 5)] == ids[1:]
        assert queue.stats() == (0, 0, 4, 0)

    def test_a_spent_lapsed_claim_counts_as_processing_until_a_claim_dead_letters_it(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        spent = queue.enqueue("spent", max_attempts=1)
        kept = queue.enqueue("kept")
        queue.claim_batch("w1", 2)
        clock.set(at(30))
        assert queue.stats() == (0, 0, 2, 0)
        higher = queue.enqueue("higher", priority=1)
        claim_exactly(queue, higher, "w2")  # spent dead-lettered, kept passed over
        assert queue.stats() == (0, 0, 2, 1)
        assert job(queue, spent).state == "dead"
        assert job(queue, kept).state == "processing"

    def test_expired_unswept_rows_keep_their_public_state(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        """Rows past ``expires_at`` keep counting as pending (due) or
        processing (claimed, lapsed or not) until ``sweep_expired`` moves
        them, whichever way they expired and whether or not a claim has
        set them aside."""
        short = queue.store.queue(queue.name, QueueOpts(visibility_timeout_s=10))
        waiting = [
            queue.enqueue("due", expires=10),
            queue.enqueue("came-due", delay=5, expires=10),
            queue.enqueue("due-at-9", delay=9, expires=10),
        ]
        claimed = [
            queue.enqueue("working", expires=10, priority=1),
            short.enqueue("lapsing", expires=10, priority=1),
            short.enqueue("lapsed-then-expired", expires=20, priority=1),
        ]
        assert [h.id for h in queue.claim_batch("w", 3)] == claimed
        assert queue.stats() == (1, 2, 3, 0)

        def hand_out_a_higher_job() -> None:
            # A claim that moves the rows whose status changed, and hands
            # out another job.
            claim_exactly(queue, queue.enqueue("higher", priority=9)).ack()

        clock.set(at(5))
        hand_out_a_higher_job()  # came-due is due
        assert queue.stats() == (2, 1, 3, 0)
        clock.set(at(10))
        assert queue.stats() == (3, 0, 3, 0)
        hand_out_a_higher_job()  # five rows expired, lapsed-then-expired lapsed
        assert queue.stats() == (3, 0, 3, 0)
        for instant in (at(20), at(30)):  # lapsed-then-expired expires; working lapses
            clock.set(instant)
            assert queue.claim_one("w") is None
            assert queue.stats() == (3, 0, 3, 0)
        states = [job(queue, i).state for i in waiting + claimed]
        assert states == ["pending"] * 3 + ["processing"] * 3
        assert queue.sweep_expired() == (6, 0)
        assert queue.stats() == (0, 0, 0, 6)

    def test_due_exactly_at_run_at_on_every_path(self, queue: Queue, clock: ManualClock) -> None:
        """``run_at == now`` is pending, ``run_at > now`` scheduled, for a
        delayed enqueue, a retry with a delay and a requeue with a delay,
        before and after a claim moved the row; and by the instants alone
        when an injected clock moves back."""
        delayed = queue.enqueue("delayed", delay=10)
        retried, requeued = queue.enqueue_many(["retried", "requeued"])
        first, second = queue.claim_batch("w", 2)
        assert first.retry("e", delay=10)
        assert second.fail()
        assert queue.requeue(requeued, delay=10)
        assert {job(queue, i).run_at for i in (delayed, retried, requeued)} == {at(10)}
        clock.set(at(10) - MICRO)
        assert queue.stats() == (0, 3, 0, 0)
        assert queue.claim_one("w") is None
        clock.set(at(10))
        assert queue.stats() == (3, 0, 0, 0)
        higher = queue.enqueue("higher", priority=1)
        claim_exactly(queue, higher)  # moves the three that came due
        assert queue.stats() == (3, 0, 1, 0)
        clock.set(at(10) - MICRO)
        assert queue.stats() == (0, 3, 1, 0)
        assert queue.claim_one("w") is None
        clock.set(at(10))
        assert queue.stats() == (3, 0, 1, 0)


class IsolationTests(ContractFixtures):
    """docs/contract.md §2: every queue operation sees only its own queue's rows."""

    def test_another_queue_behaves_as_unknown(self, store: Store, clock: ManualClock) -> None:
        a, b = store.queue("a"), store.queue("b")
        live = a.enqueue("live")
        working = a.enqueue("working")
        dead = a.enqueue("dead")
        handle = a.claim_batch("w", 3)
        assert [h.id for h in handle] == [live, working, dead]
        assert handle[0].retry("back", delay=0)
        assert handle[2].fail()
        for job_id in (live, working, dead):
            assert b.get_job(job_id) is None
            assert b.cancel(job_id) is False
        assert b.ack_batch([live, working, dead]) == 0
        assert b.claim_one("w") is None
        assert b.stats() == (0, 0, 0, 0)
        assert a.stats() == (1, 0, 1, 1)
        assert handle[1].ack()

    def test_names_sharing_a_long_prefix_are_distinct(self, store: Store) -> None:
        """Regression case 006: two names equal in their first 63 characters."""
        one, two = store.queue("q" * 63 + "a"), store.queue("q" * 63 + "b")
        first = one.enqueue({"q": 1})
        assert two.claim_one("w") is None
        assert two.get_job(first) is None
        second = two.enqueue({"q": 2})
        assert claim_exactly(one, first).payload == {"q": 1}
        assert claim_exactly(two, second).payload == {"q": 2}

    def test_case_matters_in_queue_names(self, store: Store) -> None:
        upper, lower = store.queue("Jobs"), store.queue("jobs")
        job_id = upper.enqueue("x")
        assert lower.claim_one("w") is None
        assert lower.get_job(job_id) is None
        claim_exactly(upper, job_id)
