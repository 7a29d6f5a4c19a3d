"""Connections: the pool every operation borrows from, and error wrapping.

Pool connections run in autocommit mode, so each queue operation is one
statement and one round trip: the statement is its own transaction (no
``BEGIN``/``COMMIT`` exchanges). Operations that need several statements
(migrations) open an explicit transaction on a direct connection.

Every ``psycopg`` error becomes an :class:`~alkstore.errors.EngineError`
with the driver's error as ``__cause__`` (SPEC §2 "Errors"); no driver
exception crosses the contract.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import threading
import weakref
from collections.abc import Iterator
from datetime import datetime
from typing import Any, TypeAlias

import psycopg
from psycopg.adapt import Dumper
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import ConnectionPool, PoolClosed

from alkstore.errors import EngineError, StoreClosedError

__all__ = [
    "ByteaArray",
    "Conn",
    "Database",
    "DatabaseIdentity",
    "database_identity",
    "drop_inherited",
    "engine_error",
    "wrap_errors",
]

#: A psycopg connection returning rows as tuples.
Conn: TypeAlias = psycopg.Connection[TupleRow]


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


def engine_error(error: psycopg.Error) -> EngineError:
    """Wrap a driver error; raise the result ``from error``.

    ``permanent`` is set for the SQLSTATEs a retry cannot get past (missing
    privilege, a dropped table or schema).
    """
    detail = str(error).strip() or type(error).__name__
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


def _session_options(conninfo: str) -> str:
    given = conninfo_to_dict(conninfo).get("options") or os.environ.get("PGOPTIONS", "")
    return f"{given} {_SESSION_SETTINGS}".strip()


class Database:
    """The connections of one store: a pool for operations, and direct
    connections for migrations and the LISTEN connection.

    Parameters
    ----------
    conninfo
        The libpq connection string (URL).
    min_size, max_size
        The pool's bounds, in connections.
    timeout_s
        Seconds an operation waits for a pooled connection (and a direct
        connection's ``connect_timeout`` unless the URL sets one).
    name
        The pool's name, for psycopg_pool's logs.
    """

    def __init__(
        self, conninfo: str, *, min_size: int, max_size: int, timeout_s: float, name: str
    ) -> None:
        self.conninfo = conninfo
        self.timeout_s = timeout_s
        self._min_size = min_size
        self._max_size = max_size
        self._name = name
        # This process's pooled connections (see _configure).
        self._connections: weakref.WeakSet[Conn] = weakref.WeakSet()
        self._pool = self._new_pool()
        self._opened = False
        self._closed = False
        # Set in a forked child: open the new pool at its first use.
        self._open_in_child = False
        self._fork_lock = threading.Lock()
        _databases.add(self)

    def _new_pool(self) -> ConnectionPool[Conn]:
        return ConnectionPool(
            self.conninfo,
            kwargs={"autocommit": True, "options": _session_options(self.conninfo)},
            configure=self._configure,
            min_size=self._min_size,
            max_size=self._max_size,
            timeout=self.timeout_s,
            open=False,
            name=self._name,
        )

    def _configure(self, conn: Conn) -> None:
        conn.adapters.register_dumper(ByteaArray, _ByteaArrayDumper)
        self._connections.add(conn)

    def open(self) -> None:
        """Start the pool; its connections are made in the background."""
        with wrap_errors():
            self._pool.open(wait=False)
        self._opened = True

    @contextlib.contextmanager
    def connection(self) -> Iterator[Conn]:
        """Borrow an autocommit connection for one operation.

        Raises
        ------
        EngineError
            For any driver error inside, or no connection within the timeout.
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
            yield conn
        except psycopg.Error as error:
            raise engine_error(error) from error
        finally:
            # The pool rolls back a transaction left open and replaces a
            # broken connection.
            self._pool.putconn(conn)

    def _getconn(self) -> Conn:
        if self._open_in_child:
            with self._fork_lock:
                if self._open_in_child:
                    with wrap_errors():
                        self._pool.open(wait=False)
                    self._open_in_child = False
        # An idle autocommit connection has nothing to read: data waiting on
        # its socket is the server's goodbye (restart, pg_terminate_backend,
        # idle timeout). Such connections are dropped here, at the cost of a
        # zero-timeout poll, instead of failing the operation that would
        # take them.
        for _ in range(self._max_size):
            conn = self._pool.getconn()
            if _idle_and_alive(conn):
                return conn
            conn.close()
            self._pool.putconn(conn)
        return self._pool.getconn()

    def connect(self, **kwargs: Any) -> Conn:
        """Open a direct autocommit connection (not from the pool).

        Raises
        ------
        EngineError
            If the connection fails.
        """
        params: dict[str, Any] = {
            "autocommit": True,
            "options": _session_options(self.conninfo),
            **kwargs,
        }
        if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(self.conninfo):
            params.setdefault("connect_timeout", max(1, round(self.timeout_s)))
        with wrap_errors():
            return psycopg.Connection.connect(self.conninfo, **params)

    def close(self) -> None:
        """Close the pool; connections in use close when given back."""
        self._closed = True
        self._pool.close()

    def _after_fork_in_child(self) -> None:
        # The pool's connections share their sessions with the parent: using
        # one would mix two processes' messages on one session, and closing
        # one would end the parent's. Drop them (see drop_inherited), and
        # give this process a pool of its own, opened at its first use (a
        # child that only execs opens nothing) (D15).
        for conn in list(self._connections):
            drop_inherited(conn)
        _inherited.append(self._pool)
        self._connections = weakref.WeakSet()
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
