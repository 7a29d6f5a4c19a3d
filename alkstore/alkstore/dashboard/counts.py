"""The queues' counts as the dashboard shows them: read from the store at
most once per ``max_age_s`` per queue, however many pages ask, and never
making a page wait for a recount it can do without.

``Queue.stats()`` counts index ranges (docs/contract.md §3 "stats()"): a
queue of a million waiting jobs takes a couple of hundred milliseconds to
count on either engine. Ten open dashboards refreshing every few seconds
would run that query ten times as often as anyone can read its answer. So
a page gets the last counts taken, with the instant they were taken (the
page says "as of"), and when they are older than ``max_age_s`` one
recount starts on a thread of its own; the next refresh shows it (Oban
Web and Sidekiq's dashboard show periodic figures the same way). Only a
queue never counted yet is counted while the page waits. An action on a
queue (requeue, purge, ...) forgets its counts, so the page it leads to
counts again and shows its effect.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple

from alkstore.contract.job import QueueStats
from alkstore.contract.store import Store

__all__ = ["Counted", "QueueCounts"]

log = logging.getLogger("alkstore.dashboard")


class Counted(NamedTuple):
    """One queue's counts and when they were taken."""

    stats: QueueStats
    completed: int
    lapsed: int  # of stats.processing: claims past their deadline
    at: datetime  # UTC, when the count was taken
    taken: float  # monotonic, for its age


class QueueCounts:
    """Per queue, the last :class:`Counted` and at most one recount in flight.

    Parameters
    ----------
    store
        The store counted.
    max_age_s
        Counts older than this are recounted in the background, ``> 0``.
    monotonic
        The clock ages are read from, seconds (tests give their own).
    """

    def __init__(
        self, store: Store, max_age_s: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._max_age_s = max_age_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._counted: dict[str, Counted] = {}
        self._recounting: set[str] = set()

    def get(self, name: str) -> Counted:
        """The counts of queue ``name``: the last ones taken (starting a
        recount when they are older than ``max_age_s``), or, for a queue
        not counted yet, counted now.

        Raises
        ------
        StoreClosedError, EngineError
            From a count taken now.
        """
        with self._lock:
            counted = self._counted.get(name)
            stale = counted is None or self._monotonic() - counted.taken >= self._max_age_s
            start = counted is not None and stale and name not in self._recounting
            if start:
                self._recounting.add(name)
        if counted is None:
            return self._count(name)
        if start:
            threading.Thread(
                target=self._recount, args=(name,), name=f"alkstore-dashboard-count-{name}"
            ).start()
        return counted

    def forget(self, name: str) -> None:
        """Drop the counts of ``name``: the next :meth:`get` counts it now."""
        with self._lock:
            self._counted.pop(name, None)

    def _count(self, name: str) -> Counted:
        queue = self._store.queue(name)
        at, taken = datetime.now(UTC), self._monotonic()
        counted = Counted(queue.stats(), queue.completed_count(), queue.lapsed_claims(), at, taken)
        with self._lock:
            current = self._counted.get(name)
            if current is None or current.taken < taken:
                self._counted[name] = counted
        return counted

    def _recount(self, name: str) -> None:
        try:
            self._count(name)
        except Exception:
            # The page keeps showing the last counts, with their age.
            log.warning("could not recount queue %r", name, exc_info=True)
        finally:
            with self._lock:
                self._recounting.discard(name)
