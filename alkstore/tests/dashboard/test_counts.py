"""The dashboard's queue counts (alkstore.dashboard.counts): counted once
per max age however many pages ask, recounted off the page's thread, and
forgotten by an action; on a real SQLite file, with an injected clock."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import alkstore
from alkstore.dashboard.counts import QueueCounts


class Ticks:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore:
    """Counts the stats() calls made through a real store's queues; each
    returns once ``gate`` is open (after reading the store)."""

    def __init__(self, store: alkstore.Store) -> None:
        self.store = store
        self.calls = 0
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.read = threading.Event()  # set by each stats() once it has read

    def _now(self) -> object:
        return self.store._now()

    def queue(self, name: str) -> alkstore.Queue:
        queue = self.store.queue(name)
        stats = queue.stats

        def counted() -> alkstore.QueueStats:
            with self.lock:
                self.calls += 1
            found = stats()
            self.read.set()
            assert self.gate.wait(10), "the test never opened the gate"
            return found

        queue.stats = counted  # type: ignore[method-assign]
        return queue


def _wait_for(predicate: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_counts_are_read_once_per_max_age_and_recounted_in_the_background(
    tmp_path: Path,
) -> None:
    with alkstore.open(f"sqlite:///{tmp_path / 'c.db'}") as store:
        queue = store.queue("q")
        queue.enqueue_many(["a", "b"])
        counting, ticks = CountingStore(store), Ticks()
        counts = QueueCounts(counting, max_age_s=5.0, monotonic=ticks)  # type: ignore[arg-type]

        first = counts.get("q")
        assert (first.stats.pending, first.completed, counting.calls) == (2, 0, 1)
        queue.enqueue("c")
        ticks.now += 4.9  # younger than max_age_s: the same counts, no read
        assert counts.get("q") == first
        assert counting.calls == 1

        ticks.now += 0.1  # now old: the old counts at once, one recount started
        assert counts.get("q") == first
        assert counts.get("q") == first  # a second page starts no second recount
        _wait_for(lambda: counts.get("q").stats.pending == 3, "the recount")
        assert counting.calls == 2
        assert counts.get("q").taken == ticks.now


def test_an_action_forgets_the_counts_so_the_next_page_counts_now(tmp_path: Path) -> None:
    with alkstore.open(f"sqlite:///{tmp_path / 'c.db'}") as store:
        queue = store.queue("q")
        queue.enqueue("a")
        counts = QueueCounts(store, max_age_s=3600.0, monotonic=Ticks())
        assert counts.get("q").stats.pending == 1
        queue.enqueue("b")
        assert counts.get("q").stats.pending == 1  # as of the first count
        counts.forget("q")
        assert counts.get("q").stats.pending == 2


def test_pages_asking_at_once_for_a_queue_never_counted_share_one_count(
    tmp_path: Path,
) -> None:
    with alkstore.open(f"sqlite:///{tmp_path / 'c.db'}") as store:
        store.queue("q").enqueue_many(["a", "b"])
        counting = CountingStore(store)
        counts = QueueCounts(counting, max_age_s=5.0, monotonic=Ticks())  # type: ignore[arg-type]
        counting.gate.clear()
        pages = 8
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(counts.get("q").stats.pending))
            for _ in range(pages)
        ]
        for thread in threads:
            thread.start()
        _wait_for(counting.read.is_set, "the first count to read the store")
        counting.gate.set()
        for thread in threads:
            thread.join(10)
        assert results == [2] * pages
        assert counting.calls == 1


def test_a_recount_that_read_before_an_action_is_not_kept_after_it(tmp_path: Path) -> None:
    with alkstore.open(f"sqlite:///{tmp_path / 'c.db'}") as store:
        queue = store.queue("q")
        first, _ = queue.enqueue_many(["a", "b"])
        counting, ticks = CountingStore(store), Ticks()
        counts = QueueCounts(counting, max_age_s=5.0, monotonic=ticks)  # type: ignore[arg-type]
        assert counts.get("q").stats.pending == 2
        ticks.now += 5
        counting.gate.clear()
        counting.read.clear()
        assert counts.get("q").stats.pending == 2  # stale; a recount starts
        _wait_for(counting.read.is_set, "the recount to read the store")
        assert queue.cancel(first)  # the action, after the recount read
        counts.forget("q")
        counting.gate.set()
        _wait_for(
            lambda: not any(t.name == "alkstore-dashboard-count-q" for t in threading.enumerate()),
            "the recount to end",
        )
        assert counts.get("q").stats.pending == 1  # counted afresh: the recount's 2 was dropped
        assert counting.calls == 3  # the first count, the recount, the fresh count
