"""The outbox's relay against a real SQLite file, in real time: a slow
``send`` must not let the batch lapse (docs/outbox.md). The outbox's
semantics on every engine are the contract's ``OutboxTests``."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import alkstore
from alkstore import Outbox, QueueOpts, Store, ValidationError


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with alkstore.open(f"sqlite:///{tmp_path / 'outbox.db'}") as opened:
        yield opened


def test_a_slow_send_does_not_hand_the_batch_out_again(store: Store) -> None:
    # The second send ends 0.7 s after the claim, past the 0.6 s visibility
    # timeout, with no send on its own slower than half of it: only the
    # relay's background heartbeats keep the claims alive.
    queue = store.queue("outbox", QueueOpts(visibility_timeout_s=0.6))
    outbox = Outbox(queue)
    queue.enqueue_many([1, 2, 3])
    sent: Counter[int] = Counter()
    seconds = {1: 0.25, 2: 0.45, 3: 0.0}

    def slow_send(message: int) -> None:
        sent[message] += 1
        time.sleep(seconds[message])

    assert outbox.relay_once(slow_send, worker_id="relay") == 3
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
