"""The engine-private row states (``_schema``'s table): which state each
write chooses, how the claim moves rows between them, and that none of it
shows, not even when an injected clock moves backwards (docs/contract.md §3 "Time")."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from alkstore import JobHandle, QueueOpts, QueueStats
from alkstore_contract_tests import T0, ManualClock
from alkstore_contract_tests.model import ModelStore
from alkstore_contract_tests.suite.stateful import machine_for, stateful_settings
from alkstore_sqlite import SqliteStore, open_store


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _states(store: SqliteStore) -> dict[int, str]:
    with sqlite3.connect(store.path) as conn:
        return dict(conn.execute("SELECT id, state FROM _alkstore_jobs").fetchall())


def _public(store: SqliteStore, queue: str, job_id: int) -> str:
    job = store.queue(queue).get_job(job_id)
    assert job is not None
    return job.state


def test_enqueue_and_retry_keep_future_rows_out_of_the_walk(
    store: SqliteStore, clock: ManualClock, db_path: Path
) -> None:
    queue = store.queue("q")
    now = queue.enqueue("now")
    past = queue.enqueue("past", run_at=at(-5))
    later = queue.enqueue("later", delay=5)
    many = queue.enqueue_many(["a", "b"], run_at=at(5))
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        in_tx = queue.enqueue_tx(conn, "tx", delay=5)
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert _states(store) == {
        now: "pending",
        past: "pending",
        later: "scheduled",
        many[0]: "scheduled",
        many[1]: "scheduled",
        in_tx: "scheduled",
    }
    assert {_public(store, "q", i) for i in _states(store)} == {"pending"}
    assert queue.stats() == QueueStats(pending=2, scheduled=4, processing=0, dead=0)

    first, second = queue.claim_batch("w", 2)
    assert first.retry("again", delay=0)
    assert second.retry("later", delay=1)
    assert _states(store)[first.id] == "pending"
    assert _states(store)[second.id] == "scheduled"
    assert queue.stats() == QueueStats(pending=1, scheduled=5, processing=0, dead=0)


def test_rows_that_came_due_are_claimed_in_claim_order(
    store: SqliteStore, clock: ManualClock
) -> None:
    queue = store.queue("q")
    queue.enqueue("due-low", priority=1)
    queue.enqueue("late-high", priority=9, delay=10)
    queue.enqueue("early-mid", priority=5, delay=5)
    queue.enqueue("late-mid", priority=5, delay=10)
    queue.enqueue("not-yet", priority=9, delay=60)
    clock.advance(10)
    claimed = queue.claim_batch("w", 10)
    assert [h.payload for h in claimed] == ["late-high", "early-mid", "late-mid", "due-low"]
    assert _states(store)[5] == "scheduled"


def test_a_lapsed_claim_shows_as_processing_until_reclaimed(
    store: SqliteStore, clock: ManualClock
) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=10, max_attempts=2))
    lapsing = queue.enqueue("lapsing")
    (handle,) = queue.claim_batch("w1", 1)
    before = queue.get_job(lapsing)
    clock.advance(10)
    queue.enqueue("other", priority=-1)
    (other,) = queue.claim_batch("w2", 1)
    assert other.payload == "lapsing"  # reclaimed
    assert other.attempts == 2
    assert not handle.ack()
    clock.advance(10)
    # Lapsed with attempts exhausted: the claim buries it, then hands out
    # the other job.
    (last,) = queue.claim_batch("w3", 1)
    assert last.payload == "other"
    dead = queue.get_job(lapsing)
    assert dead is not None
    assert (dead.state, dead.last_error, dead.attempts) == ("dead", "max attempts exceeded", 2)
    assert before is not None
    assert before.state == "processing"

    # Marked lapsed but not reclaimed yet: public state, worker and deadline
    # are the claim's.
    queue.enqueue("third", priority=-5)
    (third,) = queue.claim_batch("w4", 1)
    clock.advance(10)
    queue.enqueue("first-in-line", priority=5)
    (first,) = queue.claim_batch("w5", 1)
    assert first.payload == "first-in-line"
    assert _states(store)[third.id] == "lapsed"
    snapshot = queue.get_job(third.id)
    assert snapshot is not None
    assert (snapshot.state, snapshot.worker_id) == ("processing", "w4")
    assert snapshot.claim_deadline == third.claim_deadline
    assert queue.stats() == QueueStats(pending=0, scheduled=0, processing=3, dead=1)


def test_expired_rows_are_set_aside_and_still_count_until_swept(
    store: SqliteStore, clock: ManualClock
) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=10))
    pending = queue.enqueue("pending", priority=5, expires=5)
    claimed = queue.enqueue("claimed", priority=9, expires=15)
    (handle,) = queue.claim_batch("w", 1)
    assert handle.id == claimed
    clock.advance(20)
    assert queue.claim_batch("w", 5) == []
    states = _states(store)
    assert (states[pending], states[claimed]) == ("expired", "expired")
    assert (_public(store, "q", pending), _public(store, "q", claimed)) == (
        "pending",
        "processing",
    )
    assert queue.stats() == QueueStats(pending=1, scheduled=0, processing=1, dead=0)
    assert queue.cancel(pending)
    assert tuple(queue.sweep_expired()) == (1, 0)
    job = queue.get_job(claimed)
    assert job is not None
    assert (job.state, job.last_error) == ("dead", "expired")


def test_sweep_takes_expired_rows_in_every_state(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=100))
    scheduled = queue.enqueue("retried past its expiry", expires=10)
    (handle,) = queue.claim_batch("w", 1)
    assert handle.retry("later", delay=60)
    processing = queue.enqueue("claimed", expires=10)
    (claim,) = queue.claim_batch("w", 1)
    assert claim.id == processing
    pending = queue.enqueue("never claimed", expires=10)
    clock.advance(20)
    states = _states(store)
    assert (states[scheduled], states[processing], states[pending]) == (
        "scheduled",
        "processing",
        "pending",
    )
    assert queue.stats() == QueueStats(pending=1, scheduled=1, processing=1, dead=0)
    assert tuple(queue.sweep_expired()) == (3, 0)
    assert queue.stats() == QueueStats(pending=0, scheduled=0, processing=0, dead=3)


# -- an injected clock that moves backwards ------------------------------------


def test_a_clock_moving_back_un_dues_a_promoted_row(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q")
    queue.enqueue("marker", priority=-9)
    job_id = queue.enqueue("x", delay=10)
    clock.set(at(10))
    (handle,) = queue.claim_batch("w", 1)
    assert handle.id == job_id  # promoted and claimed
    assert handle.retry("again", delay=0)
    assert _states(store)[job_id] == "pending"
    clock.set(at(5))
    # Pending in the private sense, but its run_at is ahead again.
    assert queue.stats() == QueueStats(pending=1, scheduled=1, processing=0, dead=0)
    (other,) = queue.claim_batch("w", 5)
    assert other.payload == "marker"
    clock.set(at(10))
    (again,) = queue.claim_batch("w", 5)
    assert again.id == job_id


def test_a_clock_moving_back_revives_a_lapsed_claim(store: SqliteStore, clock: ManualClock) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=10))
    job_id = queue.enqueue("x")
    (handle,) = queue.claim_batch("w", 1)
    clock.set(at(15))
    assert queue.claim_batch("other", 0) == []
    queue.enqueue("y", priority=5)
    assert [h.payload for h in queue.claim_batch("other", 1)] == ["y"]
    assert _states(store)[job_id] == "lapsed"
    clock.set(at(5))
    # Not lapsed any more: not reclaimed, and the handle is valid.
    assert queue.claim_batch("other", 5) == []
    assert handle.heartbeat(2)
    assert queue.stats().processing == 2
    clock.set(at(7) + timedelta(microseconds=-1))
    assert queue.ack_batch([job_id]) == 1


@pytest.mark.parametrize("claimed", [False, True])
def test_a_clock_moving_back_un_expires_a_set_aside_row(
    store: SqliteStore, clock: ManualClock, claimed: bool
) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=10))
    job_id = queue.enqueue("x", expires=20)
    handle: JobHandle | None = None
    if claimed:
        (handle,) = queue.claim_batch("w", 1)
    clock.set(at(25))
    assert queue.claim_batch("w", 5) == []
    assert _states(store)[job_id] == "expired"
    clock.set(at(5) if claimed else at(15))
    assert queue.sweep_expired() == (0, 0)
    if handle is not None:
        # Its claim is live again, and so is the row.
        assert handle.heartbeat(1)
        assert queue.claim_batch("w", 5) == []
        assert _states(store)[job_id] == "processing"
        assert handle.ack()
    else:
        (again,) = queue.claim_batch("w", 5)
        assert again.id == job_id


class _BackwardsClockRules:
    """Rules the contract's state machine lacks: an injected clock that
    moves backwards. The model takes the instant of every operation, so it
    stays the reference."""

    clock: ManualClock
    model: ModelStore

    @rule(seconds=st.sampled_from([0.5, 1, 5, 10, 20, 30]))
    def move_clock_back(self, seconds: float) -> None:
        self.clock.set(self.clock() - timedelta(seconds=seconds))

    @rule(index=st.integers(0, 10_000), offset_us=st.sampled_from([-1, 0, 1]))
    def move_back_to_a_boundary(self, index: int, offset_us: int) -> None:
        """Back to just before, at or just after an instant that has passed:
        a due time, an expiry or a claim deadline, so that what a claim
        found due, expired or lapsed is not any more."""
        now = self.clock()
        instants = []
        for row in self.model.live.values():
            instants += [row.run_at, row.expires_at, row.claim_deadline]
        past = sorted({i for i in instants if i is not None and i <= now})
        if past:
            self.clock.set(past[index % len(past)] + timedelta(microseconds=offset_us))


def test_engine_agrees_with_the_model_when_the_clock_moves_back(tmp_path: Path) -> None:
    stores: list[SqliteStore] = []

    def opener(**options: Any) -> SqliteStore:
        store = open_store(f"sqlite:///{tmp_path / 'alkstore.db'}", **options)
        stores.append(store)
        return store

    base = machine_for(opener)
    machine = type("BackwardsMachine", (_BackwardsClockRules, base), {})
    try:
        run_state_machine_as_test(machine, settings=stateful_settings())
    finally:
        for store in stores:
            store.close()


def test_moves_are_one_transaction_with_the_claim(
    open_sqlite: Callable[..., SqliteStore], clock: ManualClock
) -> None:
    """A failing claim leaves the rows as they were: the moves roll back
    with it."""
    store = open_sqlite()
    queue = store.queue("q", QueueOpts(max_attempts=1, visibility_timeout_s=1))
    queue.enqueue("future", delay=5)
    queue.enqueue("dies")
    assert len(queue.claim_batch("w", 1)) == 1
    clock.advance(5)
    before = _states(store)
    with sqlite3.connect(store.path) as conn:
        conn.execute(
            "CREATE TRIGGER fail BEFORE INSERT ON _alkstore_dead "
            "BEGIN SELECT RAISE(ABORT, 'injected'); END"
        )
    with pytest.raises(Exception, match="injected"):
        queue.claim_batch("w", 1)
    assert _states(store) == before
