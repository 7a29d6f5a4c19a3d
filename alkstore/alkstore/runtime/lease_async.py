"""What a worker knows of the claims it holds: the lease (docs/tasks-and-workers.md
"Heartbeats").

A claim holds until its ``claim_deadline`` (docs/contract.md §3 "Claim identity and
handle validity"). The worker and the outbox relay track, for each job they
hold, when that is: on the store's clock (the deadline the claim or the last
heartbeat set) and on the monotonic clock (the instant before that call plus
the visibility timeout, an estimate that is never late). :class:`AsyncLease` is
that record; the :class:`~alkstore.runtime.heartbeat_async.AsyncHeartbeater` renews it.

Writes on a held job (ack, retry, fail, and the batched ``ack_many``) that
fail on an error that may pass (:class:`~alkstore.errors.EngineError` with
``permanent`` false: a held lock, a lost connection) are tried again by
:func:`write_while_held` until they land or the claim would have lapsed,
as SQS consumers retry ``DeleteMessage`` within the visibility timeout. Only
a lapsed claim is abandoned, so a passing fault never makes finished work
run again (case 015). :func:`retry_or_bury` is the retry such a write makes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from alkstore._acompat_async import AEvent, ALock, asleep, await_event
from alkstore.contract.handle_async import AsyncJobHandle
from alkstore.contract.job import MAX_ATTEMPTS_EXCEEDED
from alkstore.errors import EngineError
from alkstore.logic import validation as v

__all__ = ["AsyncLease", "gone_while_held", "retry_or_bury", "store_now", "write_while_held"]

log = logging.getLogger("alkstore.worker")

T = TypeVar("T")

#: The first pause before a failed write on a held job is tried again,
#: seconds; it doubles after each failure up to :data:`_RETRY_MAX_S`.
_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 1.0


class AsyncLease:
    """One held job: its heartbeat schedule and how long its claim holds.

    Attributes
    ----------
    handle
        The job's claim.
    interval_s
        Seconds between heartbeats (a third of the visibility timeout).
    next_at
        When the next heartbeat is due, monotonic seconds.
    ends
        Monotonic seconds by which the claim has lapsed at the latest known:
        the instant before the claim (or the last heartbeat that took
        effect) plus the visibility timeout.
    ends_at
        The same on the store's clock: the claim's deadline as last set.
    lost
        Set when a heartbeat was refused while the job was held: its claim
        lapsed, was reclaimed or was cancelled.
    cancelled
        Set with ``lost`` when the job was gone from the store while its
        claim still held: it was cancelled (``AsyncQueue.cancel``).
    done
        Set once the job's outcome is being written: a refused heartbeat is
        then the write's doing, not a lost claim.

    Every heartbeat of the claim goes through :meth:`renew`, the
    heartbeater's and a handler's own (``JobContext.heartbeat``), one at a
    time, so that what the lease records is what the store last set.
    """

    __slots__ = (
        "_lock",
        "_monotonic",
        "cancelled",
        "done",
        "ends",
        "ends_at",
        "handle",
        "interval_s",
        "lost",
        "next_at",
    )

    def __init__(
        self,
        handle: AsyncJobHandle,
        interval_s: float,
        next_at: float,
        ends: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.handle = handle
        self.interval_s = interval_s
        self.next_at = next_at
        self.ends = ends
        self.ends_at: datetime = handle.claim_deadline
        self.lost = False
        self.cancelled = False
        self.done = False
        self._monotonic = monotonic
        self._lock = ALock()

    def renewed(self, sent: float, sent_at: datetime | None, extend_s: float) -> None:
        """A heartbeat sent at monotonic ``sent`` (store time ``sent_at``,
        ``None`` if unknown) set the deadline ``extend_s`` seconds on. The
        next beat is due one interval later, or, after an extension longer
        than the visibility timeout, once the claim has no more left than an
        interval's beat would give it: a beat never shortens a claim."""
        self.ends = sent + extend_s
        if sent_at is not None:
            self.ends_at = sent_at + timedelta(seconds=extend_s)
        visibility_s = self.handle.visibility_timeout_s
        self.next_at = sent + self.interval_s + max(0.0, extend_s - visibility_s)

    async def renew(self, extend: object = None) -> bool:
        """Heartbeat the claim now (``AsyncJobHandle.heartbeat``) and record what
        came of it: a beat that took effect moves :attr:`ends`,
        :attr:`ends_at` and :attr:`next_at` (:meth:`renewed`); one refused
        while the job is held (not :attr:`done`) sets :attr:`lost`, and
        :attr:`cancelled` when the job is gone while its claim still held
        (:func:`gone_while_held`), each logged once. A lease already lost
        is refused without asking the store.

        Parameters
        ----------
        extend
            Seconds or ``timedelta``, ``> 0``: the deadline becomes now plus
            this; default (``None``) the row's visibility timeout.

        Returns
        -------
        bool
            Whether the beat took effect.

        Raises
        ------
        ValidationError
            For an ``extend`` that is not a positive duration (before any
            I/O).
        StoreClosedError, EngineError
            As ``AsyncJobHandle.heartbeat``; nothing is recorded then.
        """
        extend_s = (
            self.handle.visibility_timeout_s
            if extend is None
            else v.duration_s(extend, "extend", positive=True)
        )
        async with self._lock:
            if self.lost:
                return False
            sent = self._monotonic()
            sent_at = await store_now(self.handle)
            heartbeat = self.handle.heartbeat
            took = await (heartbeat() if extend is None else heartbeat(extend_s))
            if took:
                self.renewed(sent, sent_at, extend_s)
            elif not self.done:
                self.cancelled = await gone_while_held(self, sent)
                self.lost = True
                if self.cancelled:
                    log.info(
                        "job %s of %r was cancelled while running; its handler runs on, "
                        "and its outcome will not be recorded",
                        self.handle.id,
                        self.handle.queue,
                    )
                else:
                    log.warning(
                        "job %s of %r lost its claim while running (it lapsed and may "
                        "have been reclaimed); another worker may run it again",
                        self.handle.id,
                        self.handle.queue,
                    )
            return took

    async def held_at(self, now: float) -> bool:
        """Whether the claim's deadline, as last known, is still ahead at
        monotonic ``now`` and on the store's clock (read now; when it cannot
        be read, the monotonic clock decides)."""
        if now >= self.ends:
            return False
        store_time = await store_now(self.handle)
        return store_time is None or store_time < self.ends_at

    async def holds(self, now: float) -> bool:
        """Whether the claim still holds as far as this worker knows: no
        refusal seen, and :meth:`held_at` ``now``."""
        return not self.lost and await self.held_at(now)


