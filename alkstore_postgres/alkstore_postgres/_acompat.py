"""Thread and task primitives in pairs, for the engine's generated modules.

The engine's I/O modules are written once, for asyncio (``_*_async.py``);
tools/async_to_sync.py generates the sync modules from them (docs/async.md
"How the engines do it"), renaming each async name of this module to its
sync twin: ``ALock`` -> ``Lock``, ``AEvent`` -> ``Event``, ``aspawn`` ->
``spawn`` ..., as psycopg_pool's own ``_acompat`` does. So each pair has
one meaning and two implementations: the sync one for threads, the async
one for the tasks of the event loop that opened the store (an async store
is used from that loop only; nothing here is thread-safe on the async side
unless it says so).

Hand-written, never generated: the two sides differ by nature.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeAlias, TypeVar

from alkstore.engine import WakeLatch

__all__ = [
    "ABusy",
    "ACondition",
    "AEvent",
    "ALock",
    "AWakeLatch",
    "AWaker",
    "AWorker",
    "Busy",
    "Condition",
    "Event",
    "Lock",
    "WakeLatch",
    "Waker",
    "Worker",
    "aclose_at_loop_end",
    "afrom_thread",
    "ajoin",
    "asleep",
    "aspawn",
    "from_thread",
    "is_async",
    "join",
    "sleep",
    "spawn",
]

T = TypeVar("T")

log = logging.getLogger("alkstore.postgres")

Lock = threading.Lock
ALock = asyncio.Lock
Event = threading.Event
Condition = threading.Condition
sleep = time.sleep
asleep = asyncio.sleep

#: What :func:`spawn` / :func:`aspawn` start: a daemon thread, or a task.
Worker: TypeAlias = threading.Thread
AWorker: TypeAlias = "asyncio.Task[None]"


def is_async() -> bool:
    """``True``: the escape hatch of the async sources. The conversion
    replaces ``if is_async(): A else: B`` by ``B`` in the sync module, so
    this is only ever called on the async side."""
    return True


class AEvent(asyncio.Event):
    """:class:`asyncio.Event` with :meth:`threading.Event.wait`'s timeout."""

    async def wait_timeout(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds; ``True`` if set (at once when
        it is already set, whatever the timeout). Becomes ``wait`` in the
        sync modules."""
        if self.is_set():
            return True
        if timeout_s <= 0:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                await self.wait()
        except TimeoutError:
            return self.is_set()
        return True


class ACondition(asyncio.Condition):
    """:class:`asyncio.Condition` with :meth:`threading.Condition.wait_for`'s
    timeout."""

    async def wait_for_timeout(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait (the lock held, as ``wait_for``) until ``predicate()`` or
        ``timeout_s`` seconds; return the predicate's last value. Becomes
        ``wait_for`` in the sync modules."""
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self.wait_for(predicate)
        except TimeoutError:
            pass
        return predicate()


# Tasks started by aspawn, referenced until they end: the loop itself keeps
# only a weak reference to a task.
_tasks: set[asyncio.Task[None]] = set()


def spawn(fn: Callable[..., object], args: tuple[Any, ...] = (), name: str = "") -> Worker:
    """Run ``fn(*args)`` on a new daemon thread."""
    thread = threading.Thread(target=fn, args=args, name=name, daemon=True)
    thread.start()
    return thread


def aspawn(
    fn: Callable[..., Coroutine[Any, Any, None]], args: tuple[Any, ...] = (), name: str = ""
) -> AWorker:
    """Run ``fn(*args)`` as a new task of the running loop."""
    task = asyncio.get_running_loop().create_task(fn(*args), name=name)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


def join(worker: Worker, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for ``worker`` to end; ``True`` if it did."""
    worker.join(timeout_s)
    return not worker.is_alive()


async def ajoin(worker: AWorker, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for ``worker`` to end; ``True`` if it did."""
    done, _ = await asyncio.wait({worker}, timeout=timeout_s)
    return bool(done)


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


class Busy:
    """A mutex that is taken without waiting, or not at all (for work that
    one caller at a time does and the others skip)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()

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
        woken = await self._event.wait_timeout(timeout_s)
        self._event.clear()
        return woken


def aclose_at_loop_end(
    close: Callable[[], Awaitable[None]], is_closed: Callable[[], bool], what: str
) -> asyncio.Task[None]:
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
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not is_closed():
                log.warning(
                    "the event loop is ending with %s still open: closing it now "
                    "(await its close() before the loop ends)",
                    what,
                )
                await close()
            raise

    return asyncio.get_running_loop().create_task(close_when_cancelled(), name=f"{what} closer")
