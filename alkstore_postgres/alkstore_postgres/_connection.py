"""Connections, the parts that do no I/O: the parameters and session
settings of the engine's connections, error wrapping, the bytea-array
dumper, and the checks whose statements the connection layer runs.

Shared by the async connection layer (:mod:`alkstore_postgres._database_async`)
and the sync one generated from it (:mod:`alkstore_postgres._database`),
which hold the pool, the direct connections and the watchdog.

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
import math
import os
import select
import struct
from collections.abc import Iterator
from datetime import datetime
from typing import Any, TypeAlias

import psycopg
from psycopg.adapt import Dumper
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format, TransactionStatus

from alkstore.errors import EngineError, ValidationError

__all__ = [
    "DATABASE_IDENTITY",
    "DEFAULT_ISOLATION",
    "END_SESSIONS",
    "POOLERS",
    "POOL_MAX_IDLE_S",
    "RECONNECT_EVERY_S",
    "STATEMENT_TIMEOUT_FRACTION",
    "ByteaArray",
    "DatabaseIdentity",
    "check_tx_connection",
    "connection_params",
    "drop_inherited",
    "engine_error",
    "idle_and_alive",
    "keep_inherited",
    "no_connection_error",
    "pooled_server_error",
    "register_dumpers",
    "session_setup",
    "startup_options_refused",
    "wrap_errors",
]

#: What tells one database from another: the running server's start time
#: and the database's name.
DatabaseIdentity: TypeAlias = tuple[datetime, str]


#: Reads the identity of the database a connection is on, with functions
#: every role may call and that cannot fail, so that asking on an
#: application's connection never aborts its transaction. Two servers never
#: started in the same microsecond; a restart changes the identity (callers
#: holding an older one read theirs again).
DATABASE_IDENTITY = "SELECT pg_postmaster_start_time(), current_database()"


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


def register_dumpers(conn: psycopg.BaseConnection[Any]) -> None:
    """Register the engine's dumpers (:class:`ByteaArray`) on one of its
    connections."""
    conn.adapters.register_dumper(ByteaArray, _ByteaArrayDumper)


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


#: Reads the server's default isolation level (see
#: :func:`pooled_server_error`).
DEFAULT_ISOLATION = "SELECT current_setting('default_transaction_isolation')"


def pooled_server_error(isolation: str) -> EngineError | None:
    """Behind a transaction pooler, where the engine cannot set it, the
    server's own ``default_transaction_isolation`` must be ``read
    committed``, which the claim's ``SKIP LOCKED`` walks and the guarded
    updates need (see ``_SESSION_SETTINGS``): the error (permanent) for
    another level read by :data:`DEFAULT_ISOLATION`, else ``None``."""
    if isolation == "read committed":
        return None
    return EngineError(
        f"the server's default_transaction_isolation is {isolation!r}, and behind a "
        "transaction pooler the engine cannot set it per session: the engine needs "
        "'read committed' (ALTER ROLE ... SET default_transaction_isolation = "
        "'read committed')",
        permanent=True,
    )


def startup_options_refused(error: psycopg.OperationalError) -> EngineError | None:
    """The error (permanent) of a connect that PgBouncer refused for the
    startup ``options`` the engine sends to a direct server, else ``None``."""
    if "unsupported startup parameter" not in str(error):
        return None
    return EngineError(
        f"{engine_error(error)} (PgBouncer refuses the startup options "
        "the engine sends to a direct server: open the store with "
        "pooler='transaction' or pooler='session')",
        permanent=True,
    )


def no_connection_error(
    failed: tuple[float, psycopg.Error] | None,
    waited_since: float,
    timeout_s: float,
    max_size: int,
) -> EngineError:
    """Why no pooled connection came within ``timeout_s`` (the pool's
    ``timeout``) to an operation waiting since ``waited_since`` (monotonic
    seconds): the connects the pool tried meanwhile failed (``failed``, the
    last failed connect: when, and the error; the server is down, or out of
    slots), or every one of the ``max_size`` connections was in use."""
    if failed is not None and failed[0] >= waited_since:
        cause = engine_error(failed[1])
        return EngineError(
            f"no connection within pool_timeout_s ({timeout_s:g} s): connecting failed: {cause}",
            permanent=cause.permanent,
        )
    return EngineError(
        f"no connection within pool_timeout_s ({timeout_s:g} s): all "
        f"{max_size} of the pool's connections (pool_max_size) were in use"
    )


def idle_and_alive(conn: psycopg.BaseConnection[Any]) -> bool:
    """Whether an idle autocommit connection looks usable: open, and
    nothing to read on its socket (data there is the server's goodbye:
    restart, ``pg_terminate_backend``, idle timeout, or an error the
    kernel's keepalives found). A zero-timeout poll: no wait."""
    if conn.closed:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


#: Ends the sessions of the given server process ids, only those of this
#: role on this database, never this one (see ``Database._end_sessions``).
END_SESSIONS = """
    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE pid = ANY(%s) AND pid <> pg_backend_pid()
      AND usename = current_user AND datname = current_database()
"""


def drop_inherited(conn: psycopg.BaseConnection[Any]) -> None:
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


# What a forked child inherited (pools, connections), referenced so that no
# finalizer of theirs runs in the child.
_inherited: list[object] = []


def keep_inherited(thing: object) -> None:
    """Keep ``thing`` (a pool a forked child inherited) referenced for the
    process's lifetime, so that no finalizer of it runs in the child."""
    _inherited.append(thing)


# Why a connection cannot take an enqueue_tx, by its transaction status.
_NOT_IN_A_TRANSACTION = {
    TransactionStatus.IDLE: "not inside a transaction (BEGIN first, or use conn.transaction())",
    TransactionStatus.INERROR: "inside a failed transaction",
    TransactionStatus.ACTIVE: "busy running a command",
    TransactionStatus.UNKNOWN: "closed or broken",
}


def check_tx_connection(conn: object, wanted: type[psycopg.BaseConnection[Any]]) -> None:
    """Check the caller's connection of ``enqueue_tx`` before any statement
    (docs/contract.md §3 "Transactional enqueue"): a ``wanted``
    (``psycopg.Connection`` for the sync store, ``psycopg.AsyncConnection``
    for the async one), inside an open transaction, or idle outside
    autocommit (psycopg then begins the transaction before the enqueue's
    statement, as before the caller's own first one).

    Raises
    ------
    ValidationError
        For any other object (the other kind of psycopg connection named as
        such, with the store that takes it), or a connection in no
        transaction, in a failed one, busy, closed or broken.
    """
    if not isinstance(conn, wanted):
        what = f"{type(conn).__module__}.{type(conn).__qualname__}"
        hint = ""
        if isinstance(conn, psycopg.AsyncConnection):
            what = "a psycopg.AsyncConnection"
            hint = ": an AsyncConnection goes with the async store (alkstore.open_async)"
        elif isinstance(conn, psycopg.Connection):
            what = "a psycopg.Connection"
            hint = ": a sync Connection goes with the sync store (alkstore.open)"
        raise ValidationError(
            f"enqueue_tx needs a psycopg.{wanted.__name__} (psycopg 3) to the store's "
            f"database, not {what}{hint}"
        )
    status = conn.info.transaction_status
    begins = status == TransactionStatus.IDLE and not conn.autocommit
    if status != TransactionStatus.INTRANS and not begins:
        state = _NOT_IN_A_TRANSACTION.get(status, f"in state {status.name}")
        raise ValidationError(f"enqueue_tx: the connection is {state}")
