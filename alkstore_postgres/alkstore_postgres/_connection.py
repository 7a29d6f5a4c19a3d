"""Connections: the pool every operation borrows from, and error wrapping.

Pool connections run in autocommit mode, so each queue operation is one
statement and one round trip: the statement is its own transaction (no
``BEGIN``/``COMMIT`` exchanges). Operations that need several statements
(migrations) open an explicit transaction on a direct connection.

Every ``psycopg`` error becomes an :class:`~alkstore.errors.EngineError`
with the driver's error as ``__cause__`` (docs/contract.md §2 "Errors"); no driver
exception crosses the contract.

No call waits for the server without bound (``query_timeout_s``): every
connection has TCP keepalives and ``tcp_user_timeout`` (a lost network is
noticed by the kernel), a ``connect_timeout`` and a server-side
``statement_timeout`` just below the bound (a slow statement ends with the
server's own error), and every call runs under the store's
:class:`~alkstore_postgres._watchdog.Watchdog` (an answer that never comes,
say through a proxy that stopped forwarding, breaks the connection).

Behind PgBouncer (the ``pooler`` engine option) the session settings are
made after connecting (:func:`session_setup`), and in transaction mode no
statement is prepared (:func:`connection_params`); docs/deployment.md
"PgBouncer".
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeAlias

import psycopg
from psycopg.adapt import Dumper
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from alkstore.errors import EngineError, StoreClosedError
from alkstore_postgres._watchdog import Guard, Watchdog

__all__ = [
    "ByteaArray",
    "Conn",
    "Database",
    "DatabaseIdentity",
    "database_identity",
    "drop_inherited",
    "POOLERS",
    "check_pooled_server",
    "connection_params",
    "engine_error",
    "session_setup",
    "wrap_errors",
]

log = logging.getLogger("alkstore.postgres")

#: A psycopg connection returning rows as tuples.
Conn: TypeAlias = psycopg.Connection[TupleRow]


class _PoolConnection(psycopg.Connection[TupleRow]):
    """The pool's connection class: a connect that fails is handed to the
    ``on_connect_error`` callable the pool's kwargs carry (the pool's own
    connects run on its threads and only log their errors), so that an
    operation that gets no connection in time can say why."""

    @classmethod
    def connect(  # type: ignore[override]
        cls, conninfo: str = "", *, on_connect_error: Callable[[psycopg.Error], None], **kwargs: Any
    ) -> _PoolConnection:
        try:
            return super().connect(conninfo, **kwargs)
        except psycopg.Error as error:
            on_connect_error(error)
            raise


def _idle_and_alive(conn: Conn) -> bool:
    if conn.closed:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


#: What tells one database from another: the running server's start time
#: and the database's name.
DatabaseIdentity: TypeAlias = tuple[datetime, str]


def database_identity(conn: psycopg.Connection[Any]) -> DatabaseIdentity:
    """The identity of the database ``conn`` is on.

    Read with functions every role may call and that cannot fail, so that
    asking on an application's connection never aborts its transaction.
    Two servers never started in the same microsecond; a restart changes
    the identity (callers holding an older one read theirs again).

    Raises
    ------
    psycopg.Error
        If the connection fails.
    """
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(
            "SELECT pg_postmaster_start_time(), current_database()", binary=True
        ).fetchone()
    assert row is not None
    return row[0], row[1]


# SQLSTATEs after which a retry cannot succeed until someone steps in: the
# role lacks a privilege, or the store's tables or schema were dropped. Not
# read_only_sql_transaction (25006): a failover passes through it.
_PERMANENT_SQLSTATES = frozenset(
    {
        "42501",  # insufficient_privilege
        "42P01",  # undefined_table
        "3F000",  # invalid_schema_name
    }
)


# too_many_connections (53300): the server's max_connections (less the
# slots it reserves) or the role's or database's connection limit are all
# taken. A refused connect carries no SQLSTATE in psycopg, only libpq's
# message, which the server words one of these ways. Not permanent: slots
# free up as other clients close theirs, and the worker retries.
_TOO_MANY_CONNECTIONS = "53300"
_TOO_MANY_CONNECTIONS_WORDS = (
    "too many clients already",
    "too many connections for",
    "remaining connection slots are reserved",
)
_TOO_MANY_CONNECTIONS_HINT = (
    " (the server has no connection slot left for this role: raise the server's"
    " max_connections or the role's or database's CONNECTION LIMIT, or hold fewer"
    " connections: each process's store holds up to pool_max_size + 2; see"
    ' docs/deployment.md "Connection budget")'
)


def engine_error(error: psycopg.Error, *, query_timeout_s: float | None = None) -> EngineError:
    """Wrap a driver error; raise the result ``from error``.

    ``permanent`` is set for the SQLSTATEs a retry cannot get past (missing
    privilege, a dropped table or schema). With ``query_timeout_s``, a
    statement the server cancelled for its ``statement_timeout`` names that
    bound. A connect refused because the server's ``max_connections`` is
    exhausted says so, and what to change.
    """
    detail = str(error).strip() or type(error).__name__
    if error.sqlstate == _TOO_MANY_CONNECTIONS or any(
        words in detail for words in _TOO_MANY_CONNECTIONS_WORDS
    ):
        detail += _TOO_MANY_CONNECTIONS_HINT
    if (
        query_timeout_s is not None
        and isinstance(error, psycopg.errors.QueryCanceled)
        and "statement timeout" in detail
    ):
        detail += f" (the engine's: 90% of query_timeout_s = {query_timeout_s:g} s)"
    return EngineError(
        f"PostgreSQL error ({type(error).__name__}): {detail}",
        permanent=error.sqlstate in _PERMANENT_SQLSTATES,
    )


@contextlib.contextmanager
def wrap_errors() -> Iterator[None]:
    """Turn every ``psycopg`` error raised inside into an ``EngineError``."""
    try:
        yield
    except psycopg.Error as error:
        raise engine_error(error) from error


class ByteaArray:
    """A list of ``bytes`` to send as one binary ``bytea[]`` parameter.

    psycopg adapts a Python list item by item, which was two thirds of an
    ``enqueue_many(1000)``'s client time; :class:`_ByteaArrayDumper`, a
    dumper registered through psycopg's public adaptation API, writes the
    array in one pass instead.
    """

    __slots__ = ("items",)

    def __init__(self, items: list[bytes]) -> None:
        self.items = items


# PostgreSQL's binary array format (src/backend/utils/adt/arrayfuncs.c,
# array_send): dimensions, has-nulls flag, element type, then per dimension
# its length and lower bound; then each element as its length and bytes.
_ARRAY_HEADER = struct.Struct("!iiiii")
_ITEM_LENGTH = struct.Struct("!i")
_BYTEA_OID = 17
_BYTEA_ARRAY_OID = 1001


class _ByteaArrayDumper(Dumper):
    format = Format.BINARY
    oid = _BYTEA_ARRAY_OID

    def dump(self, obj: ByteaArray) -> bytes:
        parts = [_ARRAY_HEADER.pack(1, 0, _BYTEA_OID, len(obj.items), 1)]
        for item in obj.items:
            parts.append(_ITEM_LENGTH.pack(len(item)))
            parts.append(item)
        return b"".join(parts)


# Settings the engine's statements rely on, whatever the URL, PGOPTIONS or
# the server's defaults say. Set at connection start-up (no round trip),
# after the options the URL or PGOPTIONS give, which they would otherwise
# replace, and which they override where they clash:
# - Every statement the engine prepares is written to be index-driven
#   whatever its parameters (D25): a generic plan is always right, and
#   PostgreSQL's own choice ('auto') re-plans the claim at every call
#   whenever stale statistics make the generic plan look dearer.
# - The claim's SKIP LOCKED walks and the handle's guarded updates need READ
#   COMMITTED: under REPEATABLE READ or SERIALIZABLE a row another claim
#   changed meanwhile fails the statement (SerializationFailure) instead of
#   being re-checked.
# - TimeZone UTC: every value crosses in binary, so no result depends on it,
#   but psycopg then builds each timestamptz it reads in UTC at once, where
#   a named zone (the server's 'Etc/UTC' included) cost two zone
#   conversions per value: a fifth of a drain's client time.
_SESSION_SETTINGS = (
    r"-c plan_cache_mode=force_generic_plan -c default_transaction_isolation=read\ committed"
    " -c TimeZone=UTC"
)
#: The server-side statement_timeout, as a fraction of query_timeout_s: a
#: statement that runs too long ends with the server's own error (the
#: connection stays usable) before the client gives the connection up.
STATEMENT_TIMEOUT_FRACTION = 0.9
# TCP keepalives: the first probe after a third of query_timeout_s idle,
# then every sixth, three unanswered probes: a connection whose peer
# vanished (a host down, a network cut) is found dead within about
# query_timeout_s even while idle, and dropped when next borrowed.
_KEEPALIVES_COUNT = 3
# The largest values libpq, the kernel and the server take (a query_timeout_s
# of years means no bound in practice): a C int of milliseconds or seconds,
# and Linux's cap on TCP_KEEPIDLE and TCP_KEEPINTVL.
_INT_MAX = 2**31 - 1
_KEEPALIVE_MAX_S = 32767
#: Seconds between tries to connect while operations wait for a connection
#: and the server does not answer (a restart, a failover): see
#: Database._take.
RECONNECT_EVERY_S = 1.0
#: Seconds a pooled connection may stay unused before the pool closes it
#: (down to ``min_size``): a burst's connections are not held for long.
POOL_MAX_IDLE_S = 60.0


def _statement_timeout_ms(query_timeout_s: float) -> int:
    """The server-side ``statement_timeout`` for ``query_timeout_s``, in
    milliseconds (:data:`STATEMENT_TIMEOUT_FRACTION` of it)."""
    return min(_INT_MAX, max(1, int(query_timeout_s * STATEMENT_TIMEOUT_FRACTION * 1000)))


def _session_options(conninfo: str, query_timeout_s: float) -> str:
    given = str(conninfo_to_dict(conninfo).get("options") or os.environ.get("PGOPTIONS", ""))
    # Before the given options, which may set another statement_timeout; after
    # them, the settings the engine's statements rely on, which must win.
    parts = [
        f"-c statement_timeout={_statement_timeout_ms(query_timeout_s)}",
        given,
        _SESSION_SETTINGS,
    ]
    return " ".join(part for part in parts if part)


def connection_params(
    conninfo: str, query_timeout_s: float, pooler: str | None = None
) -> dict[str, Any]:
    """The connection parameters the engine adds to ``conninfo`` for its own
    connections (pooled and direct): autocommit, the session settings, and,
    unless the URL sets them, libpq's ``connect_timeout`` (also unless
    ``PGCONNECT_TIMEOUT`` is set), ``keepalives``, ``keepalives_idle``,
    ``keepalives_interval``, ``keepalives_count`` and (libpq 12 or newer)
    ``tcp_user_timeout``, all derived from ``query_timeout_s``.

    Behind a pooler (``pooler`` ``"session"`` or ``"transaction"``, see
    :data:`POOLERS`) no startup ``options`` are added (PgBouncer refuses
    them; the settings are made by :func:`session_setup` instead), and in
    ``"transaction"`` mode psycopg never prepares a statement
    (``prepare_threshold=None``, which also overrides ``prepare=True``): a
    server-side prepared statement lives on one server connection, and the
    pooler hands the next transaction to any of them."""
    given = conninfo_to_dict(conninfo)
    defaults: dict[str, Any] = {
        # libpq's minimum is 2 s.
        "connect_timeout": min(_INT_MAX, max(2, math.ceil(query_timeout_s))),
        "keepalives": 1,
        "keepalives_idle": min(_KEEPALIVE_MAX_S, math.ceil(query_timeout_s / 3)),
        "keepalives_interval": min(_KEEPALIVE_MAX_S, math.ceil(query_timeout_s / 6)),
        "keepalives_count": _KEEPALIVES_COUNT,
    }
    if psycopg.pq.version() >= 120000:
        # Sent data unacknowledged this long fails the connection.
        defaults["tcp_user_timeout"] = min(_INT_MAX, math.ceil(query_timeout_s * 1000))
    if "PGCONNECT_TIMEOUT" in os.environ:
        del defaults["connect_timeout"]
    params: dict[str, Any] = {"autocommit": True}
    if pooler is None:
        params["options"] = _session_options(conninfo, query_timeout_s)
    elif pooler == "transaction":
        params["prepare_threshold"] = None
    params.update((key, value) for key, value in defaults.items() if key not in given)
    return params


#: The values of the ``pooler`` engine option besides ``None`` (a direct
#: server): PgBouncer's ``pool_mode`` in front of the server.
POOLERS = ("session", "transaction")


def session_setup(query_timeout_s: float, pooler: str | None) -> str | None:
    """The statement that makes the session settings on a new connection
    behind a pooler (``None`` when the startup ``options`` carry them).

    Session mode: every setting of the direct connection's ``options``
    (the connection keeps its server connection for its lifetime, and
    PgBouncer's ``server_reset_query``, ``DISCARD ALL``, undoes them when it
    ends). Transaction mode: only ``TimeZone``, one of the parameters
    PgBouncer tracks per client and restores on whichever server connection
    runs the client's next transaction; any other ``SET`` would stay on one
    server connection and leak to the pooler's other clients, so the server
    keeps its own ``statement_timeout`` (the watchdog still bounds every
    call), and with no prepared statements ``plan_cache_mode`` has nothing
    to act on (see :func:`check_pooled_server` for the isolation level)."""
    if pooler is None:
        return None
    settings = [("TimeZone", "UTC")]
    if pooler == "session":
        settings += [
            ("statement_timeout", str(_statement_timeout_ms(query_timeout_s))),
            ("plan_cache_mode", "force_generic_plan"),
            ("default_transaction_isolation", "read committed"),
        ]
    calls = ", ".join(f"set_config('{name}', '{value}', false)" for name, value in settings)
    return f"SELECT {calls}"


def check_pooled_server(conn: Conn, pooler: str | None) -> None:
    """Behind a transaction pooler, where the engine cannot set it, check
    that the server's own ``default_transaction_isolation`` is ``read
    committed``, which the claim's ``SKIP LOCKED`` walks and the guarded
    updates need (see ``_SESSION_SETTINGS``).

    Raises
    ------
    EngineError
        (permanent) If it is another level.
    psycopg.Error
        If the database fails.
    """
    if pooler != "transaction":
        return
    row = conn.execute("SELECT current_setting('default_transaction_isolation')").fetchone()
    if row is not None and row[0] != "read committed":
        raise EngineError(
            f"the server's default_transaction_isolation is {row[0]!r}, and behind a "
            "transaction pooler the engine cannot set it per session: the engine needs "
            "'read committed' (ALTER ROLE ... SET default_transaction_isolation = "
            "'read committed')",
            permanent=True,
        )


# Only sessions of this role on this database, never this one.
_END_SESSIONS = """
    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE pid = ANY(%s) AND pid <> pg_backend_pid()
      AND usename = current_user AND datname = current_database()
