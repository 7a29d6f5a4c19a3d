"""The connections of one store: the pool every operation borrows from,
direct connections, and the watchdog bounding every call on them.

One source for two modules (docs/async.md "How the engines do it"):
``_database_async`` (asyncio) is written by hand, ``_database`` (threads)
is generated from it. What does no I/O (connection parameters, session
settings, error wrapping, the messages) is in
:mod:`alkstore_postgres._connection`, shared by both; so is the watchdog
(:mod:`alkstore_postgres._watchdog`), a thread whatever its callers are.

No call waits for the server without bound (``query_timeout_s``, see
:mod:`alkstore_postgres._connection`): every call on a connection runs
inside :meth:`AsyncDatabase.guard`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeAlias

import psycopg
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from alkstore.engine_async import ALock, asleep, aspawn, is_async
from alkstore.errors import StoreClosedError
from alkstore_postgres._acompat import aclose_at_loop_end, afrom_thread, atake_whole
from alkstore_postgres._connection import (
    DATABASE_IDENTITY,
    DEFAULT_ISOLATION,
    END_SESSIONS,
    POOL_MAX_IDLE_S,
    RECONNECT_EVERY_S,
    DatabaseIdentity,
    connection_params,
    drop_inherited,
    engine_error,
    idle_and_alive,
    keep_inherited,
    no_connection_error,
    pooled_server_error,
    register_dumpers,
    session_setup,
    startup_options_refused,
    wrap_errors,
)
from alkstore_postgres._watchdog import Guard, Watchdog

__all__ = ["AsyncConn", "AsyncDatabase", "check_pooled_server", "database_identity"]

log = logging.getLogger("alkstore.postgres")

#: A psycopg connection returning rows as tuples.
AsyncConn: TypeAlias = psycopg.AsyncConnection[TupleRow]


class _PoolConnection(psycopg.AsyncConnection[TupleRow]):
    """The pool's connection class: a connect that fails is handed to the
    ``on_connect_error`` callable the pool's kwargs carry (the pool's own
    connects run in its background workers and only log their errors), so
    that an operation that gets no connection in time can say why; and the
    async one lets the loop turn before it closes."""

    @classmethod
    async def connect(  # type: ignore[override]
        cls, conninfo: str = "", *, on_connect_error: Callable[[psycopg.Error], None], **kwargs: Any
    ) -> _PoolConnection:
        try:
            return await super().connect(conninfo, **kwargs)
        except psycopg.Error as error:
            on_connect_error(error)
            raise

    async def close(self) -> None:
        if is_async():
            # The pool closes its idle connections one after the other
            # without awaiting anything (a connection's close does no
            # waiting I/O): a turn of the loop between two keeps the close
            # of a store holding dozens from holding the loop meanwhile.
            await asleep(0)
        await super().close()


async def database_identity(conn: psycopg.AsyncConnection[Any]) -> DatabaseIdentity:
    """The identity of the database ``conn`` is on (see
    :data:`~alkstore_postgres._connection.DATABASE_IDENTITY`); any row
    factory, and nothing that could abort the caller's transaction.

    Raises
    ------
    psycopg.Error
        If the connection fails.
    """
    # A cursor of psycopg's own class: the caller's connection may make
    # client-side cursors (Django's default), which have no binary results.
    async with psycopg.AsyncCursor(conn, row_factory=tuple_row) as cur:
        row = await (await cur.execute(DATABASE_IDENTITY, binary=True)).fetchone()
    assert row is not None
    return row[0], row[1]


async def check_pooled_server(conn: AsyncConn, pooler: str | None) -> None:
    """Behind a transaction pooler, check the server's own
    ``default_transaction_isolation`` (see
    :func:`~alkstore_postgres._connection.pooled_server_error`).

    Raises
    ------
    EngineError
        (permanent) If it is not ``read committed``.
    psycopg.Error
        If the database fails.
    """
    if pooler != "transaction":
        return
    row = await (await conn.execute(DEFAULT_ISOLATION)).fetchone()
    error = None if row is None else pooled_server_error(row[0])
    if error is not None:
        raise error


class AsyncDatabase:
    """The connections of one store: a pool for operations, and direct
    connections for migrations, maintenance turns and the LISTEN connection;
    and the watchdog bounding every call on them.

    Parameters
    ----------
    conninfo
        The libpq connection string (URL).
    min_size, max_size
        The pool's bounds, in connections.
    timeout_s
        Seconds an operation waits for a pooled connection.
    query_timeout_s
        Seconds any one call (an operation's statements, a connect) may wait
        for the server (see :func:`~alkstore_postgres._connection.connection_params`
        and :class:`~alkstore_postgres._watchdog.Watchdog`).
    name
        The pool's name, for psycopg_pool's logs.
    pooler
        ``None`` (the server itself), or the ``pool_mode`` of the PgBouncer
        the URL reaches, ``"session"`` or ``"transaction"`` (see
        :func:`~alkstore_postgres._connection.connection_params` and
        :func:`~alkstore_postgres._connection.session_setup`).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int,
        max_size: int,
        timeout_s: float,
        query_timeout_s: float,
        name: str,
        pooler: str | None = None,
    ) -> None:
        self.conninfo = conninfo
        #: ``None`` (a direct server), ``"session"`` or ``"transaction"``.
        self.pooler = pooler
        self._setup = session_setup(query_timeout_s, pooler)
        self.timeout_s = timeout_s
        self.query_timeout_s = query_timeout_s
        self._min_size = min_size
        self._max_size = max_size
        self._name = name
        self._params = connection_params(conninfo, query_timeout_s, pooler)
        # This process's pooled connections (see _configure), with when each
        # was made (monotonic seconds).
        self._connections: weakref.WeakKeyDictionary[AsyncConn, float] = weakref.WeakKeyDictionary()
        # Connections made before this instant are suspect: a call on one of
        # the store's connections got no answer within the bound then.
        self._suspect_before = -math.inf
        # The pool's last failed connect: (monotonic seconds, the error).
        self._connect_failed: tuple[float, psycopg.Error] | None = None
        #: Called once a call got no answer in time: the LISTEN connection
        #: is checked then too.
        self.on_dead_connection: list[Callable[[], None]] = []
        #: Bounds every call on the store's connections. Its thread reports
        #: an expiry where the store's calls run (the async store's loop).
        self.watchdog = Watchdog(
            query_timeout_s,
            name=f"{name}-watchdog",
            on_expiry=afrom_thread(self._connection_died),
        )
        self._pool = self._new_pool()
        self._opened = False
        self._closed = False
        if is_async():
            # The async pool's closer at the loop's end (see open).
            self._closer: asyncio.Task[None] | None = None
        # Set in a forked child: open the new pool at its first use.
        self._open_in_child = False
        self._fork_lock = ALock()
        _databases.add(self)

    def _new_pool(self) -> AsyncConnectionPool[_PoolConnection]:
        # The pool opens connections as operations wait for one, up to
        # max_size, and closes those unused for POOL_MAX_IDLE_S.
        return AsyncConnectionPool(
            self.conninfo,
            connection_class=_PoolConnection,
            kwargs={**self._params, "on_connect_error": self._record_connect_error},
            configure=self._configure,
            min_size=self._min_size,
            max_size=self._max_size,
            max_idle=POOL_MAX_IDLE_S,
            timeout=self.timeout_s,
            # A failed connect is tried once more, then given up (see _take).
            reconnect_timeout=RECONNECT_EVERY_S,
            open=False,
            name=self._name,
        )

    def _record_connect_error(self, error: psycopg.Error) -> None:
        self._connect_failed = (time.monotonic(), error)

    async def _configure(self, conn: AsyncConn) -> None:
        register_dumpers(conn)
        await self._set_up(conn)
        self._connections[conn] = time.monotonic()

    async def _set_up(self, conn: AsyncConn) -> None:
        # Behind a pooler, the session settings (session_setup); explicit
        # transactions say their isolation level, whatever the session's.
        if self._setup is not None:
            await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)
            async with self.guard(conn):
                await conn.execute(self._setup)

    def _connection_died(self, backend_pids: list[int]) -> None:
        # The store's other connections most likely share the dead one's
        # path (a proxy, a NAT entry, a failed-over server): each is
        # replaced when next borrowed rather than costing a caller the
        # whole bound again.
        self._suspect_before = time.monotonic()
        log.warning(
            "PostgreSQL did not answer within query_timeout_s (%g s): %d connection(s) "
            "dropped; the store's older connections are replaced as they are next used",
            self.query_timeout_s,
            len(backend_pids),
        )
        for callback in list(self.on_dead_connection):
            with contextlib.suppress(Exception):
                callback()
        aspawn(
            self._end_sessions,
            ([pid for pid in backend_pids if pid],),
            name=f"{self._name}-end-sessions",
        )

    async def _end_sessions(self, backend_pids: list[int]) -> None:
        # A session whose connection was given up on may live on at the
        # server (behind a proxy or NAT that stopped forwarding, nothing
        # reaches it), holding its locks (a maintenance turn's advisory
        # lock, a migration's) and a connection slot until the server's own
        # keepalives notice, by default after hours. Ended through a new
        # connection, which may well get through; best effort.
        # Behind a pooler the process ids are the pooler's own inventions.
        if not backend_pids or self.pooler is not None:
            return
        try:
            conn = await self.connect(application_name="alkstore-cleanup")
            try:
                async with self.guard(conn):
                    await conn.execute(END_SESSIONS, [backend_pids])
            finally:
                await conn.close()
        except Exception as error:
            log.info("could not end the abandoned sessions %s: %s", backend_pids, error)

    def guard(self, conn: AsyncConn) -> Guard:
        """Bound the calls on ``conn`` inside the ``async with`` block to
        ``query_timeout_s`` in all (see
        :meth:`~alkstore_postgres._watchdog.Watchdog.guard`).

        Raises
        ------
        EngineError
            On leaving, when the bound passed and the block failed.
        """
        return self.watchdog.guard(conn)

    async def open(self, owner: str) -> None:
        """Start the pool; its connections are made in the background.
        ``owner`` names the store in messages (its ``repr``)."""
        with wrap_errors():
            await self._pool.open(wait=False)
        self._opened = True
        if is_async():
            # A pool left open would keep its loop from ending (see
            # aclose_at_loop_end).
            self._closer = aclose_at_loop_end(self.close, lambda: self._closed, owner)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConn]:
        """Borrow an autocommit connection for one operation, whose calls
        may take ``query_timeout_s`` in all.

        Raises
        ------
        EngineError
            For any driver error inside, no connection within the pool's
            timeout, or no answer within ``query_timeout_s`` (the connection
            is then dropped).
        StoreClosedError
            If the pool was closed (the store is closed).
        """
        try:
            conn = await atake_whole(self._getconn, self._pool.putconn)
        except PoolClosed as error:
            raise StoreClosedError("the store is closed") from error
        except psycopg.Error as error:
            raise engine_error(error) from error
        try:
            async with self.watchdog.guard(conn):
                yield conn
        except psycopg.Error as error:
            raise engine_error(error, query_timeout_s=self.query_timeout_s) from error
        finally:
            # The pool replaces a broken or closed connection (the guard
            # closes one it broke). Every engine block ends its transactions
            # itself, so nothing is left for the pool to roll back.
            await self._pool.putconn(conn)

    async def _getconn(self) -> _PoolConnection:
        if self._open_in_child:
            async with self._fork_lock:
                if self._open_in_child:
                    with wrap_errors():
                        await self._pool.open(wait=False)
                    self._open_in_child = False
        # An idle autocommit connection has nothing to read: data waiting on
        # its socket is the server's goodbye (see idle_and_alive). Such
        # connections are dropped here, at the cost of a zero-timeout poll,
        # instead of failing the operation that would take them; so are the
        # connections made before a call on another one went unanswered.
        for _ in range(self._max_size):
            conn = await self._take()
            if self._connections.get(conn, math.inf) > self._suspect_before and idle_and_alive(
                conn
            ):
                return conn
            await conn.close()
            await self._pool.putconn(conn)
        return await self._take()

    async def _take(self) -> _PoolConnection:
        # psycopg_pool tries a failed connect again after a pause that
        # doubles each time (1, 2, 4, 8 ... s): a server back after an
        # outage of 7 s would be tried 8 s later, and every operation waiting
        # for a connection would wait with it. So the pool gives a failed
        # connect up after its second try (reconnect_timeout), and an
        # operation waiting for a connection asks again every
        # RECONNECT_EVERY_S, which makes the pool start a new connect at
        # once: the server is tried about once a second for as long as
        # anyone waits, however long it was away; still within timeout_s.
        started = time.monotonic()
        deadline = started + self.timeout_s
        while True:
            wait_s = min(deadline - time.monotonic(), RECONNECT_EVERY_S)
            try:
                return await self._pool.getconn(max(wait_s, 0.001))
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    raise no_connection_error(
                        self._connect_failed, started, self.timeout_s, self._max_size
                    ) from None

    async def connect(self, **kwargs: Any) -> AsyncConn:
        """Open a direct autocommit connection (not from the pool), with the
        pool's parameters and session settings; guard its calls with
        :meth:`guard`. Behind a pooler it is a client of the pooler too.

        Raises
        ------
        EngineError
            If the connection fails (or takes longer than its
            ``connect_timeout``).
        """
        with wrap_errors():
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.conninfo, **{**self._params, **kwargs}
                )
            except psycopg.OperationalError as error:
                refused = None if self.pooler is not None else startup_options_refused(error)
                if refused is not None:
                    raise refused from error
                raise
        try:
            with wrap_errors():
                await self._set_up(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def connect_direct(self, conninfo: str, **kwargs: Any) -> AsyncConn:
        """Open an autocommit connection to ``conninfo``, a server reached
        without a pooler (the LISTEN connection's ``listen_url``), with the
        parameters of a direct connection; guard its calls with
        :meth:`guard`.

        Raises
        ------
        EngineError
            If the connection fails.
        """
        params = connection_params(conninfo, self.query_timeout_s)
        with wrap_errors():
            return await psycopg.AsyncConnection.connect(conninfo, **{**params, **kwargs})

    async def close(self) -> None:
        """Close the pool; connections in use close when given back (their
        calls stay bounded)."""
        self._closed = True
        if is_async():  # noqa: SIM102 (the conversion knows a bare `if is_async():` only)
            if self._closer is not None and self._closer is not asyncio.current_task():
                self._closer.cancel()
        try:
            await self._pool.close()
        finally:
            self.watchdog.close()

    def _after_fork_in_child(self) -> None:
        # The pool's connections share their sessions with the parent: using
        # one would mix two processes' messages on one session, and closing
        # one would end the parent's. Drop them (see drop_inherited), and
        # give this process a pool of its own, opened at its first use (a
        # child that only execs opens nothing) (D15).
        for conn in list(self._connections):
            drop_inherited(conn)
        keep_inherited(self._pool)
        self._connections = weakref.WeakKeyDictionary()
        self.watchdog._after_fork_in_child()
        self._pool = self._new_pool()
        self._fork_lock = ALock()
        self._open_in_child = self._opened and not self._closed


# Every database of this process, to replace its pool in a forked child.
_databases: weakref.WeakSet[AsyncDatabase] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for database in list(_databases):
        database._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
