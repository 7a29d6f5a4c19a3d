"""The engine-private state 'scheduled' (future rows, out of the claim's
walk): public state, stats, the claim at the exact instant a row comes
due, retry with a delay, and every operation on a scheduled row."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from alkstore import QueueOpts
from alkstore_contract_tests import T0, ManualClock
from alkstore_postgres import PostgresStore

pytestmark = pytest.mark.postgres

_US = timedelta(microseconds=1)


def private_state(admin: psycopg.Connection[Any], schema: str, job_id: int) -> str | None:
    row = admin.execute(
        sql.SQL("SELECT state FROM {} WHERE id = %s").format(sql.Identifier(schema, "jobs")),
        [job_id],
    ).fetchone()
    return None if row is None else str(row[0])


def test_a_future_job_is_scheduled_and_publicly_pending(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str
) -> None:
    q = store.queue("jobs")
    later = q.enqueue("later", delay=60)
    at = q.enqueue("at", run_at=T0 + timedelta(seconds=30))
    now = q.enqueue("now")
    (many,) = q.enqueue_many(["many"], delay=10)
    assert [private_state(admin, schema, i) for i in (later, at, now, many)] == [
        "scheduled",
        "scheduled",
        "pending",
        "scheduled",
    ]
    job = q.get_job(later)
    assert job is not None
    assert job.state == "pending"
    assert q.stats() == (1, 3, 0, 0)


def test_enqueue_tx_schedules_too(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str, postgres_url: str
) -> None:
    q = store.queue("jobs")
    with psycopg.connect(postgres_url, autocommit=True) as conn, conn.transaction():
        job_id = q.enqueue_tx(conn, "tx", delay=5)
    assert private_state(admin, schema, job_id) == "scheduled"
    assert q.stats() == (0, 1, 0, 0)


def test_a_future_job_is_claimed_exactly_when_due(
    store: PostgresStore, clock: ManualClock, admin: psycopg.Connection[Any], schema: str
) -> None:
    q = store.queue("jobs")
    job_id = q.enqueue("x", delay=60)
    clock.set(T0 + timedelta(seconds=60) - _US)
    assert q.claim_one("w") is None
    assert q.stats() == (0, 1, 0, 0)
    assert private_state(admin, schema, job_id) == "scheduled"
    clock.set(T0 + timedelta(seconds=60))
    assert q.stats() == (1, 0, 0, 0)  # by the instant, before any claim moved it
    handle = q.claim_one("w")
    assert handle is not None
    assert (handle.id, handle.state, handle.attempts) == (job_id, "processing", 1)
    assert private_state(admin, schema, job_id) == "processing"
    assert q.stats() == (0, 0, 1, 0)


def test_came_due_rows_merge_into_claim_order(
    store: PostgresStore, clock: ManualClock, admin: psycopg.Connection[Any], schema: str
) -> None:
    q = store.queue("jobs")
    low_now = q.enqueue("low now", priority=0)
    high_later = q.enqueue("high later", priority=5, delay=10)
    mid_later = q.enqueue_many(["mid later 1", "mid later 2"], priority=3, delay=10)
    far = q.enqueue("far", priority=9, delay=3600)
    clock.advance(10)
    handle = q.claim_one("w")
    assert handle is not None
    assert handle.id == high_later
    # The came-due rows the claim did not hand out are pending now, in order.
    assert [private_state(admin, schema, i) for i in mid_later] == ["pending", "pending"]
    assert private_state(admin, schema, far) == "scheduled"
    assert [h.id for h in q.claim_batch("w", 10)] == [*mid_later, low_now]
    assert q.stats() == (0, 1, 4, 0)


def test_a_batch_claims_came_due_and_pending_rows_together(
    store: PostgresStore, clock: ManualClock
) -> None:
    q = store.queue("jobs")
    now_ids = q.enqueue_many(list(range(3)))
    later_ids = q.enqueue_many(list(range(3)), delay=1, priority=1)
    clock.advance(1)
    assert [h.id for h in q.claim_batch("w", 4)] == [*later_ids, now_ids[0]]
    assert [h.id for h in q.claim_batch("w", 4)] == now_ids[1:]


def test_retry_with_a_delay_is_scheduled_and_comes_back(
    store: PostgresStore, clock: ManualClock, admin: psycopg.Connection[Any], schema: str
) -> None:
    q = store.queue("jobs")
    job_id = q.enqueue("x")
    first = q.claim_one("w")
    assert first is not None
    assert first.retry("later", delay=30)
    assert private_state(admin, schema, job_id) == "scheduled"
    job = q.get_job(job_id)
    assert job is not None
    assert (job.state, job.run_at, job.last_error) == (
        "pending",
        T0 + timedelta(seconds=30),
        "later",
    )
    assert q.stats() == (0, 1, 0, 0)
    clock.advance(30 - 1e-6)
    assert q.claim_one("w") is None
    clock.advance(1e-6)
    second = q.claim_one("w")
    assert second is not None
    assert (second.id, second.attempts) == (job_id, 2)
    # Without a delay (backoff base 0) the row is due at once: pending.
    q0 = store.queue("zero", QueueOpts(backoff_base_s=0))
    zero_id = q0.enqueue("y")
    handle = q0.claim_one("w")
    assert handle is not None
    assert handle.retry("again")
    assert private_state(admin, schema, zero_id) == "pending"


def test_operations_on_scheduled_rows(store: PostgresStore, clock: ManualClock) -> None:
    q = store.queue("jobs", QueueOpts(dead_letter_retention_s=None))
    cancelled = q.enqueue("c", delay=60)
    assert q.cancel(cancelled)
    assert q.get_job(cancelled) is None
    acked = q.enqueue("a", delay=60)
    assert q.ack_batch([acked]) == 0  # no claim to ack
    assert q.cancel(acked)
    expiring = q.enqueue("e", delay=60, expires=120)
    clock.advance(120)
    assert q.claim_one("w") is None  # came due but expired: never handed out
    assert q.sweep_expired() == (1, 0)
    dead = q.get_job(expiring)
    assert dead is not None
    assert (dead.state, dead.last_error) == ("dead", "expired")


def test_an_expired_came_due_row_is_moved_out_of_the_scheduled_range(
    store: PostgresStore, clock: ManualClock, admin: psycopg.Connection[Any], schema: str
) -> None:
    q = store.queue("jobs")
    job_id = q.enqueue("e", delay=10, expires=20)
    clock.advance(30)
    assert q.claim_one("w") is None
    assert private_state(admin, schema, job_id) == "expired"  # left for sweep_expired
    assert q.stats() == (1, 0, 0, 0)
    job = q.get_job(job_id)
    assert job is not None
    assert job.state == "pending"


def test_a_clock_moving_backwards_never_hands_out_a_future_row(
    store: PostgresStore, clock: ManualClock, admin: psycopg.Connection[Any], schema: str
) -> None:
    q = store.queue("jobs")
    ids = q.enqueue_many(["a", "b"], delay=10)
    clock.advance(10)
    assert q.claim_one("w") is not None  # the other one moved to pending
    assert private_state(admin, schema, ids[1]) == "pending"
    clock.set(T0)
    assert q.claim_one("w") is None
    assert q.stats() == (0, 1, 1, 0)
    job = q.get_job(ids[1])
    assert job is not None
    assert job.state == "pending"
    clock.set(T0 + timedelta(seconds=10))
    handle = q.claim_one("w")
    assert handle is not None
    assert handle.id == ids[1]
