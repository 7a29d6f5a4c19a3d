# WARNING: generated from store_async.py by tools/async_to_sync.py.
# Do not edit: change store_async.py, then run `python tools/async_to_sync.py`.
"""The :class:`Store` ABC: one database, its queues and subscriptions."""

from __future__ import annotations

import abc
import logging
import random
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING

from alkstore.contract.schedule import CATCH_UP_POLICIES, Schedule, UnreadableSchedule, same_jobs
from alkstore.contract.workers import WorkerInfo, check_worker_info
from alkstore.errors import StoreClosedError, ValidationError
from alkstore.logic import validation as v
from alkstore.logic.backoff import Rng
from alkstore.logic.callbacks import check_runs_when_called
from alkstore.logic.clock import Clock, check_clock, read_clock
from alkstore.logic.codec import EncodedPayload, encode_payload
from alkstore.logic.options import QueueOpts
from alkstore.logic.resolution import Resolved
from alkstore.logic.resolution import enqueue_options as check_enqueue_options

if TYPE_CHECKING:
    from alkstore._acompat import Event
    from alkstore.contract.queue import Queue
    from alkstore.contract.subscription import Subscription
    from alkstore.logic.cron import ScheduleSpec

__all__ = ["Store", "check_store"]

log = logging.getLogger("alkstore")

#: How long a second :meth:`Store.close` waits for the one under way,
#: seconds (an engine's own close is bounded by its timeouts, well within).
CLOSE_WAIT_S = 60.0


