"""The LISTEN connection of one store and the worker that reads it
(docs/contract.md §3 "Wake"; the channels are :mod:`alkstore_postgres._wake`'s).

One dedicated autocommit connection per store LISTENs on the channels of
the store's subscriptions; the listener's own worker (a task of the event
loop in ``_listener_async``, written by hand; a thread in ``_listener``,
generated from it: docs/async.md "How the engines do it") waits for it to
become readable (psycopg's ``notifies()`` then reads the notifications)
and sets the subscriptions' latches.

When the connection dies (server restart, ``pg_terminate_backend``, network
loss found by an idle-time ping) the listener reconnects by itself (pauses
from 0.05 s doubling to 2 s), LISTENs on every channel again and then sets
every latch once: wakes sent while it was down are lost, and a spurious
wake is harmless, a missing one is not. Every statement on the connection,
the ping included, runs under the store's watchdog, so a connection that
stopped answering (a proxy that stopped forwarding looks no different) is
given up after ``query_timeout_s``; the ping comes after
``ping_interval_s`` of silence, or at once when another call of the store
found its connection dead (:meth:`AsyncListener.check_soon`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import sql

from alkstore.engine_async import (
    ACondition,
    AEvent,
    ALock,
    ASpawned,
    ajoin,
    aspawn,
    await_event,
    is_async,
)
from alkstore.errors import AlkstoreError, EngineError, StoreClosedError
from alkstore_postgres._acompat import AWakeLatch, AWaker
from alkstore_postgres._connection import drop_inherited, engine_error
from alkstore_postgres._database_async import AsyncConn
from alkstore_postgres._watchdog import Watchdog

__all__ = ["AsyncListener"]

log = logging.getLogger("alkstore.postgres")

T = TypeVar("T")

# Seconds a new subscription waits for its LISTEN to be in place.
_SYNC_TIMEOUT_S = 30.0
# Seconds between reconnection attempts: the first is immediate, then the
# pause doubles from the first value up to the second.
_RECONNECT_FIRST_S = 0.05
_RECONNECT_MAX_S = 2.0
# Seconds AsyncListener.stop lets a statement in progress on the connection
# end by itself (an UNLISTEN of the subscription closed just before, say)
# before it breaks it off; then seconds it waits for the listener to end.
_STOP_GRACE_S = 0.2
_STOP_TIMEOUT_S = 5.0


def _listen(channel: str) -> sql.Composed:
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel))


def _unlisten(channel: str) -> sql.Composed:
    return sql.SQL("UNLISTEN {}").format(sql.Identifier(channel))


class AsyncListener:
    """The LISTEN connection of one store and the worker that reads it (a
    task of the store's event loop for the async listener, a daemon thread
    for the sync one).

    Parameters
    ----------
    connect
        Opens a new autocommit connection (raises ``EngineError``).
    watchdog
        Bounds every statement on the connection.
    ping_interval_s
        Seconds of silence after which the listener checks the connection
        with a ping, to find a connection that died silently.
    name
        The worker's name.
    disabled
        When given, why the store cannot LISTEN (behind a transaction
        pooler without ``listen_url``): subscriptions are kept (and their
        latches set when the listener stops) but nothing is LISTENed on and
        nothing wakes them; the reason is logged as a WARNING at the first
        subscription.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[AsyncConn]],
        *,
        watchdog: Watchdog,
        ping_interval_s: float,
        name: str,
        disabled: str | None = None,
    ) -> None:
        self._connect = connect
        self._disabled = disabled
        self._warned = False
        self._watchdog = watchdog
        self._ping_interval_s = ping_interval_s
        self._name = name
        self._cond = ACondition()
        self._latches: dict[str, set[AWakeLatch]] = {}
        # Generations of the wanted channel set: bumped by every change,
        # published as synced once the listener's LISTENs match it (or it
        # is reconnecting, which LISTENs on everything anyway).
        self._wanted = 0
        self._synced = 0
        self._calls: list[_Result[Any]] = []
        # Ping at the next turn, without waiting for the interval.
        self._check = False
        self._stopped = False
        self._start_lock = ALock()
        self._worker: ASpawned | None = None
        self._waker: AWaker | None = None
        # The listener's latest connection (for a forked child to drop).
        self._conn: AsyncConn | None = None
        _listeners.add(self)

    # -- the callers' side ---------------------------------------------------

    async def subscribe(self, channel: str, latch: AWakeLatch) -> None:
        """Set ``latch`` on every notification on ``channel``; return once
        the LISTEN is in place (or will be on reconnection).

        Raises
        ------
        EngineError
            If the first LISTEN connection cannot be opened.
        StoreClosedError
            If the listener was stopped.
        """
        async with self._cond:
            if self._stopped:
                raise StoreClosedError("the store is closed")
            self._latches.setdefault(channel, set()).add(latch)
            self._wanted += 1
            target = self._wanted
            if self._disabled is not None:
                warn, self._warned = not self._warned, True
                if warn:
                    log.warning("%s", self._disabled)
                return
        try:
            await self._start()
            self._poke()
            async with self._cond:
                synced = await self._cond.wait_for(
                    lambda: self._synced >= target or self._stopped, _SYNC_TIMEOUT_S
                )
        except BaseException:
            # The caller gets no subscription to close (a failed first
            # connect; the async caller's task cancelled).
            await self.unsubscribe(channel, latch)
            raise
        if not synced:
            # The wake is a hint and the listener keeps trying; consumers
            # re-poll, so a slow LISTEN delays work but strands nothing.
            log.warning("LISTEN on %r not confirmed after %s s", channel, _SYNC_TIMEOUT_S)

    async def unsubscribe(self, channel: str, latch: AWakeLatch) -> None:
        """Stop setting ``latch``; UNLISTEN when no latch wants ``channel``."""
        async with self._cond:
            latches = self._latches.get(channel)
            if latches is None or latch not in latches:
                return
            latches.discard(latch)
            if not latches:
                del self._latches[channel]
            self._wanted += 1
        self._poke()

    async def call(
        self, fn: Callable[[AsyncConn], Awaitable[T]], timeout_s: float = _SYNC_TIMEOUT_S
    ) -> T:
        """Run ``fn(conn)`` on the LISTEN connection, in the listener's
        own turn (for diagnostics, such as ``pg_listening_channels()``).

        Raises
        ------
        EngineError
            If the connection is down, ``fn`` fails or the call times out.
        """
        result = _Result(fn)
        async with self._cond:
            if self._stopped or self._worker is None:
                raise EngineError("the listener is not running")
            self._calls.append(result)
        self._poke()
        return await result.wait(timeout_s)

    def check_soon(self) -> None:
        """Ping the connection now rather than after the idle interval (a
        call on another connection of the store got no answer). From the
        watchdog's thread for the sync listener; on the loop for the async
        one."""
        # Read and reset by the listener only when set (see _run): a check
        # asked for meanwhile is never lost, at worst it shares a ping.
        self._check = True
        self._poke()

    async def stop(self) -> None:
        """Stop the listener, close the connection and set every latch so
        that no waiter stays blocked; a statement waiting for the server is
        broken off. Idempotent."""
        async with self._cond:
            if self._stopped:
                return
            self._stopped = True
            latches = [latch for group in self._latches.values() for latch in group]
            calls, self._calls = self._calls, []
            self._cond.notify_all()
        for result in calls:
            result.fail(StoreClosedError("the store is closed"))
        # Before any wait: a stop that is itself cancelled (or times out)
        # still leaves no waiter blocked.
        for latch in latches:
            latch.set()
        async with self._start_lock:
            worker = self._worker
        if worker is None:
            return
        ended = False
        try:
            self._poke()
            ended = await ajoin(worker, _STOP_GRACE_S)
            conn = self._conn
            if not ended and conn is not None:
                self._watchdog.interrupt(conn)
            ended = ended or await ajoin(worker, _STOP_TIMEOUT_S)
        finally:
            if ended and self._waker is not None:
                self._waker.close()
            if is_async():
                # A task still running is cancelled (a no-op for one that
                # ended), even when this stop was; a thread cannot be.
                worker.cancel()

    def _after_fork_in_child(self) -> None:
        # The listener did not survive fork(), and its connection shares its
        # session with the parent (see drop_inherited): start from nothing
        # (the next subscription starts a listener and a connection of this
        # process's own). Subscriptions made before the fork no longer wake,
        # as in the SQLite engine (D15).
        if self._conn is not None:
            drop_inherited(self._conn)
            self._conn = None
        if self._waker is not None:
            self._waker.close()  # this process's copies only
        self._cond = ACondition()
        self._start_lock = ALock()
        self._latches = {}
        self._wanted = self._synced = 0
        self._calls = []
        self._check = False
        self._worker = None
        self._waker = None

    # -- the listener's side -------------------------------------------------

    async def _start(self) -> None:
        async with self._start_lock:
            if self._worker is not None:
                return
            conn = self._conn = await self._connect()
            self._waker = AWaker()
            self._worker = aspawn(self._run, (conn,), name=self._name)

    def _poke(self) -> None:
        waker = self._waker
        if waker is not None:
            waker.poke()

    async def _is_stopped(self) -> bool:
        async with self._cond:
            return self._stopped

    async def _set_all(self) -> None:
        async with self._cond:
            latches = [latch for group in self._latches.values() for latch in group]
        for latch in latches:
            latch.set()

    async def _dispatch(self, conn: AsyncConn) -> None:
        notifies = [notify async for notify in conn.notifies(timeout=0)]
        if not notifies:
            return
        async with self._cond:
            latches = [
                latch
                for channel in {n.channel for n in notifies}
                for latch in self._latches.get(channel, ())
            ]
        for latch in latches:
            latch.set()

    async def _run(self, conn: AsyncConn | None) -> None:
        waker = self._waker
        assert waker is not None
        listening: set[str] = set()
        lost = False
        # The pause before the next reconnection: it grows while new
        # connections fail before their LISTENs are in place (a hot standby
        # accepts the connection and refuses LISTEN), so that is retried
        # with backoff rather than in a tight loop.
        pause = 0.0
        try:
            while True:
                if conn is None:
                    # What is asked meanwhile (a channel, a call) is read
                    # below, once connected; a stop fails the calls.
                    conn = self._conn = await self._reconnect(pause)
                    if conn is None:
                        return
                    pause = _next_pause(pause)
                    listening = set()
                    lost = True
                async with self._cond:
                    if self._stopped:
                        return
                    wanted = set(self._latches)
                    generation = self._wanted
                    calls, self._calls = self._calls, []
                    check = self._check
                    if check:
                        self._check = False
                if lost:
                    check = False  # a new connection needs no ping
                guard = self._watchdog.guard
                try:
                    async with guard(conn):
                        for channel in sorted(wanted - listening):
                            await conn.execute(_listen(channel))
                            listening.add(channel)
                        for channel in sorted(listening - wanted):
                            await conn.execute(_unlisten(channel))
                            listening.discard(channel)
                    async with self._cond:
                        self._synced = max(self._synced, generation)
                        self._cond.notify_all()
                    if lost:
                        await self._set_all()
                        lost = False
                        pause = 0.0
                    while calls:
                        call_guard = guard(conn)
                        await calls.pop(0).run(conn, call_guard)
                        if call_guard.expired:
                            raise self._watchdog.timeout_error()
                    async with guard(conn):
                        await self._dispatch(conn)
                        if check:
                            await self._ping(conn, listening)
                    readable, poked = await waker.wait(conn.fileno(), self._ping_interval_s)
                    if readable:
                        async with guard(conn):
                            await self._dispatch(conn)
                    elif not poked:
                        # An idle-time ping finds a silently dead connection.
                        async with guard(conn):
                            await self._ping(conn, listening)
                except (psycopg.Error, AlkstoreError, OSError, ValueError) as error:
                    for result in calls:
                        result.fail(EngineError(f"the LISTEN connection failed: {error}"))
                    if not await self._is_stopped():
                        log.warning("the LISTEN connection failed (%s); reconnecting", error)
                    await _close_quietly(conn)
                    # Wakes are lost from now until the LISTENs are back;
                    # every latch is set once they are (``lost``).
                    conn = None
        finally:
            if conn is not None:
                await _close_quietly(conn)

    @staticmethod
    async def _ping(conn: AsyncConn, listening: set[str]) -> None:
        # Repeating a LISTEN is a no-op that keeps the backend findable by
        # its LISTEN in pg_stat_activity.
        if listening:
            await conn.execute(_listen(min(listening)))
        else:
            await conn.execute("SELECT 1")

    async def _reconnect(self, pause: float) -> AsyncConn | None:
        # Waits ``pause`` seconds first (unless 0), then longer after each
        # failed connect.
        waker = self._waker
        assert waker is not None
        while True:
            async with self._cond:
                if self._stopped:
                    return None
                # Subscribers need not wait: the new connection LISTENs on
                # every wanted channel and then sets every latch.
                self._synced = self._wanted
                self._cond.notify_all()
            if pause:
                await waker.wait(None, pause)
                if await self._is_stopped():
                    return None
            try:
                return await self._connect()
            except AlkstoreError as error:
                log.warning("cannot reopen the LISTEN connection: %s", error)
            pause = _next_pause(pause)


