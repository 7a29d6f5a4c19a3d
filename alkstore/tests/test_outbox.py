"""The outbox's relay against a real SQLite file, in real time: a slow
``send`` must not let the batch lapse (docs/outbox.md). The outbox's
semantics on every engine are the contract's ``OutboxTests``."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import alkstore
from alkstore import Outbox, QueueOpts, Store, ValidationError
from alkstore_contract_tests import T0, ManualClock


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with alkstore.open(f"sqlite:///{tmp_path / 'outbox.db'}") as opened:
        yield opened


def test_a_slow_send_does_not_hand_the_batch_out_again(tmp_path: Path) -> None:
    # The sends take 0.7 s of the store's clock together, past the 0.6 s
    # visibility timeout, no one of them longer than 0.35 s: only the relay's
    # background heartbeats (every 0.2 s) keep the claims alive. The store's
    # clock moves only here; each send waits, bounded, for the heartbeats to
    # land before it moves the clock on, so a slow machine cannot fail it.
    clock = ManualClock(T0)
    with alkstore.open(f"sqlite:///{tmp_path / 'outbox.db'}", clock=clock) as store:
        queue = store.queue("outbox", QueueOpts(visibility_timeout_s=0.6))
        outbox = Outbox(queue)
        ids = queue.enqueue_many([1, 2, 3])
        sent: Counter[int] = Counter()

        def renewed_since(instant: datetime) -> bool:
            jobs = [queue.get_job(job_id) for job_id in ids]
            return all(
                job is not None
                and job.claim_deadline is not None
                and job.claim_deadline >= instant + timedelta(seconds=0.6)
                for job in jobs
            )

        def slow_send(message: int) -> None:
            sent[message] += 1
            if message != 3:
                now = clock.advance(0.35)
                deadline = time.monotonic() + 30
                while not renewed_since(now):
                    assert time.monotonic() < deadline, "no heartbeat renewed the claims"
                    time.sleep(0.01)

        assert outbox.relay_once(slow_send, worker_id="relay") == 3
        assert clock() == T0 + timedelta(seconds=0.7)  # past the claims' first deadline
        assert outbox.relay_once(slow_send, worker_id="other") == 0
        assert sent == {1: 1, 2: 1, 3: 1}
        assert queue.stats() == (0, 0, 0, 0)


def test_bad_arguments_are_refused(store: Store) -> None:
    with pytest.raises(ValidationError, match="an Outbox needs a Queue, not str"):
        Outbox("outbox")  # type: ignore[arg-type]
    outbox = Outbox(store.queue("outbox"))
    with pytest.raises(ValidationError, match=r"stop must be a threading\.Event, not bool"):
        outbox.relay(print, worker_id="relay", stop=True)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="batch_size"):
        outbox.relay_once(print, worker_id="relay", batch_size=0)


def test_a_closed_store_is_reported_before_bad_arguments(store: Store) -> None:
    outbox = Outbox(store.queue("outbox"))
    store.close()
    with pytest.raises(alkstore.StoreClosedError):
        outbox.relay_once(print, worker_id="relay", batch_size=0)


def test_a_message_that_dies_is_logged_as_dead(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11: the relay says so, at ERROR, when a failed send spends a
    message's last attempt; earlier failures stay warnings."""
    queue = store.queue("outbox", QueueOpts(max_attempts=2, backoff_base_s=0))
    outbox = Outbox(queue)
    job_id = queue.enqueue("m")

    def send(message: object) -> None:
        raise ConnectionError("broker down")

    with caplog.at_level(logging.WARNING, logger="alkstore.outbox"):
        assert outbox.relay_once(send, worker_id="relay") == 0
        assert outbox.relay_once(send, worker_id="relay") == 0
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        (
            "WARNING",
            f"outbox 'outbox': sending message {job_id} failed (attempt 1 of 2): broker down",
        ),
        (
            "ERROR",
            f"outbox 'outbox': message {job_id} is dead after 2 attempt(s), its last send "
            "failing: broker down",
        ),
    ]
    dead = queue.get_job(job_id)
    assert dead is not None
    assert dead.state == "dead"


def test_a_permanent_error_ends_the_relay(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """``relay`` retries a claim that failed on an error that may pass, and
    raises one that is permanent instead of retrying it forever."""
    queue = store.queue("outbox")
    outbox = Outbox(queue)
    calls: list[int] = []

    def claim_batch(worker_id: str, n: int) -> list[alkstore.JobHandle]:
        calls.append(n)
        if len(calls) == 1:
            raise alkstore.EngineError("database is locked")
        raise alkstore.EngineError("the database file was replaced", permanent=True)

    monkeypatch.setattr(queue, "claim_batch", claim_batch)
    with pytest.raises(alkstore.EngineError, match="replaced"):
        outbox.relay(print, worker_id="relay", poll_interval_s=0.01)
    assert calls == [100, 100]
