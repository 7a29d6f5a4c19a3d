"""Job ids are never reused (docs/contract.md §2), and out-of-range ids are unknown."""

from __future__ import annotations

from collections.abc import Callable

from alkstore import QueueOpts
from alkstore_contract_tests import ManualClock
from alkstore_sqlite import SqliteStore


def test_ids_are_not_reused_after_ack_cancel_or_purge(
    open_sqlite: Callable[..., SqliteStore], clock: ManualClock
) -> None:
    store = open_sqlite()
    queue = store.queue("q", QueueOpts(dead_letter_retention_s=0))
    seen: list[int] = []

    acked = queue.enqueue("a")
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.ack()
    seen.append(acked)

    cancelled = queue.enqueue("b")
    assert queue.cancel(cancelled)
    seen.append(cancelled)

    purged = queue.enqueue("c")
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.fail()
    assert queue.sweep_expired().purged == 1
    assert queue.get_job(purged) is None
    seen.append(purged)

    # The largest id is gone from both tables; a new store still goes on.
    store.close()
    again = open_sqlite().queue("q")
    fresh = again.enqueue("d")
    seen.append(fresh)
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)
    assert fresh > purged


def test_enqueue_many_ids_are_consecutive_and_in_order(store: SqliteStore) -> None:
    queue = store.queue("q")
    first = queue.enqueue(0)
    ids = queue.enqueue_many([{"i": i} for i in range(500)])
    assert ids == list(range(first + 1, first + 501))
    for i in (0, 250, 499):
        job = queue.get_job(ids[i])
        assert job is not None
        assert job.payload == {"i": i}


def test_huge_ids_are_unknown(store: SqliteStore) -> None:
    queue = store.queue("q")
    queue.enqueue(1)
    for job_id in (2**63, -(2**63) - 1, 2**200):
        assert queue.get_job(job_id) is None
        assert not queue.cancel(job_id)
        assert queue.ack_batch([job_id, 1]) == 0