def _next_pause(pause: float) -> float:
    return min(max(pause * 2, _RECONNECT_FIRST_S), _RECONNECT_MAX_S)


# Every listener of this process, to reset in a forked child.
_listeners: weakref.WeakSet[AsyncListener] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for listener in list(_listeners):
        listener._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Result(Generic[T]):
    """The outcome of an :meth:`AsyncListener.call`, handed to the caller."""

    def __init__(self, fn: Callable[[AsyncConn], Awaitable[T]]) -> None:
        self._fn = fn
        self._done = AEvent()
        self._value: T | None = None
        self._error: BaseException | None = None

    async def run(self, conn: AsyncConn, guard: AbstractAsyncContextManager[None]) -> None:
        try:
            async with guard:
                self._value = await self._fn(conn)
        except psycopg.Error as error:
            wrapped = engine_error(error)
            wrapped.__cause__ = error
            self._error = wrapped
        except Exception as error:  # the guard's EngineError too
            self._error = error
        finally:
            self._done.set()

    def fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def wait(self, timeout_s: float) -> T:
        if not await await_event(self._done, timeout_s):
            raise EngineError(f"the listener did not answer within {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


async def _close_quietly(conn: AsyncConn) -> None:
    with contextlib.suppress(Exception):
        await conn.close()
