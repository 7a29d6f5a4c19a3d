"""The outbox's relay against a real SQLite file, in real time: a slow
``send`` must not let the batch lapse, through the sync and the async
class (docs/outbox.md). The outbox's semantics on every engine are the
contract's ``OutboxTests`` and ``AsyncRuntimeTests``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import alkstore
from alkstore import AsyncOutbox, Outbox, Queue, QueueOpts, Store, ValidationError
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


def test_an_async_outbox_heartbeats_a_slow_batch_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    """``AsyncOutbox``'s heartbeats are a task of the loop, awaiting the
    store: while a slow ``async def`` send awaits, they run and keep the
    batch claimed past its visibility timeout (the slow-send scenario above,
    through the async surface; the store's clock moves only here)."""
    clock = ManualClock(T0)
    sent: Counter[int] = Counter()

    async def main() -> list[Any]:
        async with alkstore.open_async(f"sqlite:///{tmp_path / 'outbox.db'}", clock=clock) as store:
            queue = store.queue("outbox", QueueOpts(visibility_timeout_s=0.6))
            outbox = AsyncOutbox(queue)
            ids = await queue.enqueue_many([1, 2, 3])

            async def renewed_since(instant: datetime) -> bool:
                jobs = [await queue.get_job(job_id) for job_id in ids]
                return all(
                    job is not None
                    and job.claim_deadline is not None
                    and job.claim_deadline >= instant + timedelta(seconds=0.6)
                    for job in jobs
                )

            async def slow_send(message: int) -> None:
                sent[message] += 1
                if message != 3:
                    now = clock.advance(0.35)
                    deadline = time.monotonic() + 30
                    while not await renewed_since(now):
                        assert time.monotonic() < deadline, "no heartbeat renewed the claims"
                        await asyncio.sleep(0.01)

            delivered = await outbox.relay_once(slow_send, worker_id="relay")
            again = await outbox.relay_once(slow_send, worker_id="other")
            return [delivered, again, clock(), tuple(await queue.stats())]

    assert asyncio.run(main()) == [3, 0, T0 + timedelta(seconds=0.7), (0, 0, 0, 0)]
    assert sent == {1: 1, 2: 1, 3: 1}


def test_sends_run_where_they_block_nothing(tmp_path: Path) -> None:
    """``AsyncOutbox`` runs a plain ``send`` on a thread, not on the loop;
    the sync ``Outbox`` refuses an ``async def`` send called from inside a
    running loop (it would block it) before claiming anything."""
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    on_a_loop: list[tuple[object, bool]] = []

    def plain(message: object) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            on_a_loop.append((message, False))
        else:
            on_a_loop.append((message, True))

    async def coroutine_send(message: object) -> None:
        pass

    async def main(queue: Queue) -> int:
        with pytest.raises(ValidationError, match="runs inside an event loop"):
            Outbox(queue).relay_once(coroutine_send, worker_id="relay")
        assert queue.stats().pending == 2
        async with alkstore.open_async(url) as astore:
            return await AsyncOutbox(astore.queue("outbox")).relay_once(plain, worker_id="relay")

    with alkstore.open(url) as store:
        queue = store.queue("outbox")
        queue.enqueue_many(["a", "b"])
        assert asyncio.run(main(queue)) == 2
    assert on_a_loop == [("a", False), ("b", False)]  # on a thread, where no loop runs
