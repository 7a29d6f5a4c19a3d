# WARNING: generated from scheduler_async.py by tools/async_to_sync.py.
# Do not edit: change scheduler_async.py, then run `python tools/async_to_sync.py`.
"""The :class:`Scheduler`: turns due schedule boundaries into jobs, exactly
once per boundary however many processes tick (docs/schedules.md)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from alkstore._acompat import Event, off_loop, wait_event
from alkstore.contract.schedule import UnreadableSchedule
from alkstore.contract.store import check_store
from alkstore.errors import EngineError, StoreClosedError, ValidationError
from alkstore.logic import validation as v
from alkstore.logic.codec import EncodedPayload
from alkstore.logic.cron import parse_schedule
from alkstore.logic.resolution import EnqueueOptions, resolve

if TYPE_CHECKING:
    from alkstore.contract.schedule import Schedule
    from alkstore.contract.store import Store

__all__ = ["DEFAULT_MISFIRE_GRACE_S", "DEFAULT_TICK_INTERVAL_S", "Scheduler"]

log = logging.getLogger("alkstore.scheduler")

#: How late a boundary may be noticed and still fire under ``catch_up="skip"``.
DEFAULT_MISFIRE_GRACE_S = 60.0
#: Seconds between ticks in :meth:`Scheduler.run` and in workers.
DEFAULT_TICK_INTERVAL_S = 1.0


class Scheduler:
    """Enqueues the jobs of a store's schedules as their boundaries come due
    (docs/schedules.md).

    Any number of schedulers may tick one store at once, in any processes or
    hosts: each boundary is fired by one conditional update of the schedule
    row in the same transaction as its job's insert, so it enqueues exactly
    one job (a durable per-boundary record, not leader election). Workers
    tick by default; ``alkstore scheduler`` runs one alone.

    Parameters
    ----------
    store
        The store whose schedules to run.
    misfire_grace_s
        Seconds, ``>= 0`` (default 60): under ``catch_up="skip"``, a
        boundary noticed later than this after it passed is skipped, not
        fired. ``catch_up="latest"`` ignores it and fires the latest missed
        boundary once, as APScheduler's ``coalesce`` does.

    Raises
    ------
    ValidationError
        For a ``misfire_grace_s`` outside its rule.
    """

    def __init__(self, store: Store, *, misfire_grace_s: object = DEFAULT_MISFIRE_GRACE_S) -> None:
        self._store = check_store(store, "Scheduler")
        self._grace = timedelta(seconds=v.duration_s(misfire_grace_s, "misfire_grace_s"))
        # The schedules reported as unable to fire: name -> revision.
        self._failing: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<Scheduler of {self._store!r}>"

    def tick(self) -> list[int]:
        """Fire every schedule whose next boundary is due at the store's clock.

        For each due schedule: its latest boundary at or before now is fired
        (or, under ``catch_up="skip"`` and older than the grace, skipped) and
        its ``next_run_at`` moves to the first boundary after now, so
        boundaries missed during an outage fire at most once together. The
        job is due at its boundary (``run_at``), so a late one sorts first.

        One schedule that cannot fire stops no other (regression case 014): a
        stored row this version cannot read, a spec or zone this host
        cannot evaluate, or a fire that fails (its job's insert refused, a
        lock held too long) skips that schedule alone, which keeps its
        ``next_run_at``, so the next tick tries it again and it fires its
        latest boundary once it can. Each such schedule is logged at ERROR
        once per revision, with its name and the reason, and at INFO when it
        fires again (docs/schedules.md "When a schedule cannot fire").

        Returns
        -------
        list[int]
            The ids of the jobs this call enqueued, in firing order; ``[]``
            when nothing was due or other ticks fired it first.

        Raises
        ------
        StoreClosedError
            When the store is closed, before or during the tick.
        EngineError
            When the due schedules cannot be listed, or a fire fails with a
            ``permanent`` error (a read-only or dropped database fails every
            schedule alike). Schedules fired before it stay fired.
        """
        store = self._store
        store._check_open()
        now = store._now()
        fired: list[int] = []
        for item in store._list_schedules(now):
            if isinstance(item, UnreadableSchedule):
                self._cannot_fire(item.name, item.revision, item.reason)
                continue
            try:
                job_id = self._tick_one(item, now)
            except StoreClosedError:
                raise
            except EngineError as exc:
                if exc.permanent:
                    raise
                self._cannot_fire(item.name, item.revision, str(exc))
                continue
            except ValidationError as exc:
                self._cannot_fire(item.name, item.revision, str(exc))
                continue
            except Exception as exc:  # one schedule's fault, whatever it is
                self._cannot_fire(item.name, item.revision, repr(exc), exc)
                continue
            self._can_fire(item)
            if job_id is not None:
                fired.append(job_id)
        return fired

    def _tick_one(self, schedule: Schedule, now: datetime) -> int | None:
        """Fire or skip one due schedule; the job id when it fired."""
        # A zone's first use reads its data: not on an event loop.
        spec = off_loop(parse_schedule, schedule.spec, schedule.timezone)
        boundary = spec.latest_at_or_before(now) or schedule.next_run_at
        boundary = max(boundary, schedule.next_run_at)
        next_run_at = spec.next_after(now)
        if schedule.catch_up == "skip" and now - boundary > self._grace:
            if self._store._skip_schedule(schedule, next_run_at):
                log.info(
                    "schedule %r: boundary %s missed by more than %s, skipped",
                    schedule.name,
                    boundary.isoformat(),
                    self._grace,
                )
            return None
        return self._fire(schedule, now, boundary, next_run_at)

    def _cannot_fire(
        self, name: str, revision: int, reason: str, exc: BaseException | None = None
    ) -> None:
        """Report a schedule that cannot fire: at ERROR the first time for
        its revision, at DEBUG after that."""
        if self._failing.get(name) == revision:
            log.debug("schedule %r (revision %d) still cannot fire: %s", name, revision, reason)
            return
        self._failing[name] = revision
        log.error(
            "schedule %r (revision %d) cannot fire: %s; skipped, and tried again on "
            "every tick without logging again until it fires or is saved anew",
            name,
            revision,
            reason,
            exc_info=exc,
        )

    def _can_fire(self, schedule: Schedule) -> None:
        """A schedule's turn ended without an error: if it was failing, say
        that it can fire again, and report its next failure afresh."""
        if self._failing.pop(schedule.name, None) is not None:
            log.info("schedule %r (revision %d) can fire again", schedule.name, schedule.revision)

    def _fire(
        self, schedule: Schedule, now: datetime, boundary: datetime, next_run_at: datetime
    ) -> int | None:
        store = self._store
        resolved = resolve(
            now,
            schedule.queue_opts,
            EnqueueOptions(
                run_at=boundary,
                priority=schedule.priority,
                max_attempts=schedule.max_attempts,
                expires_s=schedule.expires_s,
            ),
        )
        job_id = store._fire_schedule(
            schedule,
            boundary,
            next_run_at,
            resolved,
            EncodedPayload(schedule.payload_bytes, schedule.content_type),
        )
        if job_id is not None:
            log.info(
                "schedule %r fired boundary %s: job %d in queue %r",
                schedule.name,
                boundary,
                job_id,
                schedule.queue,
            )
        return job_id

    def run(
        self,
        *,
        interval_s: object = DEFAULT_TICK_INTERVAL_S,
        stop: Event | None = None,
    ) -> None:
        """Tick every ``interval_s`` seconds (``> 0``, default 1) until
        ``stop`` is set; a failed tick is logged and retried next interval.

        Raises
        ------
        ValidationError
            For an ``interval_s`` outside its rule.
        StoreClosedError
            When the store is closed.
        EngineError
            A permanent one (``EngineError.permanent``: the database cannot
            be written, the schema is gone): retrying cannot help, so
            ``alkstore scheduler`` exits non-zero on it, as a worker does.
        """
        interval = v.duration_s(interval_s, "interval_s", positive=True)
        stop = stop or Event()
        while not stop.is_set():
            try:
                self.tick()
            except ValidationError:
                raise
            except Exception as exc:
                if self._store.closed or (isinstance(exc, EngineError) and exc.permanent):
                    raise
                log.warning("scheduler tick failed: %s; retrying", exc, exc_info=True)
            wait_event(stop, interval)
