"""Automatic heartbeats for a worker's running jobs (docs/tasks-and-workers.md
"Heartbeats").

Each running job is heartbeaten every third of its own visibility timeout
(the row's stamp, ``AsyncJobHandle.visibility_timeout_s``), so two beats can be
late or fail before its claim lapses (docs/contract.md §3: a claim lapses at
``now >= claim_deadline``; ``heartbeat()`` resets it to ``now +`` the row's
visibility timeout). This is the lease renewal of SQS's
``ChangeMessageVisibility`` and River's job heartbeats, done for the handler
so that it need not know about claims.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from alkstore._acompat_async import ACondition, ALock, ASpawned, ajoin, aspawn, is_async
from alkstore.contract.handle_async import AsyncJobHandle
from alkstore.errors import EngineError, StoreClosedError
from alkstore.runtime.lease_async import AsyncLease

__all__ = ["HEARTBEAT_FRACTION", "AsyncHeartbeater"]

log = logging.getLogger("alkstore.worker")

#: A job is heartbeaten every this fraction of its visibility timeout.
HEARTBEAT_FRACTION = 1 / 3
#: After a heartbeat raised (say, the database is briefly unreachable), the
#: next try comes this much sooner than a regular beat, at most.
_RETRY_AFTER_ERROR_S = 1.0


class AsyncHeartbeater:
    """Heartbeats registered jobs in the background: from one daemon thread,
    or, in the async form, from one task of the running event loop.

    The schedule is kept on a monotonic clock, not the store's: it only
    decides *when* to send a beat; the store decides whether the claim is
    still valid.

    Parameters
    ----------
    name
        The thread's (or task's) name.
    monotonic
        The clock for the schedule, seconds; injectable for tests.
    on_permanent
        Called (in the background) with each heartbeat failure that is
        a permanent :class:`~alkstore.errors.EngineError`: the worker stops
        on it.
    """

    def __init__(
        self,
        name: str,
        monotonic: Callable[[], float] = time.monotonic,
        on_permanent: Callable[[EngineError], None] | None = None,
    ) -> None:
        self._name = name
        self._monotonic = monotonic
        self._on_permanent = on_permanent
        self._beats: set[AsyncLease] = set()
        self._cond = ACondition(ALock())
        self._stopping = False
        self._runner: ASpawned | None = None
        # When the background wait will end by itself (monotonic seconds; inf
        # while it is awake or idle): a job added with a later first beat
        # needs no wake-up, which spares a thread switch per job under load.
        self._wake_at = math.inf
        self._changed = False

    async def add(self, handle: AsyncJobHandle, claimed: float | None = None) -> AsyncLease:
        """Start heartbeating ``handle``; the first beat is due one interval
        after now.

        Parameters
        ----------
        claimed
            The monotonic instant just before the claim was made (default
            now): the lease is known to hold for one visibility timeout
            from then.
        """
        now = self._monotonic()
        interval = handle.visibility_timeout_s * HEARTBEAT_FRACTION
        start = now if claimed is None else claimed
        beat = AsyncLease(
            handle,
            interval,
            now + interval,
            start + handle.visibility_timeout_s,
            monotonic=self._monotonic,
        )
        async with self._cond:
            self._beats.add(beat)
            if beat.next_at < self._wake_at:
                self._changed = True
                self._cond.notify()
        return beat

    async def remove(self, beat: AsyncLease) -> None:
        """Stop heartbeating: the job's outcome is being recorded."""
        beat.done = True
        async with self._cond:
            self._beats.discard(beat)

    async def beat_due(self) -> float:
        """Heartbeat every job whose beat is due; return the seconds until
        the next one is (``inf`` when no job is running).

        Raises
        ------
        StoreClosedError
            If the store was closed.
        """
        now = self._monotonic()
        async with self._cond:
            due = [beat for beat in self._beats if beat.next_at <= now and not beat.lost]
        for beat in due:
            try:
                await beat.renew()
            except StoreClosedError:
                raise
            except Exception as error:
                log.warning(
                    "heartbeat of job %s of %r failed; trying again",
                    beat.handle.id,
                    beat.handle.queue,
                    exc_info=True,
                )
                beat.next_at = now + min(beat.interval_s, _RETRY_AFTER_ERROR_S)
                if (
                    isinstance(error, EngineError)
                    and error.permanent
                    and self._on_permanent is not None
                ):
                    self._on_permanent(error)
        async with self._cond:
            pending = [beat.next_at for beat in self._beats if not beat.lost]
        return max(0.0, min(pending) - self._monotonic()) if pending else math.inf

    def start(self) -> None:
        """Start beating in the background."""
        self._runner = aspawn(self._run, name=self._name)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sending beats (running jobs then lapse) and wait up to
        ``timeout_s`` seconds for the background work to end; in the async
        form, a task still running then is cancelled and waited for up to
        ``timeout_s`` seconds more."""
        async with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._runner is not None:
            await ajoin(self._runner, timeout_s)
            if is_async():
                # A task still running is cancelled, and given as long again
                # to end (a no-op for one that ended); a thread cannot be.
                self._runner.cancel()
                await ajoin(self._runner, timeout_s)

    async def _run(self) -> None:
        # stop() sets _stopping and notifies: the next pass sees it.
        while True:
            try:
                wait_s = await self.beat_due()
            except StoreClosedError:
                return
            except Exception:
                # A bug must not end the heartbeats: every running job's claim
                # would lapse while its handler ran on.
                log.exception("heartbeating failed; trying again")
                wait_s = _RETRY_AFTER_ERROR_S
            async with self._cond:
                if self._stopping:
                    return
                if self._changed:  # a job came in since beat_due() looked
                    self._changed = False
                    continue
                self._wake_at = self._monotonic() + wait_s
                await self._cond.wait_for(
                    lambda: self._stopping or self._changed,
                    None if math.isinf(wait_s) else wait_s,
                )
                self._wake_at = math.inf
                self._changed = False
