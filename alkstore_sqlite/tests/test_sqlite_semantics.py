"""docs/contract.md §3 semantics on this engine, with an injected clock (no sleeps).

The shared contract suite covers the contract in full; these tests pin the
engine's own SQL paths and the regression cases that exercise them most.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from alkstore import QueueOpts, QueueStats, SweepResult
from alkstore_contract_tests import T0, ManualClock
from alkstore_sqlite import SqliteStore
from alkstore_sqlite._rows import from_us, to_us


class MaxRng:
    """Always draws the top of the range."""

    def randint(self, a: int, b: int) -> int:
        return b


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "instant",
    [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(1970, 1, 1, tzinfo=UTC),
        T0 + timedelta(microseconds=1),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    ],
)
def test_instants_round_trip_exactly(instant: datetime) -> None:
    assert from_us(to_us(instant)) == instant
    assert from_us(to_us(instant)).tzinfo is UTC


def test_job_fields_are_resolved_and_utc(store: SqliteStore, clock: ManualClock) -> None:
    opts = QueueOpts(visibility_timeout_s=2.5, backoff_base_s=3, backoff_cap_s=60, expires_s=7200)
    queue = store.queue("q", opts)
    elsewhere = datetime(2030, 1, 1, 6, 0, tzinfo=timezone(timedelta(hours=5)))
    job_id = queue.enqueue(b"\x00\xff", run_at=elsewhere, priority=-7, max_attempts=3)
    job = queue.get_job(job_id)
    assert job is not None
    assert job.run_at == at(3600)
    assert job.run_at.tzinfo is UTC
    assert (job.enqueued_at, job.expires_at) == (T0, at(7200))
    assert (job.priority, job.max_attempts, job.attempts) == (-7, 3, 0)
    assert job.visibility_timeout_s == 2.5
    assert isinstance(job.visibility_timeout_s, float)
    assert (job.backoff_base_s, job.backoff_cap_s) == (3, 60)
    assert (job.payload, job.payload_bytes) == (b"\x00\xff", b"\x00\xff")
    assert job.content_type == "application/octet-stream"
    assert (job.worker_id, job.claim_deadline, job.last_error, job.died_at) == (
        None,
        None,
        None,
        None,
    )
    clock.set(at(3600))
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.claim_deadline == at(3602.5)
    assert isinstance(handle.job.visibility_timeout_s, float)


def test_case_002_dead_worker_on_the_last_attempt(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=30))
    j1 = queue.enqueue("J1", max_attempts=1)
    assert queue.claim_one("w1") is not None
    clock.set(at(29))
    assert queue.claim_one("w2") is None
    job = queue.get_job(j1)
    assert job is not None
    assert job.state == "processing"
    clock.set(at(30))  # lapsed at the deadline exactly
    assert queue.claim_one("w2") is None
    job = queue.get_job(j1)
    assert job is not None
    assert (job.state, job.attempts, job.last_error) == ("dead", 1, "max attempts exceeded")
    assert (job.worker_id, job.claim_deadline, job.died_at) == ("w1", at(30), at(30))

    j3 = queue.enqueue("J3", max_attempts=3)
    for attempt in (1, 2, 3):
        handle = queue.claim_one("w")
        assert handle is not None
        assert (handle.id, handle.attempts) == (j3, attempt)
        clock.advance(31)
    assert queue.claim_one("w") is None
    job = queue.get_job(j3)
    assert job is not None
    assert (job.state, job.attempts) == ("dead", 3)


def test_case_009_priority_order_and_future_jobs(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=3600))
    ids = {
        name: queue.enqueue(name, **({} if p is None else {"priority": p}))
        for name, p in [("A", 0), ("B", 10), ("C", -5), ("D", 10), ("E", None)]
    }
    order = [queue.claim_one("w") for _ in range(5)]
    assert [h.payload for h in order if h is not None] == ["B", "D", "A", "E", "C"]
    assert queue.claim_one("w") is None
    for name in ids:
        queue.enqueue(name, priority={"A": 0, "B": 10, "C": -5, "D": 10}.get(name))
    assert [h.payload for h in queue.claim_batch("w", 5)] == ["B", "D", "A", "E", "C"]
    queue.enqueue("F", priority=10, run_at=at(60))
    queue.enqueue("G")
    assert [h.payload for h in queue.claim_batch("w", 5)] == ["G"]
    clock.set(at(60))
    assert [h.payload for h in queue.claim_batch("w", 5)] == ["F"]


def test_claim_batch_mixes_reclaims_in_claim_order(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=10))
    low = queue.enqueue("low", priority=1)
    high = queue.enqueue("high", priority=5)
    assert [h.id for h in queue.claim_batch("w", 2)] == [high, low]
    clock.advance(10)
    mid = queue.enqueue("mid", priority=3)
    handles = queue.claim_batch("w2", 2)
    assert [(h.id, h.attempts) for h in handles] == [(high, 2), (mid, 1)]
    # Rows not handed out are untouched.
    job = queue.get_job(low)
    assert job is not None
    assert (job.state, job.attempts, job.worker_id) == ("processing", 1, "w")


def test_handle_ops_check_the_claim(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=10, backoff_base_s=4))
    queue.enqueue("x")
    first = queue.claim_one("w")
    assert first is not None
    clock.advance(5)
    assert first.heartbeat(20)
    clock.advance(19)
    assert first.heartbeat()  # default: the row's visibility timeout
    job = queue.get_job(first.id)
    assert job is not None
    assert job.claim_deadline == clock() + timedelta(seconds=10)
    clock.advance(10)
    assert not first.heartbeat()  # lapsed at the deadline
    second = queue.claim_one("w2")
    assert second is not None
    assert second.attempts == 2
    # The first handle is stale even though the row is processing again.
    assert not first.ack()
    assert not first.retry("e")
    assert not first.fail("e")
    assert queue.ack_batch([second.id, second.id, 12345]) == 1
    assert not second.ack()


def test_retry_uses_the_row_stamps_and_the_store_rng(
    open_sqlite: Callable[..., SqliteStore], clock: ManualClock
) -> None:
    store = open_sqlite(rng=MaxRng())
    stamped = store.queue("q", QueueOpts(backoff_base_s=4, backoff_cap_s=3600))
    job_id = stamped.enqueue("x")
    other = store.queue("q", QueueOpts(backoff_base_s=100, visibility_timeout_s=1))
    handle = other.claim_one("w")
    assert handle is not None
    assert handle.claim_deadline == T0 + timedelta(seconds=30)
    assert handle.retry("first \x00 error")
    job = other.get_job(job_id)
    assert job is not None
    assert (job.state, job.run_at, job.attempts) == ("pending", at(4), 1)
    assert job.last_error == "first \ufffd error"
    assert (job.worker_id, job.claim_deadline) == (None, None)
    clock.set(at(4))
    handle = other.claim_one("w")
    assert handle is not None
    assert handle.retry("again", delay=timedelta(milliseconds=1500))
    job = other.get_job(job_id)
    assert job is not None
    assert job.run_at == at(5.5)


def test_case_003_huge_attempts_backoff(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q", QueueOpts(max_attempts=100_000, backoff_base_s=1))
    queue.enqueue("x")
    for _ in range(40):
        handle = queue.claim_one("w")
        assert handle is not None
        assert handle.retry("e", delay=0)
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.attempts == 41
    assert handle.retry("e")
    job = queue.get_job(handle.id)
    assert job is not None
    assert 1800 <= (job.run_at - clock()).total_seconds() <= 3600


def test_sweep_expired_and_retention(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q", QueueOpts(dead_letter_retention_s=100))
    keep = store.queue("q")
    pending = queue.enqueue("p", expires=10)
    claimed = queue.enqueue("c", expires=10, priority=1)
    lasting = queue.enqueue("l")
    elsewhere = store.queue("other").enqueue("o", expires=10)
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.id == claimed
    clock.set(at(9))
    assert queue.sweep_expired() == SweepResult(0, 0)
    assert queue.stats() == QueueStats(pending=2, scheduled=0, processing=1, dead=0)
    clock.set(at(10))
    assert queue.sweep_expired() == SweepResult(2, 0)
    for job_id in (pending, claimed):
        job = queue.get_job(job_id)
        assert job is not None
        assert (job.state, job.last_error, job.died_at) == ("dead", "expired", at(10))
    assert not handle.ack()
    other_job = store.queue("other").get_job(elsewhere)
    assert other_job is not None
    assert other_job.state == "pending"
    assert queue.get_job(elsewhere) is None
    clock.set(at(109))
    assert keep.sweep_expired() == SweepResult(0, 0)  # no retention: keep
    assert queue.sweep_expired() == SweepResult(0, 0)
    clock.set(at(110))
    assert queue.sweep_expired() == SweepResult(0, 2)
    assert queue.stats() == QueueStats(pending=1, scheduled=0, processing=0, dead=0)
    assert queue.get_job(lasting) is not None


def test_expired_rows_are_never_claimed(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=5))
    pending = queue.enqueue("p", expires=10)
    queue.enqueue("r", expires=20)
    first = queue.claim_one("w")
    assert first is not None
    assert first.id == pending
    clock.set(at(10))
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.payload == "r"
    assert queue.claim_one("w") is None
    assert queue.stats() == QueueStats(pending=0, scheduled=0, processing=2, dead=0)


def test_stats_split_due_and_scheduled(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q")
    queue.enqueue_many([1, 2])
    queue.enqueue(3, delay=1)
    queue.enqueue(4, expires=1)
    assert queue.stats() == QueueStats(pending=3, scheduled=1, processing=0, dead=0)
    clock.advance(1)
    assert queue.stats() == QueueStats(pending=4, scheduled=0, processing=0, dead=0)


def test_get_job_and_cancel_see_only_their_queue(store: SqliteStore) -> None:
    a, b = store.queue("a"), store.queue("b")
    job_id = a.enqueue("x")
    assert b.get_job(job_id) is None
    assert not b.cancel(job_id)
    handle = a.claim_one("w")
    assert handle is not None
    assert b.ack_batch([job_id]) == 0
    assert a.cancel(job_id)
    assert not a.cancel(job_id)
    assert not handle.ack()


@pytest.mark.parametrize(
    "payload",
    [
        {"s": "a\u0000b", "k\u0000": "名前"},
        "\u0000",
        "x" * 65_537,
        ["y" * 70] * 900,
        b"\x00" * (16 * 2**20),
        b"",
        [],
        None,
    ],
)
def test_payloads_round_trip(store: SqliteStore, payload: object) -> None:
    queue = store.queue("q")
    queue.enqueue(payload)
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.payload == payload
    assert type(handle.payload) is type(payload)
