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
from datetime import datetime
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


class _Flight:
    """One count of a queue under way: the forget generation it started in,
    and its end, which pages waiting for a first count wait on."""

    __slots__ = ("done", "generation")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.done = threading.Event()


class QueueCounts:
    """Per queue, the last :class:`Counted` and at most one count in flight.

    Parameters
    ----------
    store
        The store counted.
    max_age_s
        Counts older than this are recounted in the background, ``> 0``.
    monotonic
        The clock ages are read from, seconds (tests give their own).
    wait_s
        How long a page waits for another page's first count of a queue
        before counting it itself, seconds.
    """

    def __init__(
        self,
        store: Store,
        max_age_s: float,
        monotonic: Callable[[], float] = time.monotonic,
        wait_s: float = 30.0,
    ) -> None:
        self._store = store
        self._max_age_s = max_age_s
        self._monotonic = monotonic
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._counted: dict[str, Counted] = {}
        self._flights: dict[str, _Flight] = {}
        # Per queue, how many times forget() ran: a count that started
        # before the last forget is not kept (it may predate the action).
        self._generations: dict[str, int] = {}

    def get(self, name: str) -> Counted:
        """The counts of queue ``name``: the last ones taken (starting a
        recount when they are older than ``max_age_s``), or, for a queue
        not counted yet, counted now (one count, whatever the number of
        pages asking at once).

        Raises
        ------
        StoreClosedError, EngineError
            From a count taken now.
        """
        with self._lock:
            counted = self._counted.get(name)
            if counted is not None and self._monotonic() - counted.taken < self._max_age_s:
                return counted
            flight = self._flights.get(name)
            mine = flight is None
            if flight is None:
                flight = self._flights[name] = _Flight(self._generations.get(name, 0))
        if counted is not None:  # stale: shown while one recount runs
            if mine:
                threading.Thread(
                    target=self._recount,
                    args=(name, flight),
                    name=f"alkstore-dashboard-count-{name}",
                    daemon=True,
                ).start()
            return counted
        if mine:
            return self._fly(name, flight)
        flight.done.wait(self._wait_s)
        with self._lock:
            counted = self._counted.get(name)
        return counted if counted is not None else self._count(name)

    def forget(self, name: str) -> None:
        """Drop the counts of ``name``, and any count under way: the next
        :meth:`get` counts it afresh."""
        with self._lock:
            self._counted.pop(name, None)
            self._generations[name] = self._generations.get(name, 0) + 1
            flight = self._flights.pop(name, None)
        if flight is not None:
            flight.done.set()  # its waiters count for themselves

    def _count(self, name: str) -> Counted:
        queue = self._store.queue(name)
        at, taken = self._store._now(), self._monotonic()
        return Counted(queue.stats(), queue.completed_count(), queue.lapsed_claims(), at, taken)

    def _fly(self, name: str, flight: _Flight) -> Counted:
        """Count ``name`` for ``flight``; keep the counts unless a forget
        came meanwhile."""
        try:
            counted = self._count(name)
            with self._lock:
                if self._generations.get(name, 0) == flight.generation:
                    self._counted[name] = counted
            return counted
        finally:
            with self._lock:
                if self._flights.get(name) is flight:
                    del self._flights[name]
            flight.done.set()

    def _recount(self, name: str, flight: _Flight) -> None:
        try:
            self._fly(name, flight)
        except Exception:
            # The page keeps showing the last counts, with their age.
            log.warning("could not recount queue %r", name, exc_info=True)
