"""A worker's presence in the store: its record in the workers registry and
its throughput reports (docs/contract.md §11; docs/operations.md "The
dashboard"), as Oban's producers and River's leaders record themselves.

The worker runs :meth:`Presence.refresh` as a chore every
``registry_interval_s``: it refreshes the worker's record (the jobs it runs
now included) and reports, per queue, how many jobs ended since the last
report. A record lives ``REGISTRY_TTL_INTERVALS`` intervals past its last
refresh, so a worker killed without a word drops off the listing within
that bound; one that stops says so (:meth:`Presence.leave`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from datetime import datetime

from alkstore.contract.store import Store
from alkstore.contract.workers import MAX_WORKER_TTL_S, WorkerInfo
from alkstore.errors import ValidationError
from alkstore.logic import validation as v
from alkstore.runtime.observe import COUNTED_OUTCOMES

__all__ = [
    "DEFAULT_REGISTRY_INTERVAL_S",
    "MAX_REGISTRY_INTERVAL_S",
    "REGISTRY_TTL_INTERVALS",
    "Presence",
    "registry_interval_s",
]

log = logging.getLogger("alkstore")

#: Seconds between a worker's refreshes of its record, by default.
DEFAULT_REGISTRY_INTERVAL_S = 10.0
#: A record outlives its last refresh by this many intervals.
REGISTRY_TTL_INTERVALS = 3
#: The longest interval: its record's ttl_s stays within the registry's bound.
MAX_REGISTRY_INTERVAL_S = MAX_WORKER_TTL_S / REGISTRY_TTL_INTERVALS


def registry_interval_s(value: object) -> float | None:
    """Check a worker's ``registry_interval_s``: ``None`` (no record), or
    seconds in ``(0, MAX_REGISTRY_INTERVAL_S]`` (8 hours).

    Raises
    ------
    ValidationError
        Otherwise.
    """
    if value is None:
        return None
    interval_s = v.duration_s(value, "registry_interval_s", positive=True)
    if interval_s > MAX_REGISTRY_INTERVAL_S:
        raise ValidationError(
            f"registry_interval_s must be at most {MAX_REGISTRY_INTERVAL_S:g} s "
            f"(its record lives {REGISTRY_TTL_INTERVALS} intervals, at most a day)"
        )
    return interval_s


class Presence:
    """One worker's record and throughput reports.

    Parameters
    ----------
    store
        The store the worker claims from.
    worker_id, queues, concurrency
        The worker's.
    interval_s
        Seconds between refreshes (``> 0``); the record's ``ttl_s`` is
        :data:`REGISTRY_TTL_INTERVALS` times it.
    running
        Returns the ids of the jobs the worker runs now.
    """

    def __init__(
        self,
        store: Store,
        worker_id: str,
        queues: Sequence[str],
        concurrency: int,
        *,
        interval_s: float,
        running: Callable[[], Sequence[int]],
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        # Where it runs, read once: the record repeats them at each refresh.
        self._host = socket.gethostname()[:255] or "unknown"
        self._pid = os.getpid()
        self._queues = tuple(queues)
        self._concurrency = concurrency
        self._ttl_s = REGISTRY_TTL_INTERVALS * interval_s
        self._running = running
        self._started_at: datetime | None = None
        self._lock = threading.Lock()
        # Per queue: {"completed": n, "retried": n, "dead": n} since the last report.
        self._counts: dict[str, dict[str, int]] = {}

    def count(self, queue: str, outcome: str) -> None:
        """Count a job of ``queue`` that ended with ``outcome`` (the
        worker's: ``"succeeded"``, ``"retried"``, ``"dead"``; others are
        not throughput) for the next report."""
        counted = COUNTED_OUTCOMES.get(outcome)
        if counted is None:
            return
        with self._lock:
            counts = self._counts.setdefault(queue, {})
            counts[counted] = counts.get(counted, 0) + 1

    def refresh(self) -> None:
        """Refresh the worker's record, then report the counts since the
        last report (kept for the next one if the store refuses them).

        Raises
        ------
        StoreClosedError, EngineError
            From the store; the worker's chore loop logs and retries them.
        """
        if self._started_at is None:
            self._started_at = self._store._now()  # the store's clock, as last_seen_at
        self._store.register_worker(self._info(self._started_at))
        self._report()

    def leave(self) -> None:
        """Report the last counts and delete the worker's record: it
        stopped (errors are logged: the record then lapses on its own)."""
        try:
            self._report()
            self._store.unregister_worker(self._worker_id)
        except Exception:
            log.warning(
                "worker %s could not remove its record from the workers registry; "
                "it drops off within %.0f s",
                self._worker_id,
                self._ttl_s,
                exc_info=True,
            )

    def _info(self, started_at: datetime) -> WorkerInfo:
        return WorkerInfo(
            id=self._worker_id,
            host=self._host,
            pid=self._pid,
            queues=self._queues,
            concurrency=self._concurrency,
            started_at=started_at,
            last_seen_at=started_at,  # the store sets it
            running=tuple(self._running()),
            ttl_s=self._ttl_s,
        )

    def _report(self) -> None:
        with self._lock:
            counts, self._counts = self._counts, {}
        try:
            for queue, of_queue in list(counts.items()):
                self._store.queue(queue).record_throughput(**of_queue)
                del counts[queue]
        finally:
            if counts:  # not reported: back for the next report
                with self._lock:
                    for queue, mine in counts.items():
                        theirs = self._counts.setdefault(queue, {})
                        for kind, n in mine.items():
                            theirs[kind] = theirs.get(kind, 0) + n