"""


class Database:
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
        for the server (see :func:`connection_params` and
        :class:`~alkstore_postgres._watchdog.Watchdog`).
    name
        The pool's name, for psycopg_pool's logs.
    pooler
        ``None`` (the server itself), or the ``pool_mode`` of the PgBouncer
        the URL reaches, ``"session"`` or ``"transaction"`` (see
        :func:`connection_params` and :func:`session_setup`).
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
        self._connections: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()
        # Connections made before this instant are suspect: a call on one of
        # the store's connections got no answer within the bound then.
        self._suspect_before = -math.inf
        # The pool's last failed connect: (monotonic seconds, the error).
        self._connect_failed: tuple[float, psycopg.Error] | None = None
        #: Called once a call got no answer in time (from the watchdog's
        #: thread): the LISTEN connection is checked then too.
        self.on_dead_connection: list[Callable[[], None]] = []
        #: Bounds every call on the store's connections.
        self.watchdog = Watchdog(
            query_timeout_s, name=f"{name}-watchdog", on_expiry=self._connection_died
        )
        self._pool = self._new_pool()
        self._opened = False
        self._closed = False
        # Set in a forked child: open the new pool at its first use.
        self._open_in_child = False
        self._fork_lock = threading.Lock()
        _databases.add(self)

    def _new_pool(self) -> ConnectionPool[_PoolConnection]:
        # The pool opens connections as operations wait for one, up to
        # max_size, and closes those unused for POOL_MAX_IDLE_S.
        return ConnectionPool(
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

    def _configure(self, conn: Conn) -> None:
        conn.adapters.register_dumper(ByteaArray, _ByteaArrayDumper)
        self._set_up(conn)
        self._connections[conn] = time.monotonic()

    def _set_up(self, conn: Conn) -> None:
        # Behind a pooler, the session settings (session_setup); explicit
        # transactions say their isolation level, whatever the session's.
        if self._setup is not None:
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            with self.guard(conn):
                conn.execute(self._setup)

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
        threading.Thread(
            target=self._end_sessions,
            args=([pid for pid in backend_pids if pid],),
            name=f"{self._name}-end-sessions",
            daemon=True,
        ).start()

    def _end_sessions(self, backend_pids: list[int]) -> None:
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
            conn = self.connect(application_name="alkstore-cleanup")
            try:
                with self.guard(conn):
                    conn.execute(_END_SESSIONS, [backend_pids])
            finally:
                conn.close()
        except Exception as error:
            log.info("could not end the abandoned sessions %s: %s", backend_pids, error)

    def guard(self, conn: Conn) -> Guard:
        """Bound the calls on ``conn`` inside the ``with`` block to
        ``query_timeout_s`` in all (see
        :meth:`~alkstore_postgres._watchdog.Watchdog.guard`).

        Raises
        ------
        EngineError
            On leaving, when the bound passed and the block failed.
        """
        return self.watchdog.guard(conn)

    def open(self) -> None:
        """Start the pool; its connections are made in the background."""
        with wrap_errors():
            self._pool.open(wait=False)
        self._opened = True

    @contextlib.contextmanager
    def connection(self) -> Iterator[Conn]:
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
            conn = self._getconn()
        except PoolClosed as error:
            raise StoreClosedError("the store is closed") from error
        except psycopg.Error as error:
            raise engine_error(error) from error
        try:
            with self.watchdog.guard(conn):
                yield conn
        except psycopg.Error as error:
            raise engine_error(error, query_timeout_s=self.query_timeout_s) from error
        finally:
            # The pool replaces a broken or closed connection (the guard
            # closes one it broke). Every engine block ends its transactions
            # itself, so nothing is left for the pool to roll back.
            self._pool.putconn(conn)

    def _getconn(self) -> _PoolConnection:
        if self._open_in_child:
            with self._fork_lock:
                if self._open_in_child:
                    with wrap_errors():
                        self._pool.open(wait=False)
                    self._open_in_child = False
        # An idle autocommit connection has nothing to read: data waiting on
        # its socket is the server's goodbye (restart, pg_terminate_backend,
        # idle timeout, or an error the kernel's keepalives found). Such
        # connections are dropped here, at the cost of a zero-timeout poll,
        # instead of failing the operation that would take them; so are the
        # connections made before a call on another one went unanswered.
        for _ in range(self._max_size):
            conn = self._take()
            if self._connections.get(conn, math.inf) > self._suspect_before and _idle_and_alive(
                conn
            ):
                return conn
            conn.close()
            self._pool.putconn(conn)
        return self._take()

    def _take(self) -> _PoolConnection:
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
                return self._pool.getconn(max(wait_s, 0.001))
            except PoolTimeout:
                if time.monotonic() >= deadline:
                    raise self._no_connection(started) from None

    def _no_connection(self, waited_since: float) -> EngineError:
        # Why no connection came within timeout_s: the connects the pool
        # tried meanwhile failed (the server is down, or out of slots), or
        # every connection was in use.
        failed = self._connect_failed
        if failed is not None and failed[0] >= waited_since:
            cause = engine_error(failed[1])
            return EngineError(
                f"no connection within pool_timeout_s ({self.timeout_s:g} s): "
                f"connecting failed: {cause}",
                permanent=cause.permanent,
            )
        return EngineError(
            f"no connection within pool_timeout_s ({self.timeout_s:g} s): all "
            f"{self._max_size} of the pool's connections (pool_max_size) were in use"
        )

    def connect(self, **kwargs: Any) -> Conn:
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
                conn = psycopg.Connection.connect(self.conninfo, **{**self._params, **kwargs})
            except psycopg.OperationalError as error:
                if self.pooler is None and "unsupported startup parameter" in str(error):
                    raise EngineError(
                        f"{engine_error(error)} (PgBouncer refuses the startup options "
                        "the engine sends to a direct server: open the store with "
                        "pooler='transaction' or pooler='session')",
                        permanent=True,
                    ) from error
                raise
        try:
            with wrap_errors():
                self._set_up(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def connect_direct(self, conninfo: str, **kwargs: Any) -> Conn:
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
            return psycopg.Connection.connect(conninfo, **{**params, **kwargs})

    def close(self) -> None:
        """Close the pool; connections in use close when given back (their
        calls stay bounded)."""
        self._closed = True
        try:
            self._pool.close()
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
        _inherited.append(self._pool)
        self._connections = weakref.WeakKeyDictionary()
        self.watchdog._after_fork_in_child()
        self._pool = self._new_pool()
        self._fork_lock = threading.Lock()
        self._open_in_child = self._opened and not self._closed


def drop_inherited(conn: Conn) -> None:
    """In a forked child, close this process's copy of ``conn``'s socket
    without a word to the server (psycopg's close would end the parent's
    session): the session is the parent's alone again, and ends when the
    parent closes it or exits. The object is kept, never used again, so
    that no finalizer of its runs in the child. Never raises."""
    with contextlib.suppress(Exception):
        # A closed connection has no socket (raises): its number may be
        # another file's by now.
        os.close(conn.pgconn.socket)
    _inherited.append(conn)


# Every Database of this process, to replace its pool in a forked child.
_databases: weakref.WeakSet[Database] = weakref.WeakSet()
# What a forked child inherited (pools, connections), referenced so that no
# finalizer of theirs runs in the child.
_inherited: list[object] = []


def _after_fork_in_child() -> None:
    for database in list(_databases):
        database._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
