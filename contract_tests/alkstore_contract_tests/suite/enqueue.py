"""Enqueue: option resolution, ids and returned datetimes (docs/contract.md §2, §3
"Option resolution")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from alkstore import Job, Queue, QueueOpts, Store, ValidationError
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import (
    ContractFixtures,
    RecordingRng,
    StoreFactory,
    TickingClock,
    assert_utc,
    at,
    claim_exactly,
    job,
    s,
)

__all__ = ["IdTests", "OptionResolutionTests", "TimeTests"]


class OptionResolutionTests(ContractFixtures):
    """docs/contract.md §3 "Option resolution": what an enqueue stamps on its row."""

    def test_defaults_resolve_to_queue_opts_and_now(self, queue: Queue, clock: ManualClock) -> None:
        clock.set(at(5))
        job_id = queue.enqueue({"a": 1})
        assert job(queue, job_id) == Job(
            id=job_id,
            queue="jobs",
            state="pending",
            payload_bytes=b'{"a":1}',
            content_type="application/json",
            priority=0,
            run_at=at(5),
            expires_at=None,
            enqueued_at=at(5),
            attempts=0,
            max_attempts=5,
            visibility_timeout_s=30,
            backoff_base_s=4,
            backoff_cap_s=3600,
            worker_id=None,
            claim_deadline=None,
            last_error=None,
            died_at=None,
            unique_key=None,
            finished_at=None,
            result_bytes=None,
        )
        assert job(queue, job_id).payload == {"a": 1}

    def test_queue_opts_are_stamped(self, store: Store) -> None:
        opts = QueueOpts(
            visibility_timeout_s=12.5,
            max_attempts=7,
            priority=3,
            backoff_base_s=2,
            backoff_cap_s=100,
            expires_s=600,
        )
        q = store.queue("stamped", opts)
        got = job(q, q.enqueue("x"))
        assert (got.visibility_timeout_s, got.max_attempts, got.priority) == (12.5, 7, 3)
        assert (got.backoff_base_s, got.backoff_cap_s) == (2, 100)
        assert (got.run_at, got.expires_at) == (T0, at(600))

    def test_per_job_overrides_win_over_queue_opts(self, store: Store) -> None:
        opts = QueueOpts(max_attempts=7, priority=3, expires_s=600, visibility_timeout_s=12)
        q = store.queue("overrides", opts)
        got = job(q, q.enqueue("x", priority=-4, max_attempts=2, expires=50))
        assert (got.priority, got.max_attempts, got.expires_at) == (-4, 2, at(50))
        # the stamps that have no per-job override still come from the handle
        assert got.visibility_timeout_s == 12

    @pytest.mark.parametrize(
        ("delay", "due"),
        [
            (10, at(10)),
            (0, T0),
            (0.25, at(0.25)),
            (timedelta(minutes=2), at(120)),
            (timedelta(0), T0),
        ],
        ids=["int", "zero", "float", "timedelta", "zero-timedelta"],
    )
    def test_delay_sets_run_at_from_now(
        self, queue: Queue, delay: float | timedelta, due: datetime
    ) -> None:
        got = job(queue, queue.enqueue("x", delay=delay))
        assert got.run_at == due
        assert got.enqueued_at == T0

    def test_run_at_in_another_zone_is_normalised_to_utc(self, queue: Queue) -> None:
        india = timezone(timedelta(hours=5, minutes=30))
        got = job(queue, queue.enqueue("x", run_at=datetime(2030, 1, 1, 6, 30, tzinfo=india)))
        assert got.run_at == at(3600)
        assert got.run_at.utcoffset() == timedelta(0)
        assert (got.run_at.hour, got.run_at.minute) == (1, 0)

    def test_run_at_in_the_past_is_due_now(self, queue: Queue) -> None:
        job_id = queue.enqueue("x", run_at=T0 - timedelta(days=1))
        assert job(queue, job_id).run_at == T0 - timedelta(days=1)
        claim_exactly(queue, job_id)

    def test_delay_wins_over_run_at(self, queue: Queue) -> None:
        got = job(queue, queue.enqueue("x", delay=5, run_at=at(1000)))
        assert got.run_at == at(5)
        got = job(queue, queue.enqueue("x", delay=0, run_at=at(1000)))
        assert got.run_at == T0

    def test_expires_is_relative_to_the_enqueue_instant_not_run_at(
        self, store: Store, clock: ManualClock
    ) -> None:
        clock.set(at(100))
        q = store.queue("exp", QueueOpts(expires_s=60))
        assert job(q, q.enqueue("x", delay=10, expires=20)).expires_at == at(120)
        assert job(q, q.enqueue("x", delay=10)).expires_at == at(160)
        assert job(q, q.enqueue("x", run_at=at(150))).expires_at == at(160)
        assert job(q, q.enqueue("x", expires=timedelta(hours=1))).expires_at == at(3700)

    @pytest.mark.parametrize(
        ("opts", "options"),
        [
            (QueueOpts(), {"delay": 10, "expires": 10}),
            (QueueOpts(), {"delay": 10, "expires": 9}),
            (QueueOpts(), {"run_at": T0 + timedelta(seconds=30), "expires": 30}),
            (QueueOpts(expires_s=60), {"delay": 60}),
            (QueueOpts(expires_s=60), {"run_at": T0 + timedelta(seconds=61)}),
        ],
        ids=["delay-equal", "delay-after", "run-at-equal", "queue-expiry-equal", "queue-expiry"],
    )
    def test_expiry_at_or_before_run_at_is_refused(
        self, store: Store, opts: QueueOpts, options: dict[str, object]
    ) -> None:
        q = store.queue("exp", opts)
        with pytest.raises(ValidationError):
            q.enqueue("x", **options)
        with pytest.raises(ValidationError):
            q.enqueue_many(["x", "y"], **options)
        assert q.stats() == (0, 0, 0, 0)

    def test_expiry_just_after_run_at_is_accepted(self, queue: Queue) -> None:
        got = job(queue, queue.enqueue("x", delay=10, expires=s(10) + timedelta(microseconds=1)))
        assert got.expires_at == at(10) + timedelta(microseconds=1)

    def test_one_clock_read_per_enqueue(self, open_store: StoreFactory) -> None:
        q = open_store(clock=TickingClock()).queue("jobs")
        got = job(q, q.enqueue("x", delay=5, expires=7))
        assert got.run_at - got.enqueued_at == s(5)
        assert got.expires_at is not None
        assert got.expires_at - got.enqueued_at == s(7)
        plain = job(q, q.enqueue("x"))
        assert plain.run_at == plain.enqueued_at

    def test_enqueue_many_items_share_one_clock_read(self, open_store: StoreFactory) -> None:
        q = open_store(clock=TickingClock()).queue("jobs")
        ids = q.enqueue_many([1, 2, 3], delay=5, priority=2, max_attempts=3, expires=9)
        jobs = [job(q, i) for i in ids]
        assert [j.payload for j in jobs] == [1, 2, 3]
        assert len({j.enqueued_at for j in jobs}) == 1
        assert len({j.run_at for j in jobs}) == 1
        assert len({j.expires_at for j in jobs}) == 1
        first = jobs[0]
        assert first.run_at - first.enqueued_at == s(5)
        assert [(j.priority, j.max_attempts) for j in jobs] == [(2, 3)] * 3
        plain = q.enqueue_many(["a", "b"])
        assert [job(q, i).run_at for i in plain] == [job(q, plain[0]).enqueued_at] * 2

    def test_enqueue_many_empty_writes_nothing(self, queue: Queue) -> None:
        assert queue.enqueue_many([]) == []
        assert queue.stats() == (0, 0, 0, 0)

    def test_enqueue_many_is_all_or_nothing(self, queue: Queue) -> None:
        with pytest.raises(ValidationError):
            queue.enqueue_many([{"ok": 1}, {"bad": float("nan")}, {"ok": 2}])
        assert queue.stats() == (0, 0, 0, 0)
        assert queue.claim_one("w") is None

    def test_enqueue_many_takes_any_iterable(self, queue: Queue) -> None:
        ids = queue.enqueue_many(x for x in ("a", "b"))
        assert [job(queue, i).payload for i in ids] == ["a", "b"]

    def test_stamps_come_from_the_enqueueing_handle(
        self, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        """Later decisions (claim deadline, heartbeat default, backoff, the
        budget) use the row's stamps, never the acting handle's opts."""
        rng = RecordingRng()
        store = open_store(rng=rng)
        writer = store.queue(
            "jobs",
            QueueOpts(visibility_timeout_s=10, backoff_base_s=2, backoff_cap_s=3, max_attempts=2),
        )
        worker = store.queue(
            "jobs",
            QueueOpts(visibility_timeout_s=100, backoff_base_s=1000, max_attempts=9),
        )
        job_id = writer.enqueue("x")
        handle = claim_exactly(worker, job_id)
        assert handle.claim_deadline == at(10)
        assert job(worker, job_id).claim_deadline == at(10)
        assert handle.heartbeat()
        assert job(worker, job_id).claim_deadline == at(10)
        assert handle.retry("e")
        assert rng.calls == [(1, 2)]
        assert job(worker, job_id).run_at == at(2)
        clock.set(at(2))
        handle = claim_exactly(worker, job_id)
        assert handle.attempts == 2
        assert handle.retry("e")
        dead = job(worker, job_id)
        assert (dead.state, dead.last_error, dead.attempts) == ("dead", "max attempts exceeded", 2)


class IdTests(ContractFixtures):
    """docs/contract.md §2: ids are ints, unique in a store, never reused, increasing in
    allocation order."""

    def test_sequential_enqueues_get_increasing_int_ids(self, queue: Queue) -> None:
        ids = [queue.enqueue(i) for i in range(5)]
        assert all(type(i) is int for i in ids)
        assert ids == sorted(set(ids))

    def test_enqueue_many_ids_increase_in_list_order(self, queue: Queue) -> None:
        before = queue.enqueue("before")
        ids = queue.enqueue_many(["a", "b", "c", "d"])
        assert len(ids) == 4
        assert all(type(i) is int for i in ids)
        assert [before, *ids] == sorted(set([before, *ids]))
        assert [job(queue, i).payload for i in ids] == ["a", "b", "c", "d"]
        assert queue.enqueue("after") > ids[-1]

    def test_ids_are_never_reused(self, store: Store) -> None:
        """Each step removes the highest id so far (ack, cancel, purge): a
        store that reuses the largest free id is caught."""
        q = store.queue("jobs", QueueOpts(dead_letter_retention_s=0))
        first = q.enqueue("acked")
        claim_exactly(q, first).ack()
        second = q.enqueue("cancelled")
        assert second > first
        assert q.cancel(second)
        third = q.enqueue("purged")
        assert third > second
        assert claim_exactly(q, third).fail()
        assert q.sweep_expired() == (0, 1)
        assert q.get_job(third) is None
        fourth = q.enqueue("last")
        assert fourth > third

    def test_ids_are_unique_across_queues_of_a_store(self, store: Store) -> None:
        a, b = store.queue("a"), store.queue("b")
        ids = [q.enqueue(i) for i in range(4) for q in (a, b)]
        ids += a.enqueue_many([1, 2]) + b.enqueue_many([3, 4])
        assert ids == sorted(set(ids))

    def test_ids_are_unique_across_stores_on_one_target(self, open_store: StoreFactory) -> None:
        one, two = open_store().queue("jobs"), open_store().queue("other")
        ids = [q.enqueue(i) for i in range(3) for q in (one, two)]
        assert ids == sorted(set(ids))


class TimeTests(ContractFixtures):
    """docs/contract.md §2: every datetime alkstore returns is aware UTC with microsecond
    precision; docs/contract.md §3 "Time": every instant comes from the injected clock."""

    def test_every_returned_datetime_is_utc_to_the_microsecond(
        self, store: Store, clock: ManualClock
    ) -> None:
        micro = timedelta(microseconds=123457)
        clock.set(T0 + micro)
        q = store.queue("jobs", QueueOpts(visibility_timeout_s=1.5, expires_s=100))
        job_id = q.enqueue("x", delay=timedelta(microseconds=1))
        pending = job(q, job_id)
        assert pending.enqueued_at == T0 + micro
        assert pending.run_at == T0 + micro + timedelta(microseconds=1)
        assert pending.expires_at == T0 + micro + s(100)
        clock.advance(timedelta(microseconds=2))
        handle = claim_exactly(q, job_id)
        assert handle.claim_deadline == T0 + micro + timedelta(microseconds=2) + s(1.5)
        processing = job(q, job_id)
        assert processing == handle.job
        clock.advance(timedelta(microseconds=3))
        assert handle.fail()
        dead = job(q, job_id)
        assert dead.died_at == T0 + micro + timedelta(microseconds=5)
        for snapshot in (pending, processing, handle.job, dead):
            for value in (
                snapshot.enqueued_at,
                snapshot.run_at,
                snapshot.expires_at,
                snapshot.claim_deadline,
                snapshot.died_at,
            ):
                assert_utc(value)

    def test_a_clock_in_another_zone_is_read_as_utc(self, open_store: StoreFactory) -> None:
        india = timezone(timedelta(hours=5, minutes=30))
        q = open_store(clock=lambda: T0.astimezone(india)).queue("jobs")
        got = job(q, q.enqueue("x"))
        assert got.enqueued_at == T0
        assert got.enqueued_at.utcoffset() == timedelta(0)