async def store_now(handle: AsyncJobHandle) -> datetime | None:
    """The time now on ``handle``'s store clock; ``None`` when it cannot be
    read."""
    try:
        return await handle._queue.store._now()
    except Exception:
        return None


async def gone_while_held(lease: AsyncLease, now: float) -> bool:
    """Whether a claim refused at monotonic ``now`` was refused because its
    job is gone from the store while the claim still held
    (``AsyncQueue.cancel``), not because it lapsed or was reclaimed. Never raises
    (``False`` when the store cannot say)."""
    if not await lease.held_at(now):
        return False
    try:
        return await lease.handle._queue.get_job(lease.handle.id) is None
    except Exception:
        return False


async def _all_hold(leases: Sequence[AsyncLease], now: float) -> bool:
    """Whether every lease :meth:`~AsyncLease.holds` ``now`` (the first that
    does not ends the look)."""
    for lease in leases:
        if not await lease.holds(now):
            break
    else:
        return True
    return False


async def write_while_held(
    write: Callable[[], Awaitable[T]],
    leases: Sequence[AsyncLease],
    what: str,
    *,
    stop: AEvent | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``write`` until it returns, trying again after an
    :class:`~alkstore.errors.EngineError` that is not ``permanent`` while
    every lease of ``leases`` holds.

    Parameters
    ----------
    write
        The write on the held jobs (``handle.ack``, ``queue.ack_many`` ...).
    leases
        The leases of the jobs it writes.
    what
        For the log: ``"acking job 5 of 'emails'"``.
    stop
        When set, stop trying (the worker is leaving its jobs to lapse).
    monotonic
        The clock, seconds.

    Returns
    -------
    T
        What ``write`` returned.

    Raises
    ------
    EngineError
        The last failure, once it is permanent, a lease has ended or ``stop``
        is set. Any other exception ``write`` raises propagates at once.
    """
    pause = _RETRY_FIRST_S
    failures = 0
    while True:
        try:
            result = await write()
        except EngineError as error:
            now = monotonic()
            if (
                error.permanent
                or (stop is not None and stop.is_set())
                or not await _all_hold(leases, now)
            ):
                raise
            failures += 1
            ends = min(lease.ends for lease in leases)
            if failures == 1:
                log.warning(
                    "%s failed (%s); trying again while the claim holds (%.1f s more)",
                    what,
                    error,
                    ends - now,
                )
            wait_s = min(pause, max(0.0, ends - now))
            if stop is None:
                await asleep(wait_s)
            elif await await_event(stop, wait_s):
                raise
            pause = min(pause * 2, _RETRY_MAX_S)
            continue
        if failures:
            log.info("%s succeeded after %d failure(s)", what, failures)
        return result


async def retry_or_bury(handle: AsyncJobHandle, error: str, delay_s: float | None = None) -> bool:
    """Retry a claimed job, or dead-letter it if this was its last attempt,
    keeping the error that spent it.

    :meth:`AsyncJobHandle.retry` at the budget stores only ``"max attempts
    exceeded"`` (docs/contract.md §3); the worker and the outbox relay, which know the
    error, call :meth:`AsyncJobHandle.fail` instead with ``"max attempts
    exceeded; last error: <error>"``, so the dead row says why, as Oban's and
    River's keep each attempt's error. The job ends dead either way.

    Parameters
    ----------
    handle
        A claimed job; its ``attempts`` is the claim's (post-claim) count.
    error
        The ``last_error`` text (capped at 65,536 characters, docs/contract.md §3).
    delay_s
        Seconds until the retry runs; ``None`` is the queue's backoff.

    Returns
    -------
    bool
        What :meth:`AsyncJobHandle.retry` or :meth:`AsyncJobHandle.fail` returned:
        ``False`` when the claim was no longer valid.

    Raises
    ------
    ValidationError, EngineError, StoreClosedError
        As the handle's methods raise them.
    """
    if handle.attempts >= handle.max_attempts:
        return await handle.fail(f"{MAX_ATTEMPTS_EXCEEDED}; last error: {error}")
    return await handle.retry(error, delay_s)