class Store(abc.ABC):
    """A connection to one alkstore database (docs/contract.md §2).

    Obtain one with :func:`alkstore.open`. A store, its queues and its
    subscriptions may be used from many threads at once. It is a context
    manager: leaving the ``with`` block closes it.

    Engine authors implement the underscore primitives (:meth:`_open_queue`,
    :meth:`_open_subscription`, :meth:`_migrate`, :meth:`_close`, and
    optionally :meth:`_engine_now` and :meth:`_schema_version`); the public
    methods here do the closed check and the argument validation for every
    engine.

    Parameters
    ----------
    clock
        ``None`` for the engine's own time source, or a callable returning an
        aware ``datetime`` from which every instant is then taken (docs/contract.md §3
        "Time").
    rng
        The random source for backoff jitter (an object with
        ``randint(a, b)``); default a fresh ``random.Random``.

    Raises
    ------
    ValidationError
        For a clock that is not callable, is ``async def`` or returns a naive
        datetime, or an ``rng`` without a plain ``randint``.
    """

    def __init__(self, *, clock: object = None, rng: object = None) -> None:
        self._clock: Clock | None = check_clock(clock)
        if rng is None:
            rng = random.Random()
        if not callable(getattr(rng, "randint", None)):
            raise ValidationError("rng must have a randint(a, b) method, like random.Random")
        check_runs_when_called(rng.randint, "rng.randint")  # type: ignore[attr-defined]
        self._rng: Rng = rng  # type: ignore[assignment]
        self._closed = False
        self._close_lock = threading.Lock()
        self._close_done: Event | None = None  # set when the first close() ends

    # -- public surface ------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    @property
    def rng(self) -> Rng:
        """The random source used for backoff jitter."""
        return self._rng

    def queue(self, name: str, opts: QueueOpts | None = None) -> Queue:
        """Return a handle on the queue ``name``; no I/O (docs/contract.md §2).

        Queues are names, not registered objects: every handle on a name
        sees the same jobs; ``opts`` are stamped on the rows this handle
        enqueues.

        Raises
        ------
        StoreClosedError
            If the store is closed.
        ValidationError
            For a name outside docs/contract.md §3's rule or ``opts`` not a ``QueueOpts``.
        """
        self._check_open()
        v.queue_name(name)
        if opts is None:
            opts = QueueOpts()
        elif not isinstance(opts, QueueOpts):
            raise ValidationError(f"opts must be a QueueOpts, not {type(opts).__name__}")
        return self._open_queue(name, opts)

    def listen(self, queue_name: str) -> Subscription:
        """Subscribe to wakes of the queue ``queue_name`` (docs/contract.md §3 "Wake").

        Raises
        ------
        StoreClosedError
            If the store is closed.
        ValidationError
            For a name outside docs/contract.md §3's rule.
        """
        self._check_open()
        v.queue_name(queue_name)
        return self._open_subscription(queue_name)

    def migrate(self) -> None:
        """Bring the schema to this code's version; idempotent and safe from
        many processes at once (docs/contract.md §3 "Schema").

        Raises
        ------
        StoreClosedError
            If the store is closed.
        SchemaVersionError
            If the database's schema is newer than this code.
        """
        self._check_open()
        self._migrate()

    def queue_names(self) -> list[str]:
        """The names of the queues that hold live or dead jobs or are paused,
        sorted; index-driven, so cheap however many jobs wait.

        Raises
        ------
        StoreClosedError
            If the store is closed.
        EngineError
            If the database fails.
        """
        self._check_open()
        return self._queue_names()

    # -- schedules (docs/schedules.md) ---------------------------------------

    def schedule(
        self,
        name: str,
        spec: str,
        queue: str | Queue,
        payload: object,
        *,
        timezone: str = "UTC",
        catch_up: str = "latest",
        **enqueue_options: object,
    ) -> Schedule:
        """Create or replace the schedule ``name``: on every boundary of
        ``spec`` a :class:`Scheduler` tick enqueues ``payload`` into
        ``queue`` exactly once, whoever ticks (docs/schedules.md).

        Parameters
        ----------
        name
            Unique within the store; the rule of a queue name. Saving an
            existing name with the same definition changes nothing (startup
            code may save its schedules every time); with another one it
            replaces it, and boundaries count from now again.
        spec
            A 5-field cron expression read in ``timezone`` (Debian cron's
            rules, DST included), an alias (``@hourly``, ``@daily``,
            ``@weekly``, ``@monthly``, ``@yearly``) or ``@every <duration>``
            (``30s``, ``5m``, ``1h30m``, ``1d``; boundaries at multiples of
            the interval since the Unix epoch).
        queue
            A queue name, or a :class:`Queue` whose ``opts`` are then
            stamped on each job (otherwise the default ``QueueOpts``).
        payload
            The job payload, encoded now (docs/contract.md §3 "Payload").
        timezone
            An IANA zone name; default ``"UTC"``.
        catch_up
            ``"latest"`` (default): after an outage the latest missed
            boundary fires once; ``"skip"``: boundaries older than the
            scheduler's misfire grace do not fire.
        enqueue_options
            ``priority``, ``max_attempts``, ``expires`` as for
            :meth:`Queue.enqueue`; each job is due at its boundary, so
            ``delay`` and ``run_at`` are refused.

        Returns
        -------
        Schedule
            The stored schedule, its ``next_run_at`` the first boundary
            after now.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
            ``ValidationError`` for a bad name, spec, zone, queue, payload,
            policy or option, before anything is written.
        """
        from alkstore._acompat import off_loop
        from alkstore.contract.queue import Queue

        self._check_open()
        v.queue_name(name, "schedule name")
        # The first use imports the cron module and reads the zone's data:
        # not on an event loop.
        parsed = off_loop(_parse_schedule, spec, timezone)
        if isinstance(queue, Queue):
            if queue.store is not self:
                raise ValidationError("queue must be a queue of this store")
            queue_name, opts = queue.name, queue.opts
        else:
            queue_name, opts = v.queue_name(queue), QueueOpts()
        refused = sorted({"delay", "run_at"} & set(enqueue_options))
        if refused:
            raise ValidationError(
                f"a scheduled job is due at its boundary; {' and '.join(refused)} "
                "cannot be set on a schedule"
            )
        unknown = sorted(set(enqueue_options) - {"priority", "max_attempts", "expires"})
        if unknown:
            raise ValidationError(
                f"unknown schedule option(s) {', '.join(unknown)}; accepted: "
                "timezone, catch_up, priority, max_attempts, expires"
            )
        options = check_enqueue_options(**enqueue_options)
        if catch_up not in CATCH_UP_POLICIES:
            raise ValidationError(
                f"catch_up must be one of {', '.join(map(repr, CATCH_UP_POLICIES))}, "
                f"got {catch_up!r}"
            )
        encoded = encode_payload(payload)
        now = self._now()
        schedule = Schedule(
            name=name,
            spec=parsed.spec,
            timezone=parsed.timezone,
            queue=queue_name,
            payload_bytes=encoded.data,
            content_type=encoded.content_type,
            priority=options.priority,
            max_attempts=options.max_attempts,
            expires_s=options.expires_s,
            queue_opts=opts,
            catch_up=catch_up,  # checked above
            revision=0,
            created_at=now,
            next_run_at=parsed.next_after(now),
            last_run_at=None,
            last_job_id=None,
        )
        for existing in self._list_schedules(None):
            # An unreadable row of that name is replaced like any other.
            if (
                isinstance(existing, Schedule)
                and existing.name == name
                and same_jobs(existing, schedule)
            ):
                return existing  # the same definition: keep its boundaries
        return self._put_schedule(schedule)

    def unschedule(self, name: str) -> bool:
        """Delete the schedule ``name``, readable or not; jobs it already
        enqueued stay.

        Returns
        -------
        bool
            ``False`` when there is no such schedule.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._check_open()
        return self._delete_schedule(v.queue_name(name, "schedule name"))

    def schedules(self) -> list[Schedule]:
        """Every schedule of the store that this version can read, sorted
        by name; :meth:`unreadable_schedules` names the others.

        Raises
        ------
        StoreClosedError, EngineError
        """
        self._check_open()
        return [s for s in self._list_schedules(None) if isinstance(s, Schedule)]

    def unreadable_schedules(self) -> list[UnreadableSchedule]:
        """The stored schedules this version cannot fire as they were
        written, sorted by name, each with the reason: an option it does not
        know (saved by a newer release), a value outside its rules, a spec
        or zone this host cannot evaluate, a payload it cannot decode
        (docs/schedules.md "When a schedule cannot fire"; docs/decisions.md
        D27). Ticks skip them; :meth:`unschedule` deletes one and
        :meth:`schedule` replaces one.

        Raises
        ------
        StoreClosedError, EngineError
        """
        self._check_open()
        return [s for s in self._list_schedules(None) if isinstance(s, UnreadableSchedule)]

    # -- the workers registry (docs/contract.md §11) --------------------------

    def register_worker(self, info: WorkerInfo) -> WorkerInfo:
        """Record a worker, or refresh its record (Oban's and River's
        producer records; docs/contract.md §11 "Workers registry"). The
        worker runtime calls it when it starts and then with every
        heartbeat; :meth:`workers` lists it until ``info.ttl_s`` seconds
        pass without a refresh. ``last_seen_at`` is set to now by the
        store's clock, whatever ``info`` says; the other fields are stored
        as given (a refresh replaces them). Records silent past their own
        ``ttl_s`` are deleted on the way.

        Returns
        -------
        WorkerInfo
            What was stored (``running`` sorted).

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._check_open()
        stored = replace(check_worker_info(info), last_seen_at=self._now())
        self._put_worker(stored)
        return stored

    def unregister_worker(self, worker_id: str) -> bool:
        """Delete a worker's record: a worker stopping says it left rather
        than going silent.

        Returns
        -------
        bool
            ``False`` when there was no such record.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._check_open()
        return self._delete_worker(v.worker_id(worker_id))

    def workers(self) -> list[WorkerInfo]:
        """The live workers: those whose record was refreshed less than its
        ``ttl_s`` ago by the store's clock, ordered by ``started_at`` then
        id (docs/contract.md §11 "Workers registry").

        Raises
        ------
        StoreClosedError, EngineError
        """
        self._check_open()
        return self._list_workers(self._now())

    def close(self) -> None:
        """Release the store's connections. Idempotent; never raises. A
        call while another is closing the store returns once that one has
        (or after :data:`CLOSE_WAIT_S` seconds, with a warning)."""
        # Imported here, not at the top: `import alkstore` imports the store
        # modules of both faces, and must import no asyncio.
        from alkstore._acompat import Event, wait_event

        with self._close_lock:
            closing = self._closed
            self._closed = True
            if not closing:
                self._close_done = Event()
            done = self._close_done
        if closing:
            # None: closed without close() (a failed opening), nothing to wait for.
            if done is not None and not wait_event(done, CLOSE_WAIT_S):
                log.warning("%r: the close under way did not end within %g s", self, CLOSE_WAIT_S)
            return
        try:
            self._close()
        except Exception:
            log.warning("error while closing %r", self, exc_info=True)
        finally:
            assert done is not None
            done.set()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- for engines ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    def _now(self) -> datetime:
        """The current instant, UTC: the injected clock's, else the engine's."""
        if self._clock is not None:
            return read_clock(self._clock)
        return self._engine_now()

    def _engine_now(self) -> datetime:
        """The engine's own time source; default the system clock."""
        return datetime.now(UTC)

    @property
    def _clock_injected(self) -> bool:
        return self._clock is not None

    @abc.abstractmethod
    def _open_queue(self, name: str, opts: QueueOpts) -> Queue:
        """Return the engine's :class:`Queue` for a checked name; no I/O."""

    @abc.abstractmethod
    def _open_subscription(self, queue_name: str) -> Subscription:
        """Return the engine's :class:`Subscription` for a checked name."""

    @abc.abstractmethod
    def _migrate(self) -> None:
        """Create or upgrade the schema; idempotent, multi-process safe."""

    def _schema_version(self) -> int | None:
        """The schema version stored in the database, read now; ``None``
        when the engine does not say (the default). Optional: ``alkstore
        migrate`` reports with it what it did."""
        return None

    @abc.abstractmethod
    def _close(self) -> None:
        """Release connections; called once."""

    @abc.abstractmethod
    def _queue_names(self) -> list[str]:
        """Sorted distinct names of queues with live or dead rows or a pause
        record, found through indexes (never a scan of the job tables)."""

    @abc.abstractmethod
    def _put_schedule(self, schedule: Schedule) -> Schedule:
        """Insert ``schedule`` (revision 1) or replace the one of that name
        (revision + 1, ``last_run_at``/``last_job_id`` from ``schedule``,
        i.e. cleared); return what is stored."""

    @abc.abstractmethod
    def _delete_schedule(self, name: str) -> bool:
        """Delete a schedule; ``True`` if one was deleted."""

    @abc.abstractmethod
    def _list_schedules(self, due_at: datetime | None) -> Sequence[Schedule | UnreadableSchedule]:
        """Every stored schedule by name; or, with ``due_at``, those whose
        ``next_run_at <= due_at`` ordered by ``next_run_at`` then name
        (index-driven). Each row is read with
        :func:`alkstore.engine.read_schedule`, so a row this version cannot
        read comes back as an :class:`UnreadableSchedule` and the listing
        never fails because of one row."""

    @abc.abstractmethod
    def _fire_schedule(
        self,
        schedule: Schedule,
        boundary: datetime,
        next_run_at: datetime,
        resolved: Resolved,
        payload: EncodedPayload,
    ) -> int | None:
        """In one transaction: only if the stored schedule still has
        ``schedule.revision`` and ``schedule.next_run_at``, set its
        ``next_run_at``, ``last_run_at = boundary`` and ``last_job_id``,
        and insert one job into ``schedule.queue`` as :meth:`Queue._insert`
        does (waking its subscribers on commit); return the job id, or
        ``None`` (nothing written) when another tick or a replacement got
        there first. This is the exactly-once guard. If the insert fails,
        the transaction rolls back whole, so the schedule is left as it
        was and the next tick tries the boundary again. Never wait without
        bound for one schedule's row: an engine with row locks passes over
        a row another transaction holds (``None``, as when another tick
        fires it); a database-wide write lock is waited for within the
        engine's stated timeout, then raises."""

    @abc.abstractmethod
    def _skip_schedule(self, schedule: Schedule, next_run_at: datetime) -> bool:
        """As :meth:`_fire_schedule` without a job: advance ``next_run_at``
        only; ``False`` when the guard fails."""

    @abc.abstractmethod
    def _put_worker(self, info: WorkerInfo) -> None:
        """Insert or replace the record of ``info.id`` with ``info`` (checked,
        ``last_seen_at`` set to now); in the same transaction, delete every
        record whose ``last_seen_at + ttl_s`` is at or before
        ``info.last_seen_at``."""

    @abc.abstractmethod
    def _delete_worker(self, worker_id: str) -> bool:
        """Delete the record of ``worker_id``; ``True`` if one was deleted."""

    @abc.abstractmethod
    def _list_workers(self, now: datetime) -> list[WorkerInfo]:
        """The records with ``last_seen_at + ttl_s > now``, ordered by
        ``started_at`` then id, each instant and ``ttl_s`` exactly as
        stored."""

    @abc.abstractmethod
    def _maintenance_turn(self, task: str, interval_s: float) -> AbstractContextManager[bool]:
        """A context manager yielding whether this process may run the
        maintenance ``task`` now: ``True`` for at most one caller per
        database while it is held, and only if the task's last turn (a
        durable per-task ``last_run_at``, set to now when a turn is taken)
        is at least ``interval_s`` ago, so each caller's own interval
        counts from whoever ran it last.
        PostgreSQL holds an advisory lock for the block; SQLite a file lock
        beside the database."""


def _parse_schedule(spec: str, timezone: str) -> ScheduleSpec:
    """:func:`alkstore.logic.cron.parse_schedule`, imported at its first use
    (``import alkstore`` does not import the cron module)."""
    from alkstore.logic.cron import parse_schedule

    return parse_schedule(spec, timezone)


def check_store(store: object, what: str) -> Store:
    """Return ``store`` if it is a :class:`Store`.

    Raises
    ------
    ValidationError
        Otherwise, naming ``what`` needed it.
    """
    if not isinstance(store, Store):
        article = "an" if what[:1] in "AEIOU" else "a"
        raise ValidationError(f"{article} {what} needs a Store, not {type(store).__name__}")
    return store
