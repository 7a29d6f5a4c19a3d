# WARNING: generated from sweeper_async.py by tools/async_to_sync.py.
# Do not edit: change sweeper_async.py, then run `python tools/async_to_sync.py`.
"""The :class:`Sweeper`: ``sweep_expired`` over every queue of a store, by one
process at a time, on a cadence (docs/operations.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from alkstore.contract.job import SweepResult
from alkstore.contract.store import check_store
from alkstore.errors import ValidationError
from alkstore.logic import validation as v
from alkstore.logic.options import QueueOpts

if TYPE_CHECKING:
    from alkstore.contract.store import Store

__all__ = ["DEFAULT_SWEEP_INTERVAL_S", "SWEEP_TASK", "Sweeper"]

log = logging.getLogger("alkstore.sweeper")

#: Seconds between sweeps of a store, whoever runs them.
DEFAULT_SWEEP_INTERVAL_S = 60.0
#: The maintenance task name the sweep's turn is recorded under.
SWEEP_TASK = "sweep_expired"


class Sweeper:
    """Runs :meth:`Queue.sweep_expired` on every queue of a store, once per
    ``interval_s`` across all the processes that run sweepers, and never two
    at once (docs/operations.md "Sweeping").

    Each :meth:`run_once` asks the store for the sweep's turn: PostgreSQL
    takes an advisory lock and SQLite a lock file beside the database, and
    the turn is given only when the durable record of the last sweep is
    ``interval_s`` old.
    Workers run one by default (``Worker(sweep_interval_s=...)``).

    Parameters
    ----------
    store
        The store to sweep.
    interval_s
        Seconds between sweeps, ``> 0`` (default 60).
    retention
        Dead-letter retention per queue name (seconds or ``timedelta``, or
        ``None`` to keep), as ``QueueOpts.dead_letter_retention_s``; queues
        not named keep their dead jobs.
    keep_completed
        Completed-job retention per queue name (seconds or ``timedelta``),
        as ``QueueOpts.keep_completed_s``: completed jobs that finished
        that long ago are purged (docs/contract.md §3 "Completed jobs");
        queues not named keep theirs.

    Raises
    ------
    ValidationError
        For an interval, queue name or retention outside its rule.
    """

    def __init__(
        self,
        store: Store,
        *,
        interval_s: object = DEFAULT_SWEEP_INTERVAL_S,
        retention: Mapping[str, object] | None = None,
        keep_completed: Mapping[str, object] | None = None,
    ) -> None:
        self._store = check_store(store, "Sweeper")
        dead = _retention_map(retention, "retention")
        completed = _retention_map(keep_completed, "keep_completed")
        self._interval_s = v.duration_s(interval_s, "interval_s", positive=True)
        self._opts = {
            name: QueueOpts(
                dead_letter_retention_s=dead.get(name), keep_completed_s=completed.get(name)
            )
            for name in {**dead, **completed}
        }

    def __repr__(self) -> str:
        return f"<Sweeper of {self._store!r} every {self._interval_s:g}s>"

    @property
    def interval_s(self) -> float:
        """Seconds between sweeps."""
        return self._interval_s

    def run_once(self) -> dict[str, SweepResult] | None:
        """Sweep every queue if it is this process's turn.

        Returns
        -------
        dict[str, SweepResult] | None
            Per queue name, what its sweep did; ``None`` when another
            process holds the turn or the last sweep is younger than the
            interval.

        Raises
        ------
        StoreClosedError, EngineError
        """
        store = self._store
        store._check_open()
        with store._maintenance_turn(SWEEP_TASK, self._interval_s) as mine:
            if not mine:
                return None
            results: dict[str, SweepResult] = {}
            for name in store.queue_names():
                queue = store.queue(name, self._opts.get(name))
                result = results[name] = queue.sweep_expired()
                if result.expired or result.purged:
                    log.info(
                        "queue %r: %d expired job(s) dead-lettered, %d dead or completed job(s) "
                        "purged",
                        name,
                        result.expired,
                        result.purged,
                    )
            return results


def _retention_map(given: Mapping[str, object] | None, what: str) -> dict[str, float]:
    """A per-queue retention argument, checked: queue name to seconds
    (``None`` entries dropped: kept forever)."""
    if given is not None and not isinstance(given, Mapping):
        raise ValidationError(
            f"{what} must map queue names to seconds (a dict), not {type(given).__name__}"
        )
    return {
        v.queue_name(name): v.duration_s(seconds, f"{what} of {name!r}")
        for name, seconds in (given or {}).items()
        if seconds is not None
    }
