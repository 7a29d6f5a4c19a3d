"""The PostgreSQL engine's own thread and task pairs, for its generated modules.

The engine's I/O modules are written once, for asyncio (``_*_async.py``);
tools/async_to_sync.py generates the sync modules from them (docs/async.md
"How the engines do it"), renaming each async name to its sync twin, as
psycopg_pool's ``_acompat`` does. The generic pairs (a lock, an event, a
condition, a task or a thread, ``sleep``, ``is_async``) are alkstore's
(:mod:`alkstore.engine` / :mod:`alkstore.engine_async`, defined in
``alkstore._acompat``); the pairs here are the engine's, built on them:

- ``from_thread``/``afrom_thread``: where a callback another thread calls
  (the watchdog's) runs;
- ``Busy``/``ABusy``: a mutex taken without waiting (compaction);
- ``Waker``/``AWaker``: what wakes the listener waiting on its socket;
- ``WakeLatch``/``AWakeLatch``: a subscription's latch;
- ``take_whole``/``atake_whole``: taking a pooled connection, which a
  cancellation never cuts in half;
- ``aclose_at_loop_end``, with no sync twin (it runs under ``if is_async():``).

Each pair has one meaning and two implementations: the sync one for
threads, the async one for the tasks of the event loop that opened the
store (an async store is used from that loop only; nothing here is
thread-safe on the async side unless it says so). Both sides share this
one module: the engine imports psycopg, and so asyncio, in both faces.

Hand-written, never generated: the two sides differ by nature.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from alkstore.engine import Lock, WakeLatch
from alkstore.engine_async import AEvent, ASpawned, aspawn, await_event

__all__ = [
    "ABusy",
    "AWakeLatch",
    "AWaker",
    "Busy",
    "WakeLatch",
    "Waker",
    "aclose_at_loop_end",
    "afrom_thread",
    "atake_whole",
    "from_thread",
    "take_whole",
]

T = TypeVar("T")

log = logging.getLogger("alkstore.postgres")


def from_thread(fn: Callable[[T], None]) -> Callable[[T], None]:
    """``fn`` itself: a callback that another thread calls (the watchdog's)
    runs there, as every sync call may."""
    return fn


def afrom_thread(fn: Callable[[T], None]) -> Callable[[T], None]:
    """A callable that any thread may call to run ``fn`` on the event loop
    running now (the store's), soon; dropped once that loop is closed."""
    loop = asyncio.get_running_loop()

    def call(arg: T) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed
            loop.call_soon_threadsafe(fn, arg)

    return call


def take_whole(take: Callable[[], T], give_back: Callable[[T], object]) -> T:
    """``take()``: a thread is never interrupted halfway through it."""
    return take()


async def atake_whole(
    take: Callable[[], Awaitable[T]], give_back: Callable[[T], Coroutine[Any, Any, None]]
) -> T:
    """``await take()``, which a cancellation of the caller never cuts in
    half: it runs as a task of its own, and if the caller is cancelled
    meanwhile, that task still finishes and what it took goes back through
    ``give_back`` (a pooled connection cancelled while psycopg_pool hands
    it over would otherwise be lost to the pool for good)."""
    task = asyncio.ensure_future(take())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:

        def finished(done: asyncio.Future[T]) -> None:
            if not done.cancelled() and done.exception() is None:
                aspawn(give_back, (done.result(),), name="give back a cancelled take")

        task.add_done_callback(finished)
        raise


class Busy:
    """A mutex that is taken without waiting, or not at all (for work that
    one caller at a time does and the others skip)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = Lock()

    def take(self) -> bool:
        """Take it if it is free; ``True`` if taken."""
        return self._lock.acquire(blocking=False)

    def give(self) -> None:
        """Free it (after a :meth:`take` that returned ``True``)."""
        self._lock.release()


class ABusy:
    """:class:`Busy` for one event loop: a flag, since only the loop's one
    thread takes it and nothing between the test and the set can yield."""

    __slots__ = ("_taken",)

    def __init__(self) -> None:
        self._taken = False

    def take(self) -> bool:
        """Take it if it is free; ``True`` if taken."""
        if self._taken:
            return False
        self._taken = True
        return True

    def give(self) -> None:
        """Free it (after a :meth:`take` that returned ``True``)."""
        self._taken = False


class Waker:
    """Wakes a thread blocked in :meth:`wait` (on a socket's readiness and a
    timeout) from any other thread: a socket pair, written by :meth:`poke`
    and watched beside the socket."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)

    def poke(self) -> None:
        """End the current (or the next) :meth:`wait`; from any thread."""
        # A full buffer already holds a poke; a closed one has no waiter.
        with contextlib.suppress(OSError):
            self._writer.send(b"\x00")

    def wait(self, fd: int | None, timeout_s: float) -> tuple[bool, bool]:
        """Wait until ``fd`` (if given) is readable, a poke arrives or
        ``timeout_s`` seconds pass; return ``(readable, poked)`` (both
        ``False``: the timeout), having consumed the pokes."""
        watched = [self._reader.fileno()] if fd is None else [fd, self._reader.fileno()]
        ready, _, _ = select.select(watched, [], [], timeout_s)
        poked = self._reader.fileno() in ready
        if poked:
            with contextlib.suppress(OSError):
                while self._reader.recv(4096):
                    pass
        return fd is not None and fd in ready, poked

    def close(self) -> None:
        """Close both sockets (this process's copies, after a fork)."""
        self._reader.close()
        self._writer.close()


class AWaker:
    """:class:`Waker` for one event loop: :meth:`poke` (on the loop's
    thread) ends the current or the next :meth:`wait`, which awaits the
    socket's readiness with the loop's reader callback, not a thread."""

    def __init__(self) -> None:
        self._poked = False
        self._waiting: asyncio.Future[None] | None = None

    def poke(self) -> None:
        """End the current (or the next) :meth:`wait`; on the loop's thread."""
        self._poked = True
        waiting = self._waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def wait(self, fd: int | None, timeout_s: float) -> tuple[bool, bool]:
        """As :meth:`Waker.wait`."""
        readable = False
        if not self._poked:
            loop = asyncio.get_running_loop()
            waiting = self._waiting = loop.create_future()

            def wake() -> None:
                if not waiting.done():
                    waiting.set_result(None)

            def ready() -> None:
                nonlocal readable
                readable = True
                wake()

            if fd is not None:
                loop.add_reader(fd, ready)
            timer = loop.call_later(max(0.0, timeout_s), wake)
            try:
                await waiting
            finally:
                timer.cancel()
                self._waiting = None
                if fd is not None:
                    loop.remove_reader(fd)
        poked, self._poked = self._poked, False
        return readable, poked

    def close(self) -> None:
        """Nothing to release (as :meth:`Waker.close`)."""


class AWakeLatch:
    """:class:`~alkstore.engine.WakeLatch` for one event loop:
    :meth:`set` on the loop's thread; :meth:`wait` awaits a wake (no
    polling), and one ``True`` consumes every wake set before it returns."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = AEvent()

    def set(self) -> None:
        """Record a wake and release any waiter."""
        self._event.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for a wake and consume it."""
        woken = await await_event(self._event, timeout_s)
        self._event.clear()
        return woken


def aclose_at_loop_end(
    close: Callable[[], Awaitable[None]], is_closed: Callable[[], bool], what: str
) -> ASpawned:
    """Start a task of the running loop that does nothing until it is
    cancelled, then awaits ``close()`` unless ``is_closed()``; keep a
    reference to it, and cancel it once closed.

    psycopg_pool's background workers carry on through a cancellation (it
    keeps their pool consistent), so an ``AsyncConnectionPool`` left open
    when its loop ends (``asyncio.run`` cancels every task, then waits for
    them all) would keep the loop from ever ending. This task is cancelled
    with the others and closes the pool, whose workers then stop: a store
    the application forgot to close costs a WARNING, never a hang. No sync
    twin: threads are daemons, and a sync store needs none."""

    async def close_when_cancelled() -> None:
        try:
            await AEvent().wait()
        except asyncio.CancelledError:
            if not is_closed():
                log.warning(
                    "the event loop is ending with %s still open: closing it now "
                    "(await its close() before the loop ends)",
                    what,
                )
                await close()
            raise

    return aspawn(close_when_cancelled, name=f"{what} closer")
