"""Wake-ups (docs/contract.md §3 "Wake"), in real time.

Positive wakes must arrive within :data:`WAKE_TIMEOUT_S`; where nothing
should wake a subscriber the suite waits :data:`QUIET_S` and expects
``False``. The contract allows rare spurious wakes, so these negative checks
only stand where an engine has no reason for one.
"""

from __future__ import annotations

import threading
import time

import pytest

from alkstore import Queue, Store, StoreClosedError
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, StoreFactory, at

__all__ = ["QUIET_S", "WAKE_TIMEOUT_S", "WakeTests"]

#: How long a wake that must come may take.
WAKE_TIMEOUT_S = 5.0
#: How long the suite listens where no wake should come.
QUIET_S = 0.5
#: Time for asynchronous wake delivery to settle before a level check.
SETTLE_S = 0.3


class WakeTests(ContractFixtures):
    """Committed enqueues wake their queue's subscribers, level-triggered."""

    def test_enqueue_wakes_a_subscriber(self, store: Store, queue: Queue) -> None:
        with store.listen("jobs") as sub:
            queue.enqueue("x")
            assert sub.wait(WAKE_TIMEOUT_S) is True

    def test_enqueue_many_wakes_a_subscriber(self, store: Store, queue: Queue) -> None:
        with store.listen("jobs") as sub:
            queue.enqueue_many(["a", "b"])
            assert sub.wait(WAKE_TIMEOUT_S) is True

    def test_one_true_consumes_every_pending_wake(self, store: Store, queue: Queue) -> None:
        with store.listen("jobs") as sub:
            queue.enqueue("a")
            queue.enqueue("b")
            time.sleep(SETTLE_S)
            assert sub.wait(WAKE_TIMEOUT_S) is True
            assert sub.wait(0) is False

    def test_a_wake_before_wait_is_not_lost(self, store: Store, queue: Queue) -> None:
        with store.listen("jobs") as sub:
            queue.enqueue("a")
            time.sleep(SETTLE_S)
            assert sub.wait(0) is True

    def test_wait_zero_polls_and_a_timeout_returns_false(self, store: Store) -> None:
        with store.listen("jobs") as sub:
            started = time.monotonic()
            assert sub.wait(0) is False
            assert time.monotonic() - started < 1.0
            started = time.monotonic()
            assert sub.wait(0.2) is False
            assert time.monotonic() - started >= 0.15

    def test_a_waiting_subscriber_is_woken_from_another_thread(
        self, store: Store, queue: Queue
    ) -> None:
        with store.listen("jobs") as sub:
            timer = threading.Timer(0.2, lambda: queue.enqueue("later"))
            timer.start()
            try:
                started = time.monotonic()
                assert sub.wait(WAKE_TIMEOUT_S) is True
                assert time.monotonic() - started < WAKE_TIMEOUT_S
            finally:
                timer.join()

    def test_enqueue_through_another_store_wakes(
        self, store: Store, open_store: StoreFactory
    ) -> None:
        other = open_store().queue("jobs")
        with store.listen("jobs") as sub:
            other.enqueue("x")
            assert sub.wait(WAKE_TIMEOUT_S) is True

    def test_every_subscriber_is_woken(self, store: Store, open_store: StoreFactory) -> None:
        with store.listen("jobs") as one, open_store().listen("jobs") as two:
            store.queue("jobs").enqueue("x")
            assert one.wait(WAKE_TIMEOUT_S) is True
            assert two.wait(WAKE_TIMEOUT_S) is True

    def test_another_queue_does_not_wake(self, store: Store) -> None:
        with store.listen("jobs") as sub:
            store.queue("other").enqueue("x")
            assert sub.wait(QUIET_S) is False
            store.queue("jobs").enqueue("x")
            assert sub.wait(WAKE_TIMEOUT_S) is True

    def test_other_operations_do_not_wake(
        self, store: Store, queue: Queue, clock: ManualClock
    ) -> None:
        ids = queue.enqueue_many(["a", "b", "c", "d"], expires=100)
        with store.listen("jobs") as sub:
            handles = queue.claim_batch("w", 3)
            assert handles[0].retry("e", delay=0)
            assert handles[1].heartbeat()
            assert handles[1].ack()
            assert handles[2].fail()
            assert queue.cancel(ids[3])
            clock.set(at(100))
            queue.sweep_expired()
            queue.stats()
            queue.get_job(ids[0])
            assert sub.wait(QUIET_S) is False

    def test_wake_then_claim_loop_misses_nothing(self, store: Store, queue: Queue) -> None:
        """A worker's loop: claim until empty, then wait. Every job enqueued
        by another thread is claimed without a re-poll interval."""
        total = 20
        claimed: list[int] = []
        with store.listen("jobs") as sub:

            def produce() -> None:
                for i in range(total):
                    queue.enqueue(i)
                    time.sleep(0.01)

            producer = threading.Thread(target=produce)
            producer.start()
            try:
                deadline = time.monotonic() + 30
                while len(claimed) < total and time.monotonic() < deadline:
                    while (handle := queue.claim_one("w")) is not None:
                        claimed.append(handle.payload)
                        assert handle.ack()
                    if len(claimed) < total:
                        assert sub.wait(WAKE_TIMEOUT_S) is True, f"stuck after {claimed}"
            finally:
                producer.join()
        assert claimed == list(range(total))

    @pytest.mark.parametrize("closing", ["subscription", "store"])
    def test_closing_releases_a_blocked_wait_with_store_closed(
        self, store: Store, closing: str
    ) -> None:
        """docs/contract.md §3 "Closed store": ``wait`` after a close raises, including a
        wait that was already blocked when another thread closed; it is
        released promptly rather than left to its timeout."""
        sub = store.listen("jobs")
        outcome: list[object] = []

        def wait() -> None:
            try:
                outcome.append(sub.wait(60))
            except StoreClosedError as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.2)  # let the waiter block (real time: this is about blocking)
        (sub if closing == "subscription" else store).close()
        waiter.join(WAKE_TIMEOUT_S)
        assert not waiter.is_alive()
        assert len(outcome) == 1
        assert isinstance(outcome[0], StoreClosedError)

    def test_subscription_close_is_idempotent(self, store: Store, queue: Queue) -> None:
        sub = store.listen("jobs")
        sub.close()
        sub.close()
        with pytest.raises(StoreClosedError):
            sub.wait(0)
        with sub:
            pass
        with store.listen("jobs") as fresh:
            queue.enqueue("y")
            assert fresh.wait(WAKE_TIMEOUT_S) is True
