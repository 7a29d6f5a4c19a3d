"""The :class:`JobContext` a task or a relay's ``send`` gets when it asks for
it with ``takes_context=True`` (docs/tasks-and-workers.md "Job context",
docs/outbox.md "Deduplicating").

A context is a view of the worker's (or the relay's) lease on one claim
(:class:`~alkstore.runtime.lease.Lease`): the job as claimed, whether the
claim was lost or the job cancelled (what the lease's heartbeats found), and
a heartbeat that goes through the lease, so the worker's own heartbeats and
what it knows of the claim's end stay one record.

No asyncio import at module level: ``import alkstore`` imports the worker,
which imports this module.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from alkstore._off_loop import on_thread
from alkstore.runtime.lease import Lease

if TYPE_CHECKING:
    import asyncio

    from alkstore.contract.job import Job
    from alkstore.runtime.lease_async import AsyncLease

__all__ = ["JobContext"]


class JobContext:
    """What a running job knows of its claim: the first argument of a task
    registered with ``@app.task(takes_context=True)``, and of a relay's
    ``send`` registered with ``takes_context=True`` (docs/tasks-and-workers.md
    "Job context").

    Made by the worker (or the relay) for each claim it runs; never made by
    hand. The same context serves sync and async code: :meth:`heartbeat`
    blocks, ``await`` :meth:`aheartbeat` does not block the event loop.

    Attributes
    ----------
    job
        The :class:`~alkstore.Job` snapshot taken at the claim: ``id`` (a
        stable key for deduplication: unique in the store, never reused),
        ``queue``, ``attempts`` (this claim's count, from 1),
        ``max_attempts``, ``payload``, ``claim_deadline`` as claimed...
        Not refreshed by heartbeats.
    cancelled
        ``True`` once the worker learned that the job was cancelled
        (``Queue.cancel``) while it ran: at its next heartbeat, at most a
        third of the visibility timeout after the cancel (later after a
        :meth:`heartbeat` with an ``extend`` past the timeout, which pauses
        the worker's own beats), or at once when :meth:`heartbeat` is
        refused for that reason. The handler runs on
        (nothing interrupts it) and its outcome is not recorded: stop early.
    lost
        ``True`` once a heartbeat found the claim lapsed for another reason
        than a cancel (it ran past its deadline unbeaten, and may have been
        reclaimed and run elsewhere). Its outcome will not be recorded either.
    """

    __slots__ = ("_lease", "_loop")

    def __init__(self, lease: Lease | AsyncLease) -> None:
        self._lease = lease
        # The loop an async lease belongs to (its store calls run there).
        self._loop: asyncio.AbstractEventLoop | None = None
        if not isinstance(lease, Lease):
            import asyncio

            self._loop = asyncio.get_running_loop()

    def __repr__(self) -> str:
        job = self.job
        state = "cancelled" if self.cancelled else "lost" if self.lost else "held"
        return f"<JobContext job {job.id} of {job.queue!r}, attempt {job.attempts}, {state}>"

    @property
    def job(self) -> Job:
        """The job as claimed (see the class docstring)."""
        return self._lease.handle.job

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled while it ran (see the class docstring)."""
        return self._lease.cancelled

    @property
    def lost(self) -> bool:
        """Whether the claim lapsed, the job not cancelled (see the class
        docstring)."""
        return self._lease.lost and not self._lease.cancelled

    def heartbeat(self, extend: object = None) -> bool:
        """Extend the claim now: its deadline becomes the store's now plus
        ``extend`` (docs/tasks-and-workers.md "Job context"). The worker
        heartbeats every running job by itself; this is for a handler that
        wants a longer claim than the visibility timeout gives, or to learn
        at once whether its claim still holds. The worker's own beats resume
        one beat interval (a third of the visibility timeout) after the
        claim has no more time left than such a beat gives: they never
        shorten what this set.

        Blocks for one store round trip: from a coroutine, ``await``
        :meth:`aheartbeat`.

        Parameters
        ----------
        extend
            Seconds (or a ``timedelta``), ``> 0``; default the row's
            visibility timeout (``Job.visibility_timeout_s``). An ``extend``
            shorter than a beat interval may let the claim lapse before the
            worker's next beat.

        Returns
        -------
        bool
            ``True`` if the claim was extended; ``False`` when it is no
            longer this worker's: :attr:`cancelled` or :attr:`lost` is then
            ``True`` already.

        Raises
        ------
        ValidationError
            For an ``extend`` that is not a positive duration (before any I/O).
        StoreClosedError, EngineError
            As ``JobHandle.heartbeat`` (the database unreachable: the
            worker's own beats try again).
        RuntimeError
            When called on the event loop that runs an :class:`AsyncOutbox`
            relay's claims, which it would block: ``await`` :meth:`aheartbeat`
            there.
        """
        lease = self._lease
        if isinstance(lease, Lease):
            return lease.renew(extend)
        import asyncio

        loop = self._loop
        assert loop is not None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError(
                "JobContext.heartbeat() would block the event loop it runs on; "
                "use `await context.aheartbeat()` there"
            )
        return asyncio.run_coroutine_threadsafe(lease.renew(extend), loop).result()

    async def aheartbeat(self, extend: object = None) -> bool:
        """:meth:`heartbeat` for async code, without blocking the event loop:
        the same parameters, result and errors (no ``RuntimeError``). A
        worker's async task awaits its claim's heartbeat on a thread of its
        own, as the worker's heartbeats run on its heartbeat thread."""
        lease = self._lease
        if isinstance(lease, Lease):
            return await on_thread(functools.partial(lease.renew, extend), "alkstore-heartbeat")
        return await lease.renew(extend)
