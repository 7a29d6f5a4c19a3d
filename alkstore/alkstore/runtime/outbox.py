# WARNING: generated from outbox_async.py by tools/async_to_sync.py.
# Do not edit: change outbox_async.py, then run `python tools/async_to_sync.py`.
"""The transactional :class:`Outbox`: messages written with the business data
and relayed afterwards, at least once (docs/outbox.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from alkstore._acompat import Event, wait_event
from alkstore.errors import EngineError, ValidationError
from alkstore.logic import validation as v
from alkstore.runtime._caller import caller
from alkstore.runtime.context import JobContext
from alkstore.runtime.heartbeat import Heartbeater
from alkstore.runtime.lease import Lease, retry_or_bury, write_while_held
from alkstore.runtime.outcome import describe_exception

if TYPE_CHECKING:
    from alkstore.contract.queue import Queue

__all__ = ["DEFAULT_RELAY_BATCH", "Outbox", "Send"]

log = logging.getLogger("alkstore.outbox")

#: Messages a relay claims at a time.
DEFAULT_RELAY_BATCH = 100
#: Seconds a relay waits for a wake before it polls again.
DEFAULT_RELAY_POLL_S = 1.0
# How often a waiting relay looks at its stop event.
_STOP_SLICE_S = 0.1

#: Delivers one message; returning means delivered, raising means retry. A
#: plain function or a coroutine function (``async def``), whose coroutine
#: is awaited (docs/outbox.md). Called with the message, or, relayed with
#: ``takes_context=True``, with its :class:`~alkstore.JobContext` and the
#: message (docs/outbox.md "Deduplicating").
Send = Callable[..., object]
#: A relay's call of ``send`` on one message, or on its context and the
#: message (:func:`~alkstore.runtime._caller.caller`).
_Deliver = Callable[..., object]


class Outbox:
    """A transactional outbox over one queue (the pattern of
    microservices.io's "Transactional outbox"; docs/outbox.md).

    :meth:`add` writes a message in the caller's own database transaction,
    so it exists exactly when the business write beside it commits. A relay
    (:meth:`relay_once`, :meth:`relay`, or a worker running an
    ``App.relay``) claims messages and hands each to ``send``; a message is
    acked once ``send`` returns, and retried with the queue's backoff when it
    raises. Delivery is at least once: a relay that dies between ``send``
    and the ack, or a claim that lapses, sends the message again, so
    ``send`` must be idempotent or the receiver must deduplicate: relayed
    with ``takes_context=True``, ``send(context, message)`` gets the
    message's :class:`~alkstore.JobContext`, whose ``context.job.id`` is a
    stable key (unique in the store, never reused; docs/outbox.md
    "Deduplicating").

    ``send`` may be a plain function or a coroutine function (``async
    def``). Relayed from async code, a coroutine function's coroutine is
    awaited on the running loop and a plain function runs on a thread
    (``asyncio.to_thread``), so a blocking ``send`` never blocks the loop.
    Relayed from sync code, a plain function runs on the relay's thread and
    a coroutine function on an event loop: a worker's own when a worker
    runs the relay, else one the call owns, on the relay's thread.

    Parameters
    ----------
    queue
        The queue the messages live in; its ``opts`` give their visibility
        timeout, ``max_attempts`` and backoff. Messages that exhaust their
        attempts are dead letters (``Queue.dead_jobs``).
    """

    def __init__(self, queue: Queue) -> None:
        from alkstore.contract.queue import Queue

        if not isinstance(queue, Queue):
            raise ValidationError(f"an Outbox needs a Queue, not {type(queue).__name__}")
        self._queue = queue

    def __repr__(self) -> str:
        return f"<Outbox {self._queue.name!r}>"

    @property
    def queue(self) -> Queue:
        """The queue holding the messages."""
        return self._queue

    def add(self, conn: Any, message: object, **options: Any) -> int:
        """Write ``message`` inside the caller's open transaction on ``conn``.

        Commit makes it visible and wakes relays; rollback leaves nothing
        (docs/contract.md §3 "Transactional enqueue"). alkstore never commits ``conn``.

        Parameters
        ----------
        conn
            The engine's driver connection inside a transaction, as
            :meth:`Queue.enqueue_tx` takes it (``sqlite3.Connection``
            on the store's file, ``psycopg.Connection`` on its database;
            an engine with native async primitives takes its async driver's
            connection, docs/async.md).
        message
            A payload (docs/contract.md §3 "Payload").
        options
            :meth:`Queue.enqueue`'s keywords (``delay``, ``priority``, ...).

        Returns
        -------
        int
            The message's id.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
            As :meth:`Queue.enqueue_tx`; a refused message aborts nothing.
        """
        return self._queue.enqueue_tx(conn, message, **options)

    def relay_once(
        self,
        send: Send,
        *,
        worker_id: str,
        batch_size: int = DEFAULT_RELAY_BATCH,
        takes_context: bool = False,
    ) -> int:
        """Claim up to ``batch_size`` messages and ``send`` each in claim order.

        The messages ``send`` returned for are acked with one
        :meth:`Queue.ack_many`; each one it raised for is retried with the
        exception's text as ``last_error`` and the queue's backoff (dead at
        its attempt budget, with ``last_error`` ``"max attempts exceeded;
        last error: <text>"``, :func:`~alkstore.runtime.lease.retry_or_bury`).
        Until its ack or retry, every claimed message is heartbeaten in the
        background every third of its visibility timeout, as a worker's
        jobs are, so a slow ``send`` does not let the batch lapse and be
        handed out again; an ack or retry that fails on an error that may
        pass is tried again while the claims hold
        (:func:`~alkstore.runtime.lease.write_while_held`).

        Parameters
        ----------
        send
            Called with each decoded message; returning means delivered,
            raising means "not delivered". A plain function or a coroutine
            function (``async def``, a ``functools.partial`` of one, an
            object whose ``__call__`` is one), whose coroutine is awaited:
            the message is acked only once it returned. A generator or
            async generator function is refused with ``ValidationError``
            before anything is claimed; a plain function that returns an
            awaitable or a generator has not delivered: the message is
            retried. ``BaseException``\\ s other than ``Exception``
            (``KeyboardInterrupt``, a cancellation) propagate; the unacked
            claims then lapse and are sent again.
        worker_id
            Recorded on the claims (1 to 255 characters).
        batch_size
            ``1 .. 10000``.
        takes_context
            Call ``send(context, message)`` instead, ``context`` being the
            message's :class:`~alkstore.JobContext` (its ``job.id``, its
            claim's heartbeat; docs/outbox.md "Deduplicating"): a plain
            ``send`` calls ``context.heartbeat()``, an ``async def`` one
            awaits ``context.aheartbeat()``.

        Returns
        -------
        int
            How many messages ``send`` delivered in this call.

        Raises
        ------
        StoreClosedError, ValidationError, EngineError
        """
        self._queue.store._check_open()
        heartbeater = self._heartbeater()
        try:
            batch_size = v.int_in_range(batch_size, "batch_size", 1, 10_000)
            if not callable(send):
                raise ValidationError("send must be callable")
            _check_takes_context(takes_context)
            with caller(send, "send") as deliver:
                relayed = self._relay_batch(
                    deliver, worker_id, batch_size, heartbeater, takes_context
                )
                return relayed[1]
        finally:
            heartbeater.stop()

    def _heartbeater(self) -> Heartbeater:
        heartbeater = Heartbeater(f"alkstore-outbox-{self._queue.name}")
        heartbeater.start()
        return heartbeater

    def _relay_batch(
        self,
        deliver: _Deliver,
        worker_id: str,
        batch_size: int,
        heartbeater: Heartbeater,
        takes_context: bool,
    ) -> tuple[int, int]:
        """Relay one batch; return (claimed, delivered)."""
        claimed = time.monotonic()
        handles = self._queue.claim_batch(worker_id, batch_size)
        if not handles:
            return 0, 0
        leases = [heartbeater.add(handle, claimed) for handle in handles]
        done: list[Lease] = []
        try:
            for lease in leases:
                if self._send(deliver, lease, heartbeater, takes_context):
                    done.append(lease)
        finally:
            try:
                self._ack(done)  # still heartbeaten meanwhile
            finally:
                for lease in leases:
                    heartbeater.remove(lease)
        return len(handles), len(done)

    def _send(
        self,
        deliver: _Deliver,
        lease: Lease,
        heartbeater: Heartbeater,
        takes_context: bool,
    ) -> bool:
        handle = lease.handle
        try:
            if takes_context:
                deliver(JobContext(lease), handle.job.payload)
            else:
                deliver(handle.job.payload)
        except Exception as exc:
            lease.done = True  # a heartbeat refused from now on is the retry's doing
            error = describe_exception(exc)
            retried = write_while_held(
                lambda: retry_or_bury(handle, error),
                [lease],
                f"retrying message {handle.id} of outbox {self._queue.name!r}",
            )
            heartbeater.remove(lease)
            if retried and handle.attempts >= handle.max_attempts:
                log.error(
                    "outbox %r: message %d is dead after %d attempt(s), its last send failing: %s",
                    self._queue.name,
                    handle.id,
                    handle.attempts,
                    exc,
                )
            else:
                log.warning(
                    "outbox %r: sending message %d failed (attempt %d of %d)%s: %s",
                    self._queue.name,
                    handle.id,
                    handle.attempts,
                    handle.max_attempts,
                    "" if retried else ", and its claim had lapsed",
                    exc,
                )
            return False
        return True

    def _ack(self, leases: list[Lease]) -> None:
        if not leases:
            return
        for lease in leases:
            lease.done = True
        handles = [lease.handle for lease in leases]
        acked = write_while_held(
            lambda: self._queue.ack_many(handles),
            leases,
            f"acking {len(handles)} delivered message(s) of outbox {self._queue.name!r}",
        )
        if not all(acked):
            log.warning(
                "outbox %r: some delivered messages could not be acked (claims lapsed); "
                "they will be sent again",
                self._queue.name,
            )

    def relay(
        self,
        send: Send,
        *,
        worker_id: str,
        batch_size: int = DEFAULT_RELAY_BATCH,
        stop: Event | None = None,
        poll_interval_s: object = DEFAULT_RELAY_POLL_S,
        takes_context: bool = False,
    ) -> int:
        """Relay until ``stop`` is set: :meth:`relay_once` while messages are
        ready, then wait for a wake (``Store.listen``) or ``poll_interval_s``.

        Parameters
        ----------
        send, worker_id, batch_size, takes_context
            As :meth:`relay_once`.
        stop
            Set it (a threading.Event) to return after the current batch.
        poll_interval_s
            Seconds, ``> 0``: the longest wait between polls when no wake
            arrives (docs/contract.md §3 "Wake": wakes are hints).

        Returns
        -------
        int
            How many messages were delivered in all.

        Raises
        ------
        StoreClosedError, ValidationError
            ``EngineError`` from a claim is logged and retried after the
            poll interval instead, unless it is ``permanent``.
        EngineError
            A permanent one (the database cannot be written, docs/contract.md §2
            "Errors"): retrying could not help.
        """
        poll_s = v.duration_s(poll_interval_s, "poll_interval_s", positive=True)
        v.worker_id(worker_id)
        batch_size = v.int_in_range(batch_size, "batch_size", 1, 10_000)
        if not callable(send):
            raise ValidationError("send must be callable")
        _check_takes_context(takes_context)
        if stop is None:
            stop = Event()
        elif not isinstance(stop, Event):
            raise ValidationError(f"stop must be a threading.Event, not {type(stop).__name__}")
        total = 0
        heartbeater = self._heartbeater()
        try:
            with (
                caller(send, "send") as deliver,
                self._queue.store.listen(self._queue.name) as subscription,
            ):
                while not stop.is_set():
                    try:
                        claimed, sent = self._relay_batch(
                            deliver, worker_id, batch_size, heartbeater, takes_context
                        )
                    except ValidationError:
                        raise
                    except Exception as exc:
                        if self._queue.store.closed or (
                            isinstance(exc, EngineError) and exc.permanent
                        ):
                            raise
                        log.warning(
                            "outbox %r: relay failed; retrying", self._queue.name, exc_info=True
                        )
                        wait_event(stop, poll_s)
                        continue
                    total += sent
                    if claimed < batch_size:  # drained: wait for a wake, the poll or stop
                        deadline = time.monotonic() + poll_s
                        while not stop.is_set():
                            left = deadline - time.monotonic()
                            if left <= 0 or subscription.wait(min(left, _STOP_SLICE_S)):
                                break
        finally:
            heartbeater.stop()
        return total


def _check_takes_context(takes_context: object) -> None:
    if not isinstance(takes_context, bool):
        raise ValidationError(f"takes_context must be a bool, not {type(takes_context).__name__}")
