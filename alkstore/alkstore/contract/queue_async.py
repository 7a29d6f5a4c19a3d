"""The :class:`AsyncQueue` ABC: the operations on one named queue (docs/contract.md §2, §3)."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, get_args

from alkstore.contract.job import Job, ListedState, QueueStats, SweepResult
from alkstore.contract.workers import ThroughputPoint
from alkstore.errors import ValidationError
from alkstore.logic import validation as v
from alkstore.logic.codec import EncodedPayload, encode_payload, encode_payloads
from alkstore.logic.duration import duration
from alkstore.logic.options import QueueOpts
from alkstore.logic.resolution import EnqueueOptions, Resolved, enqueue_options, resolve

if TYPE_CHECKING:
    from alkstore.contract.handle_async import AsyncJobHandle
    from alkstore.contract.store_async import AsyncStore

__all__ = ["THROUGHPUT_KEPT_S", "AsyncQueue"]

#: How long the per-minute throughput counts are kept, seconds (a day).
THROUGHPUT_KEPT_S = 86_400
THROUGHPUT_KEPT = timedelta(seconds=THROUGHPUT_KEPT_S)


class AsyncQueue(abc.ABC):
    """A handle on one named queue of a store (docs/contract.md §2).

    Obtain one with :meth:`AsyncStore.queue`. Every operation sees only this
    queue's rows: a job id from another queue behaves as unknown. Every
    public method raises :class:`~alkstore.errors.StoreClosedError` once the
    store is closed (checked first), then
    :class:`~alkstore.errors.ValidationError` for bad arguments (before any
    I/O).

    Engine authors implement the underscore primitives; the public methods
    here validate, resolve options (one clock read per call), encode payloads
    and compute backoff once for every engine.
    """

    def __init__(self, store: AsyncStore, name: str, opts: QueueOpts) -> None:
        self._store = store
        self._name = name
        self._opts = opts

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._name

    @property
    def opts(self) -> QueueOpts:
        """The options this handle stamps on the rows it enqueues."""
        return self._opts

    @property
    def store(self) -> AsyncStore:
        """The store this queue belongs to."""
        return self._store

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name!r}>"

    # -- enqueue -------------------------------------------------------------

    async def _resolve(self, options: EnqueueOptions) -> Resolved:
        # The options are checked, then the payloads encoded (and so
        # checked), then the clock read once.
        return resolve(await self._store._now(), self._opts, options)

    async def enqueue(
        self,
        payload: object,
        *,
        delay: object = None,
        run_at: object = None,
        priority: object = None,
        max_attempts: object = None,
        expires: object = None,
        unique_key: object = None,
    ) -> int:
        """Add one job and wake the queue's subscribers on commit.

        Parameters
        ----------
        payload
            ``bytes`` (stored verbatim) or a strict-JSON value (docs/contract.md §3
            "Payload").
        delay
            Seconds or ``timedelta`` from now until the job is due; wins over
            ``run_at``.
        run_at
            An aware ``datetime`` at which the job is due. Neither ``delay``
            nor ``run_at`` means now.
        priority
            Overrides ``opts.priority``; higher is claimed first.
        max_attempts
            Overrides ``opts.max_attempts``.
        expires
            Seconds or ``timedelta`` after now at which the job expires;
            overrides ``opts.expires_s``.
        unique_key
            ``None``, or a ``str`` of 1 to 255 characters: while a job of
            this queue with the same key is live (pending, scheduled or
            processing), nothing is stored and that job's id is returned
            (docs/contract.md §3 "Unique keys").

        Returns
        -------
        int
            The new job's id, or the live job's that holds ``unique_key``.

        Raises
        ------
        StoreClosedError, ValidationError
            As for every queue method; nothing is written.
        EngineError
            If the database fails.
        """
        self._store._check_open()
        options = enqueue_options(
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            expires=expires,
        )
        key = v.unique_key(unique_key)
        encoded = [encode_payload(payload)]
        resolved = await self._resolve(options)
        return (await self._insert(resolved, encoded, None if key is None else [key]))[0]

    async def enqueue_many(
        self,
        payloads: Iterable[object],
        *,
        delay: object = None,
        run_at: object = None,
        priority: object = None,
        max_attempts: object = None,
        expires: object = None,
        unique_keys: object = None,
    ) -> list[int]:
        """Add many jobs in one transaction, all or nothing.

        All items share one clock read, so one ``enqueued_at`` and ``run_at``;
        ``options`` are :meth:`enqueue`'s keywords. Ids increase in list order.

        Parameters
        ----------
        unique_keys
            ``None``, or one key (or ``None``) per payload, in order: an item
            whose key a live job holds, or an earlier item of the same call,
            stores nothing and gets that job's id (docs/contract.md §3
            "Unique keys").

        Returns
        -------
        list[int]
            One id per payload, in the order of ``payloads`` (``[]`` for
            none): the new job's, or the live one's that holds its key.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
            As :meth:`enqueue`; a refused item means nothing is written.
        """
        self._store._check_open()  # before validating payloads (docs/contract.md §3 "Closed store")
        if not v.is_collection(payloads):
            raise ValidationError("payloads must be an iterable of payloads (a list)")
        options = enqueue_options(
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            expires=expires,
        )
        encoded = encode_payloads(payloads)
        keys = v.unique_keys(unique_keys, len(encoded))
        resolved = await self._resolve(options)
        if not encoded:
            return []
        return await self._insert(resolved, encoded, keys)

    async def enqueue_tx(
        self,
        conn: Any,
        payload: object,
        *,
        delay: object = None,
        run_at: object = None,
        priority: object = None,
        max_attempts: object = None,
        expires: object = None,
        unique_key: object = None,
    ) -> int:
        """Add one job inside the caller's open transaction (docs/contract.md §3
        "Transactional enqueue").

        alkstore never commits or rolls back ``conn``: the caller's commit
        makes the job visible and wakes subscribers; a rollback leaves no row
        and no wake. Validation happens before any statement runs, so a
        refused payload never aborts the caller's transaction.

        Parameters
        ----------
        conn
            The engine's driver connection, inside an open transaction, or
            one whose driver opens it before its first statement (sqlite3's
            default, psycopg outside autocommit): the enqueue then opens the
            caller's transaction. See the engine's documentation for the type.
        payload, options, unique_key
            As :meth:`enqueue`; a live job holding ``unique_key`` includes
            one this transaction enqueued, and one another transaction
            committed (PostgreSQL waits for a transaction enqueueing the
            same key to end first).

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
            As :meth:`enqueue`; ``ValidationError`` also for a ``conn`` of the
            wrong kind or not inside a transaction.
        """
        self._store._check_open()
        options = enqueue_options(
            delay=delay,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            expires=expires,
        )
        key = v.unique_key(unique_key)
        encoded = [encode_payload(payload)]
        resolved = await self._resolve(options)
        return await self._insert_tx(conn, resolved, encoded[0], key)

    # -- claim ---------------------------------------------------------------

    async def claim_one(self, worker_id: str) -> AsyncJobHandle | None:
        """Claim the first eligible job, or return ``None``.

        See :meth:`claim_batch` for eligibility, order and effects.
        """
        self._store._check_open()
        v.worker_id(worker_id)
        handles = await self._claim(worker_id, 1)
        return handles[0] if handles else None

    async def claim_batch(self, worker_id: str, n: int) -> list[AsyncJobHandle]:
        """Claim up to ``n`` eligible jobs, exactly once under any concurrency
        (docs/contract.md §3 "Claim").

        Eligible: pending, due (``run_at <= now``) and not expired; or
        processing with a lapsed claim, attempts below ``max_attempts`` and
        not expired (a reclaim). Order: ``priority DESC, run_at ASC, id
        ASC``. Each claim sets ``attempts += 1``, ``worker_id`` and
        ``claim_deadline = now + visibility_timeout_s`` (the row's stamp).
        First, this queue's lapsed claims with attempts exhausted move to the
        dead table with ``last_error = "max attempts exceeded"``.

        Parameters
        ----------
        worker_id
            A str of 1 to 255 characters, recorded on the rows.
        n
            How many at most; ``n <= 0`` returns ``[]`` without I/O.

        Returns
        -------
        list[AsyncJobHandle]
            ``min(n, eligible)`` handles, in claim order.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._store._check_open()
        v.worker_id(worker_id)
        if type(n) is not int:
            raise ValidationError(f"n must be an int, not {type(n).__name__}")
        if n <= 0:
            return []
        return await self._claim(worker_id, n)

    # -- other operations ----------------------------------------------------

    async def ack_batch(self, job_ids: Iterable[int]) -> int:
        """Ack every listed job of this queue whose claim is valid:
        processing and not lapsed, whoever holds it (docs/contract.md §3 "ack_batch(ids)").
        Acked jobs are deleted, or kept as completed (without a result) when
        this handle keeps completed jobs (``QueueOpts.keep_completed_s``).

        Returns
        -------
        int
            How many were acked; each id counts once; unknown, pending or
            lapsed ids are not counted.
        """
        self._store._check_open()
        ids = v.job_ids(job_ids)
        if not ids:
            return 0
        if self._opts.keep_completed_s is not None:
            return await self._complete_batch(ids)
        return await self._ack_batch(ids)

    async def ack_many(
        self, handles: Iterable[AsyncJobHandle], results: Iterable[object] | None = None
    ) -> list[bool]:
        """Ack several claims of this queue at once, each exactly as its own
        :meth:`AsyncJobHandle.ack` would: a handle's claim is acked only if it is
        still valid, held by that claim (docs/contract.md §3 "Claim identity
        and handle validity", "ack_many(handles)"). A stale handle (its
        claim lapsed and the job was claimed again) acks nothing, so it can
        never delete another claim's job, as ``ack_batch`` would.

        Parameters
        ----------
        handles
            Iterable of :class:`AsyncJobHandle` of this queue (from this store).
        results
            ``None``, or one result per handle, in order, as each handle's
            ``ack(result)`` takes it: kept when this queue handle keeps
            completed jobs (docs/contract.md §3 "Completed jobs").

        Returns
        -------
        list[bool]
            One per handle, in order: ``True`` if its ack took effect. A
            handle listed twice is acked once (``True`` first, ``False``
            after); a spent handle is ``False`` without I/O; ``[]`` returns
            ``[]`` without I/O.

        Raises
        ------
        StoreClosedError
        ValidationError
            If ``handles`` is not an iterable of this queue's handles;
            nothing is acked.
        EngineError
        """
        from alkstore.contract.handle_async import AsyncJobHandle

        self._store._check_open()
        if not v.is_collection(handles):
            raise ValidationError(
                f"handles must be an iterable of claim handles, not {type(handles).__name__}"
            )
        items = list(handles)
        for item in items:
            if not isinstance(item, AsyncJobHandle):
                raise ValidationError(
                    "handles must be claim handles (from claim_one or claim_batch),"
                    f" not {type(item).__name__}"
                )
            if item._queue.store is not self._store or item.queue != self._name:
                raise ValidationError(
                    f"handle of job {item.id} is a claim of queue {item.queue!r}"
                    + ("" if item._queue.store is self._store else " of another store")
                    + f", not of {self._name!r}"
                )
        encoded = v.results_for(results, len(items))
        live: list[AsyncJobHandle] = []
        kept: list[bytes | None] = []
        for item, data in zip(items, encoded, strict=True):
            if not item._spent and all(item is not seen for seen in live):
                live.append(item)
                kept.append(data)
        if self._opts.keep_completed_s is not None:
            done_flags = await self._complete_many(live, kept)
        else:
            done_flags = await self._ack_many(live)
        acked = {id(h) for h, done in zip(live, done_flags, strict=True) if done}
        outcomes: list[bool] = []
        for item in items:
            took = id(item) in acked
            acked.discard(id(item))  # a handle listed again is acked once
            outcomes.append(item._finish(took))
        return outcomes

    async def cancel(self, job_id: int) -> bool:
        """Delete a pending or processing job of this queue unconditionally
        (a running handler is not interrupted).

        Returns
        -------
        bool
            ``False`` when there is no such live job.
        """
        self._store._check_open()
        return await self._cancel(v.job_id(job_id))

    async def get_job(self, job_id: int) -> Job | None:
        """Return a snapshot of a live or dead job of this queue, or ``None``."""
        self._store._check_open()
        return await self._get_job(v.job_id(job_id))

    async def sweep_expired(self) -> SweepResult:
        """Move this queue's expired rows (pending or processing) to the dead
        table with ``last_error = "expired"``, then purge dead rows older than
        this handle's ``opts.dead_letter_retention_s`` (``None`` keeps them)
        and completed rows that finished ``opts.keep_completed_s`` ago or
        more (``None`` purges none). Safe to run from many processes at once
        (docs/contract.md §3 "sweep_expired()", "Completed jobs").
        """
        self._store._check_open()
        opts = self._opts
        return await self._sweep_expired(opts.dead_letter_retention_s, opts.keep_completed_s)

    async def stats(self) -> QueueStats:
        """Count this queue's rows by state at one instant (docs/contract.md §3 "stats()")."""
        self._store._check_open()
        return await self._stats()

    async def lapsed_claims(self) -> int:
        """Count this queue's processing jobs whose claim has lapsed
        (``now >= claim_deadline``, docs/contract.md §3 "Boundaries") at one instant:
        their worker died, hung or lost the database for longer than the
        visibility timeout. The next claim takes each back (a reclaim), or
        dead-letters it when its attempts are spent. They are part of
        :meth:`stats`' ``processing``, so ``processing - lapsed_claims()``
        is the claims that workers still hold (read at a later instant: the
        two may differ by what changed in between). Index-driven, as
        ``stats()`` (docs/operations.md).

        Returns
        -------
        int
            How many, ``>= 0``.

        Raises
        ------
        StoreClosedError, EngineError
        """
        self._store._check_open()
        return await self._lapsed_claims()

    async def completed_count(self) -> int:
        """Count this queue's completed jobs: those kept by an ack through a
        handle with ``keep_completed_s`` and not purged yet (docs/contract.md
        §3 "Completed jobs"). An index range, as :meth:`stats`.

        Raises
        ------
        StoreClosedError, EngineError
        """
        self._store._check_open()
        return await self._completed_count()

    async def jobs(
        self, state: ListedState, *, limit: int = 100, after_id: int | None = None
    ) -> list[Job]:
        """This queue's jobs in one state, in id order, a page at a time
        (docs/contract.md §11 "Listing jobs"; what a dashboard shows).

        Parameters
        ----------
        state
            ``"pending"`` (due now, as :meth:`stats` counts them),
            ``"scheduled"`` (waiting for a later ``run_at``),
            ``"processing"`` (claimed, lapsed included), ``"completed"`` or
            ``"dead"``.
        limit
            Page size, ``1 .. 10000``.
        after_id
            Return jobs with ids above this (the last id of the previous
            page); ``None`` starts at the lowest.

        Returns
        -------
        list[Job]
            Snapshots, ids increasing (``state`` is the job's own:
            ``"pending"`` for a scheduled one).

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._store._check_open()
        if state not in get_args(ListedState):
            raise ValidationError(
                f"state must be one of {', '.join(get_args(ListedState))}, not {state!r}"
            )
        limit = v.int_in_range(limit, "limit", 1, 10_000)
        after = None if after_id is None else v.int_in_range(after_id, "after_id", 0, 2**63 - 1)
        if state == "dead":
            return await self._dead_jobs(limit, after)
        return await self._jobs(state, limit, after, await self._store._now())

    # -- throughput (docs/contract.md §11) ----------------------------------

    async def record_throughput(
        self, *, completed: int = 0, retried: int = 0, dead: int = 0
    ) -> None:
        """Add finished jobs to this queue's count for the current minute
        (by the store's clock): what a worker reports, with its heartbeat,
        of the jobs it finished since its last report (docs/contract.md §11
        "Throughput"). Minutes older than :data:`THROUGHPUT_KEPT_S` are
        deleted on the way.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._store._check_open()
        completed = v.int_in_range(completed, "completed", 0, 2**31 - 1)
        retried = v.int_in_range(retried, "retried", 0, 2**31 - 1)
        dead = v.int_in_range(dead, "dead", 0, 2**31 - 1)
        if completed or retried or dead:
            now = await self._store._now()
            minute = now.replace(second=0, microsecond=0)
            await self._add_throughput(minute, completed, retried, dead, minute - THROUGHPUT_KEPT)

    async def throughput(self, window_s: object = 3600) -> list[ThroughputPoint]:
        """This queue's finished jobs per minute over the last ``window_s``
        seconds (default an hour), as workers reported them; minutes
        without any are left out.

        Returns
        -------
        list[ThroughputPoint]
            Minutes increasing, from the one holding the instant ``window_s``
            before now to the current, partial one.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._store._check_open()
        window = v.duration_s(window_s, "window_s")
        since = await self._store._now() - duration(window)
        return await self._throughput(since.replace(second=0, microsecond=0))

    # -- pause (docs/operations.md) -----------------------------------------

    async def pause(self) -> bool:
        """Stop handing out this queue's jobs, in every process, until
        :meth:`resume`: claims return nothing and change nothing (no
        reclaim, no pre-claim dead-lettering); enqueues still land. Claims
        already made run on. As pg-boss's and Oban's queue pause.

        Returns
        -------
        bool
            ``True`` if this call paused it, ``False`` if it was paused.

        Raises
        ------
        StoreClosedError, EngineError
        """
        self._store._check_open()
        return await self._set_paused(True)

    async def resume(self) -> bool:
        """Hand out this queue's jobs again and wake its subscribers.

        Returns
        -------
        bool
            ``True`` if this call resumed it, ``False`` if it was not paused.

        Raises
        ------
        StoreClosedError, EngineError
        """
        self._store._check_open()
        return await self._set_paused(False)

    async def is_paused(self) -> bool:
        """Whether the queue is paused (read from the database).

        Raises
        ------
        StoreClosedError, EngineError
        """
        self._store._check_open()
        return await self._is_paused()

    # -- dead letters (docs/operations.md) ----------------------------------

    async def dead_jobs(self, limit: int = 100, after_id: int | None = None) -> list[Job]:
        """This queue's dead jobs in id order, a page at a time.

        Parameters
        ----------
        limit
            Page size, ``1 .. 10000``.
        after_id
            Return jobs with ids above this (the last id of the previous
            page); ``None`` starts at the lowest.

        Returns
        -------
        list[Job]
            Snapshots with ``state == "dead"``, ids increasing.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        return await self.jobs("dead", limit=limit, after_id=after_id)

    async def requeue(self, job_id: int, *, delay: object = None) -> bool:
        """Move a dead job of this queue back to pending, as River's and
        Oban's "retry job" do: same id, payload and stamps, ``attempts``
        kept (they count claims, so no claim identity ever repeats) and a
        fresh budget (``max_attempts`` raised by the attempts it used, at most
        ``2**31 - 1``; docs/decisions.md D21), ``worker_id``/
        ``claim_deadline``/``died_at`` cleared, ``last_error`` kept for the
        record. It is due after ``delay``
        (default now); an expiring job gets its original expiry duration
        (``expires_at - enqueued_at``) again, counted from its new
        ``run_at``. Wakes the queue's subscribers.

        Parameters
        ----------
        job_id
            The dead job's id.
        delay
            Seconds or ``timedelta``, ``>= 0``.

        Returns
        -------
        bool
            ``False`` when this queue has no such dead job (unknown, live,
            or requeued meanwhile by someone else).

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._store._check_open()
        job_id = v.job_id(job_id)
        delay_s = 0.0 if delay is None else v.duration_s(delay, "delay")
        now = await self._store._now()
        return await self._requeue(job_id, now, now + duration(delay_s))

    async def run_now(self, job_id: int) -> bool:
        """Make a pending job of this queue that is not due yet due now: one
        waiting out its retry backoff, or enqueued with a delay or a future
        ``run_at`` (docs/contract.md §4 "Run now"; River's ``JobRetry`` of a
        scheduled job). ``run_at`` becomes now; nothing else changes (its
        attempts, budget, priority and expiry are kept). Wakes the queue's
        subscribers.

        Parameters
        ----------
        job_id
            The waiting job's id.

        Returns
        -------
        bool
            ``False`` when this queue has no such waiting job: unknown,
            already due, processing, dead or completed.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._store._check_open()
        job_id = v.job_id(job_id)
        return await self._run_now(job_id, await self._store._now())

    async def purge_dead(self, older_than: object = None) -> int:
        """Delete this queue's dead jobs that died at least ``older_than``
        ago (docs/contract.md §3's retention rule: ``died_at + older_than <= now``);
        ``None`` deletes them all.

        Returns
        -------
        int
            How many were deleted.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._store._check_open()
        cutoff = None
        if older_than is not None:
            older_s = v.duration_s(older_than, "older_than")
            cutoff = await self._store._now() - duration(older_s)
        return await self._purge_dead(cutoff)

    # -- engine primitives ---------------------------------------------------

    @abc.abstractmethod
    async def _insert(
        self,
        resolved: Resolved,
        payloads: Sequence[EncodedPayload],
        unique_keys: Sequence[str | None] | None,
    ) -> list[int]:
        """Insert one pending row per payload, all sharing ``resolved``, in
        one transaction that also signals the queue's wake; return the ids
        in order. ``payloads`` is never empty. ``unique_keys`` is ``None``
        (no keys) or one checked key or ``None`` per payload: an item whose
        key a live row of this queue holds (or an earlier item) is not
        inserted and gets that row's id, race-free (docs/contract.md §3
        "Unique keys")."""

    @abc.abstractmethod
    async def _insert_tx(
        self, conn: Any, resolved: Resolved, payload: EncodedPayload, unique_key: str | None
    ) -> int:
        """As :meth:`_insert` for one row, through the caller's ``conn``,
        never committing it. Check ``conn`` before any statement and raise
        ``ValidationError`` if it is unusable or not in a transaction."""

    @abc.abstractmethod
    async def _claim(self, worker_id: str, n: int) -> list[AsyncJobHandle]:
        """Dead-letter exhausted lapsed claims, then claim ``n >= 1`` rows
        atomically and return their handles in claim order."""

    @abc.abstractmethod
    async def _ack_batch(self, job_ids: list[int]) -> int:
        """Delete valid claims among distinct ``job_ids``; return the count."""

    async def _ack_many(self, handles: list[AsyncJobHandle]) -> list[bool]:
        """Ack each handle's claim if it is valid, as its ``_ack()`` would;
        one result per handle, in order. The handles are distinct, not
        spent, and of this queue. This default acks them one by one; engines
        override it with one statement or one transaction."""
        return [await handle._ack() for handle in handles]

    @abc.abstractmethod
    async def _complete_batch(self, job_ids: list[int]) -> int:
        """As :meth:`_ack_batch`, moving each valid claim to the completed
        rows (``finished_at = now``, no result) instead of deleting it."""

    async def _complete_many(
        self, handles: list[AsyncJobHandle], results: list[bytes | None]
    ) -> list[bool]:
        """As :meth:`_ack_many`, moving each valid claim to the completed
        rows with its result, as its handle's ``_complete(result)`` would.
        This default completes them one by one."""
        return [
            await handle._complete(result) for handle, result in zip(handles, results, strict=True)
        ]

    @abc.abstractmethod
    async def _cancel(self, job_id: int) -> bool:
        """Delete a live row; ``True`` if one was deleted."""

    @abc.abstractmethod
    async def _get_job(self, job_id: int) -> Job | None:
        """Read a live or dead row of this queue."""

    @abc.abstractmethod
    async def _sweep_expired(
        self, retention_s: float | None, keep_completed_s: float | None
    ) -> SweepResult:
        """Dead-letter expired rows, then purge dead rows past
        ``retention_s`` and, unless ``keep_completed_s`` is ``None``,
        completed rows that finished at least that long ago."""

    @abc.abstractmethod
    async def _stats(self) -> QueueStats:
        """Count rows by state."""

    @abc.abstractmethod
    async def _lapsed_claims(self) -> int:
        """Count this queue's processing rows with ``claim_deadline <= now``
        (one clock reading), whatever private state the engine keeps them
        in, through an index: never a scan of the queue's rows."""

    @abc.abstractmethod
    async def _set_paused(self, paused: bool) -> bool:
        """Record the queue's pause state durably; on resume, wake its
        subscribers (in other processes too). ``True`` if it changed.
        While paused, :meth:`_claim` returns ``[]`` and writes nothing."""

    @abc.abstractmethod
    async def _is_paused(self) -> bool:
        """Read the pause state."""

    @abc.abstractmethod
    async def _dead_jobs(self, limit: int, after_id: int | None) -> list[Job]:
        """Up to ``limit`` dead rows of this queue with ``id > after_id``,
        by id (an index range, not a scan)."""

    @abc.abstractmethod
    async def _jobs(
        self, state: ListedState, limit: int, after_id: int | None, now: datetime
    ) -> list[Job]:
        """Up to ``limit`` live or completed rows of this queue with
        ``id > after_id`` in ``state`` at ``now`` (never ``"dead"``: that is
        :meth:`_dead_jobs`), by id. ``"pending"`` and ``"scheduled"``
        split the pending rows at ``run_at <= now`` as :meth:`_stats` does."""

    @abc.abstractmethod
    async def _completed_count(self) -> int:
        """How many completed rows this queue has (an index range)."""

    @abc.abstractmethod
    async def _add_throughput(
        self, minute: datetime, completed: int, retried: int, dead: int, prune_before: datetime
    ) -> None:
        """Add the counts to this queue's row for ``minute`` (created at
        zero when missing; concurrent adds from many workers all count),
        and delete this queue's rows for minutes before ``prune_before``."""

    @abc.abstractmethod
    async def _throughput(self, since: datetime) -> list[ThroughputPoint]:
        """This queue's rows with ``minute >= since`` (a minute's start),
        minutes increasing."""

    @abc.abstractmethod
    async def _requeue(self, job_id: int, now: datetime, run_at: datetime) -> bool:
        """In one statement or transaction, move this queue's dead row
        ``job_id`` back to the live table: pending (due at ``run_at``; ``now``
        is the call's clock reading), ``attempts`` kept,
        ``max_attempts = min(attempts + max_attempts, 2**31 - 1)`` (a fresh
        budget that never repeats a claim's identity; D21),
        ``expires_at = run_at + (old expires_at - old enqueued_at)``
        (NULL stays NULL), ``worker_id``/``claim_deadline``/``died_at``
        cleared, everything else kept; wake the subscribers on commit.
        ``False`` when there is no such dead row."""

    @abc.abstractmethod
    async def _run_now(self, job_id: int, now: datetime) -> bool:
        """If the row is a pending one of this queue with ``run_at > now``,
        set ``run_at = now`` in one atomic step (and wake the queue's
        subscribers once committed); whether it did."""

    @abc.abstractmethod
    async def _purge_dead(self, cutoff: datetime | None) -> int:
        """Delete this queue's dead rows with ``died_at <= cutoff`` (all when
        ``None``); return the count."""
