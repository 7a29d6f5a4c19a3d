"""Deadlines for the engine's calls to PostgreSQL (``query_timeout_s``).

Nothing in psycopg 3 or psycopg_pool bounds how long a call waits for the
server's answer: psycopg polls the socket until the answer comes, a pool's
``check`` runs a query that waits the same way, and a cancel request travels
on a new connection while its answer would come back on the old one. TCP
keepalives and ``tcp_user_timeout`` only notice a peer whose kernel stops
acknowledging; a proxy, a NAT or a load balancer that keeps acknowledging but
stops forwarding looks to the client like a server that never answers.

So each store has one :class:`Watchdog`: every call of the engine runs inside
:meth:`Watchdog.guard`, which records the call's deadline, and one daemon
thread shuts down (``shutdown(2)``, on a duplicate of libpq's descriptor)
the socket of any call still waiting at its deadline. The waiting call then
returns at once: libpq reports the connection lost, the guard raises
:class:`~alkstore.errors.EngineError` naming the bound, and the connection
is closed, so the pool replaces it and the caller's retry runs on a new one.

Shared as it is by the sync and the async engine, not generated: the
watchdog is a thread whatever the caller is, and a socket shut down under a
``psycopg.AsyncConnection`` ends its wait just the same (the event loop
sees the socket readable, psycopg reads the end of the stream). A guard is
entered with ``with`` on a sync connection and with ``async with`` on an
async one (whose close is awaited); the expiry callback runs on the
watchdog's thread either way (the async store hands it to its loop).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import psycopg

from alkstore.errors import EngineError

__all__ = ["Guard", "Watchdog", "break_socket"]


def break_socket(conn: psycopg.BaseConnection[Any]) -> None:
    """Shut down ``conn``'s socket in both directions, so that a call
    waiting on it returns at once and fails; its descriptor stays libpq's.
    Never raises."""
    with contextlib.suppress(Exception):
        fd = conn.pgconn.socket  # raises once the connection is closed
        duplicate = socket.socket(fileno=os.dup(fd))
        with duplicate, contextlib.suppress(OSError):
            duplicate.shutdown(socket.SHUT_RDWR)


class Watchdog:
    """Breaks the connection of any guarded call past its deadline.

    Parameters
    ----------
    timeout_s
        Seconds a guarded call may take (the store's ``query_timeout_s``).
    name
        The thread's name.
    on_expiry
        Called (from the watchdog's thread, once per round of expiries) with
        the server process ids of the connections it broke: their sessions
        may live on at the server, and the store's other connections likely
        went the same way.
    """

    def __init__(
        self, timeout_s: float, *, name: str, on_expiry: Callable[[list[int]], None]
    ) -> None:
        self.timeout_s = timeout_s
        self._name = name
        self._on_expiry = on_expiry
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._calls: set[Guard] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    def guard(self, conn: psycopg.BaseConnection[Any]) -> Guard:
        """A context manager bounding the calls made on ``conn`` inside it
        to :attr:`timeout_s` in all: ``with`` for a ``psycopg.Connection``,
        ``async with`` for a ``psycopg.AsyncConnection``.

        Raises
        ------
        EngineError
            On leaving, when the deadline passed and the block failed: the
            connection was broken and is now closed (the driver's error is
            ``__cause__``).
        """
        return Guard(self, conn)

    def timeout_error(self) -> EngineError:
        """The error of a call that got no answer in time."""
        return EngineError(
            f"PostgreSQL did not answer within query_timeout_s ({self.timeout_s:g} s); "
            "the connection was dropped"
        )

    def interrupt(self, conn: psycopg.BaseConnection[Any]) -> None:
        """End the guarded calls on ``conn`` now, as if their deadline had
        passed (for a closing store's own connections; ``on_expiry`` is not
        called: nothing is known to be dead)."""
        with self._cond:
            for guard in [g for g in self._calls if g.conn is conn]:
                self._expire(guard)

    def close(self) -> None:
        """Let the thread end once no guarded call is left. Guards made
        later still work (the thread starts again)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _after_fork_in_child(self) -> None:
        # The thread did not survive fork(); the calls were the parent's.
        self._reset()

    def _register(self, guard: Guard) -> None:
        with self._cond:
            self._calls.add(guard)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _unregister(self, guard: Guard) -> None:
        with self._cond:
            self._calls.discard(guard)

    def _run(self) -> None:
        while True:
            broke: list[int] = []
            with self._cond:
                if self._closed and not self._calls:
                    self._thread = None
                    return
                now = time.monotonic()
                for guard in [g for g in self._calls if g.deadline <= now]:
                    broke.append(self._expire(guard))
                # Guards never notify: one that arrives during this wait
                # has a deadline at least timeout_s away, later than the end
                # of the wait.
                wake_at = min((g.deadline for g in self._calls), default=now + self.timeout_s)
                if not broke:
                    self._cond.wait(max(0.0, min(wake_at, now + self.timeout_s) - now))
            if broke:
                with contextlib.suppress(Exception):
                    self._on_expiry(broke)

    def _expire(self, guard: Guard) -> int:
        # Under the lock: the guarded block cannot leave, and its connection
        # cannot be closed or go back to the pool, before the break.
        self._calls.discard(guard)
        guard.expired = True
        pid = 0
        with contextlib.suppress(Exception):
            pid = guard.conn.pgconn.backend_pid  # known since the connect: no I/O
        break_socket(guard.conn)
        return pid


class Guard:
    """One guarded block (see :meth:`Watchdog.guard`)."""

    __slots__ = ("conn", "deadline", "expired", "watchdog")

    def __init__(self, watchdog: Watchdog, conn: psycopg.BaseConnection[Any]) -> None:
        self.watchdog = watchdog
        self.conn = conn
        self.deadline = 0.0
        self.expired = False

    def __enter__(self) -> None:
        self.deadline = time.monotonic() + self.watchdog.timeout_s
        self.watchdog._register(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._left():
            conn = self.conn
            assert isinstance(conn, psycopg.Connection), "an async connection takes async with"
            with contextlib.suppress(Exception):
                conn.close()
            self._raise_for(exc)

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._left():
            conn = self.conn
            assert isinstance(conn, psycopg.AsyncConnection), "a sync connection takes with"
            with contextlib.suppress(Exception):
                await conn.close()
            self._raise_for(exc)

    def _left(self) -> bool:
        # Whether the deadline passed: the connection was broken, and is
        # closed now even if the block's last answer came in time.
        self.watchdog._unregister(self)
        return self.expired

    def _raise_for(self, exc: BaseException | None) -> None:
        if isinstance(exc, psycopg.Error):
            raise self.watchdog.timeout_error() from exc
