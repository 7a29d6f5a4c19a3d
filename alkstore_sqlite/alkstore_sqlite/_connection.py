"""Connection handling: a small pool, busy handling and error wrapping.

A ``sqlite3.Connection`` must not be used by two threads at once, so each
operation borrows one from a :class:`ConnectionPool` and gives it back; the
pool grows to the number of threads that run operations at the same time.
Connections run in autocommit mode (``isolation_level=None``): a single
statement is its own transaction, and multi-statement writes say
``BEGIN IMMEDIATE`` themselves, taking the write lock up front so that a
read snapshot is never upgraded to a write (the upgrade fails with
``SQLITE_BUSY_SNAPSHOT`` at once instead of waiting).

SQLite waits for locks itself up to the busy timeout; a few busy results do
not wait (WAL recovery, changing the journal mode), so :meth:`run` and
:meth:`transaction` retry the whole operation on ``SQLITE_BUSY`` and
``SQLITE_LOCKED`` until the busy timeout has passed. Every other
``sqlite3`` error becomes an :class:`~alkstore.errors.EngineError` with the
driver's error as ``__cause__`` (docs/contract.md §2 "Errors"). Opening a store does not
wait for a lock held by a connection of this process, which may be its own
caller's (:meth:`ConnectionPool.run_refusing_own_locks`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from alkstore.errors import EngineError, StoreClosedError
from alkstore_sqlite._identity import FileGuard
from alkstore_sqlite._locks import Probes, held_by_this_process

__all__ = [
    "ConnectionPool",
    "close_inherited",
    "close_connection",
    "connect",
    "engine_error",
    "fetchall",
    "fetchone",
    "file_lock",
    "is_busy",
    "rowcount",
    "run_in_transaction",
]

P = ParamSpec("P")
T = TypeVar("T")

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_CANTOPEN = 14
_SQLITE_NOTADB = 26
_SQLITE_CORRUPT = 11
# Failures no retry mends until someone steps in (EngineError.permanent): the
# file cannot be written or opened, or is not (or no longer) a database.
_PERMANENT = frozenset({_SQLITE_READONLY, _SQLITE_CANTOPEN, _SQLITE_NOTADB, _SQLITE_CORRUPT})
# Pauses between retries of an operation that came back busy without
# SQLite's own busy handler having waited (seconds).
_RETRY_FIRST_S = 0.001
_RETRY_MAX_S = 0.05
# Enough for the statements of every queue operation, which are reused
# through sqlite3's per-connection statement cache.
_CACHED_STATEMENTS = 64


def is_busy(error: sqlite3.Error) -> bool:
    """Whether ``error`` is ``SQLITE_BUSY``/``SQLITE_LOCKED`` (any extended code)."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    return isinstance(error, sqlite3.OperationalError) and "locked" in str(error)


def engine_error(error: sqlite3.Error, path: str | None = None) -> EngineError:
    """Wrap a driver error; raise the result ``from error``.

    Parameters
    ----------
    path
        The database file the error came from: errors about opening or
        writing the file itself name it, with the likely cause.
    """
    code = getattr(error, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    permanent = primary in _PERMANENT
    if path is not None and primary in (_SQLITE_CANTOPEN, _SQLITE_READONLY):
        return EngineError(
            f"SQLite error: {error}: {path!r} ({_file_problem(path)})", permanent=permanent
        )
    if path is not None and primary == _SQLITE_NOTADB:
        return EngineError(
            f"SQLite error: {error}: {path!r} (the file exists but is not an SQLite "
            "database; the URL should name a new file or an alkstore database)",
            permanent=permanent,
        )
    return EngineError(f"SQLite error: {error}", permanent=permanent)


def _file_problem(path: str) -> str:
    """Why SQLite may be unable to open or write ``path``, for a message."""
    directory = os.path.dirname(path) or "."
    if os.path.isdir(path):
        return "it is a directory; give the path of a database file"
    if not os.path.isdir(directory):
        return f"the directory {directory!r} does not exist; alkstore does not create directories"
    if not os.access(directory, os.W_OK | os.X_OK):
        return (
            f"the directory {directory!r} is not writable; SQLite creates the database "
            "and its -wal and -shm files beside each other"
        )
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        return "the file is not readable and writable by this process"
    return "check that the path names a database file in a writable directory"


#: The ``synchronous`` engine option's values (SQLite's PRAGMA of that name).
SYNCHRONOUS = ("full", "normal")


def connect(
    path: str,
    busy_timeout_s: float,
    synchronous: str = "full",
    before_first_read: Callable[[], object] | None = None,
) -> sqlite3.Connection:
    """Open one connection to ``path`` with alkstore's settings.

    ``synchronous`` is ``"full"`` (the default: every commit is on disk
    before it returns, so nothing committed is lost even to a power cut) or
    ``"normal"`` (in WAL mode a commit survives a crash of the process, but a
    power loss may drop the last commits; about ten times more commits per
    second). See the package README.

    ``before_first_read`` runs once the file is open and before anything is
    read from it (setting a PRAGMA reads the schema, which opens the
    ``-wal`` and ``-shm`` files); if it raises, the connection is closed
    and the error propagates.
    """
    conn = sqlite3.connect(
        path,
        timeout=busy_timeout_s,
        isolation_level=None,
        check_same_thread=False,
        cached_statements=_CACHED_STATEMENTS,
    )
    try:
        if before_first_read is not None:
            before_first_read()
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
    except BaseException:
        conn.close()
        raise
    return conn


class ConnectionPool:
    """Connections to one database file, lent to one thread at a time.

    Parameters
    ----------
    path
        The database file.
    busy_timeout_s
        Seconds an operation waits for a lock before it fails with
        :class:`~alkstore.errors.EngineError`.
    synchronous
        ``"full"`` or ``"normal"``, as :func:`connect`.

    Attributes
    ----------
    guard
        Whether the path still names the files the pool opened
        (:class:`~alkstore_sqlite._identity.FileGuard`), armed by
        :meth:`arm_guard`: once it saw them go, every operation raises
        ``EngineError(permanent=True)``, and no connection is ever opened
        on whatever file took their place.
    """

    def __init__(self, path: str, busy_timeout_s: float, synchronous: str = "full") -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self.synchronous = synchronous
        self.guard = FileGuard(path)
        self._file_key = os.path.realpath(path)
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._closed = False
        _pools.add(self)

    def arm_guard(self) -> None:
        """Start comparing the path with the files it names now; call once
        the file is ready (the store opened it).

        Raises
        ------
        EngineError
            If the database cannot be read.
        """
        try:
            witness = connect(self.path, self.busy_timeout_s, self.synchronous)
        except sqlite3.Error as error:
            raise engine_error(error, self.path) from error
        try:
            # A read opens the -wal and -shm files.
            witness.execute("SELECT count(*) FROM sqlite_schema").fetchone()
        except BaseException as error:
            close_connection(witness, self._file_key)
            if isinstance(error, sqlite3.Error):
                raise engine_error(error, self.path) from error
            raise
        self.guard.arm(witness)

    # -- lending -------------------------------------------------------------

    def _acquire(self) -> sqlite3.Connection:
        self.guard.check()
        with self._lock:
            if self._closed:
                raise StoreClosedError("the store is closed")
            if self._idle:
                return self._idle.pop()
        # A new connection opens whatever the path names now: never one on
        # a file that took the opened one's place. It must not even read
        # it: its -wal and -shm files may still be the opened ones, and
        # its closing would replay them into the new file.
        return connect(
            self.path, self.busy_timeout_s, self.synchronous, before_first_read=self.guard.check_now
        )

    def _release(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            # Only after a failure inside ROLLBACK itself; never lend out a
            # connection with a transaction open.
            close_connection(conn, self._file_key)
            return
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        close_connection(conn, self._file_key)

    def close(self) -> None:
        """Close the idle connections; lent ones close when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        witness = self.guard.disarm()
        with file_lock(self._file_key):
            for conn in idle:
                conn.close()
            if witness is not None:
                witness.close()

    def _after_fork_in_child(self) -> None:
        # A connection inherited across fork() must not be used (D15), and
        # must not stay open either: SQLite keeps its POSIX lock bookkeeping
        # per process and per file, and the inherited copy says this process
        # holds the locks the parent's connections took, which fork() did
        # not give the child. New connections would then never take their
        # own, and a parent that closed its store would checkpoint and
        # delete the WAL under the child's writes. Close them first, before
        # any new one: closing only drops the child's (empty) share of the
        # locks, and checkpoints only if nobody else holds the file.
        self._lock = threading.Lock()
        idle, self._idle = self._idle, []
        witness = self.guard.after_fork_in_child()
        for conn in [*idle, *([witness] if witness is not None else [])]:
            close_inherited(conn)

    # -- running operations --------------------------------------------------

    def run(
        self,
        op: Callable[Concatenate[sqlite3.Connection, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run ``op(conn, ...)`` on a borrowed autocommit connection.

        For reads and single-statement writes (a statement is atomic on its
        own). Busy results are retried as a whole.

        Raises
        ------
        EngineError
            For any ``sqlite3`` error, the driver's error as ``__cause__``.
        StoreClosedError
            If the pool was closed.
        """
        # SQLite's own busy handler counts against the same budget.
        deadline = time.monotonic() + self.busy_timeout_s
        pause = _RETRY_FIRST_S
        while True:
            try:
                conn = self._acquire()
            except sqlite3.Error as error:
                raise engine_error(error, self.path) from error
            try:
                return op(conn, *args, **kwargs)
            except sqlite3.Error as error:
                if not is_busy(error) or time.monotonic() >= deadline:
                    raise engine_error(error, self.path) from error
            finally:
                self._release(conn)
            time.sleep(pause)
            pause = min(pause * 2, _RETRY_MAX_S)

    def run_refusing_own_locks(
        self,
        probes: Probes,
        refusal: Callable[[], Exception],
        op: Callable[Concatenate[sqlite3.Connection, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """As :meth:`run`, but never wait for a lock that a connection of
        this process holds: raise ``refusal()`` at once instead.

        The holder may be the caller's own transaction (the application's
        connection around ``enqueue_tx``), which cannot end before this
        returns. ``op`` first runs with SQLite's busy handler off; if it
        comes back busy and a lock of this process blocks it
        (:func:`~alkstore_sqlite._locks.held_by_this_process` with
        ``probes``), that is the refusal; otherwise (another process holds
        the lock, or it was let go meanwhile, or the platform cannot tell)
        it runs as :meth:`run` does, waiting up to the busy timeout.

        Raises
        ------
        Exception
            ``refusal()``, as above.
        EngineError, StoreClosedError
            As :meth:`run`.
        """
        self.guard.check()
        with self._lock:
            if self._closed:
                raise StoreClosedError("the store is closed")
            conn = self._idle.pop() if self._idle else None
        try:
            if conn is None:
                # Setting a new connection up reads the file too.
                conn = connect(self.path, 0.0, self.synchronous)
            else:
                conn.execute("PRAGMA busy_timeout = 0")
        except sqlite3.Error as error:
            if not is_busy(error):
                raise engine_error(error, self.path) from error
        else:
            try:
                return op(conn, *args, **kwargs)
            except sqlite3.Error as error:
                if not is_busy(error):
                    raise engine_error(error, self.path) from error
            finally:
                conn.execute(f"PRAGMA busy_timeout = {_busy_timeout_ms(self.busy_timeout_s)}")
                self._release(conn)
        if held_by_this_process(self.path, probes):
            raise refusal()
        return self.run(op, *args, **kwargs)

    def transaction(
        self,
        op: Callable[Concatenate[sqlite3.Connection, P], T],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run ``op(conn, ...)`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT``.

        Any exception rolls the transaction back and propagates (a
        ``sqlite3`` error as :class:`~alkstore.errors.EngineError`); busy
        results retry the whole transaction.

        Raises
        ------
        EngineError
            For any ``sqlite3`` error, the driver's error as ``__cause__``.
        StoreClosedError
            If the pool was closed.
        """
        return self.run(run_in_transaction, op, *args, **kwargs)


def _busy_timeout_ms(seconds: float) -> int:
    # As sqlite3.connect(timeout=) sets it; SQLite takes a C int.
    return min(int(seconds * 1000), 2**31 - 1)


def run_in_transaction(
    conn: sqlite3.Connection,
    op: Callable[Concatenate[sqlite3.Connection, P], T],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run ``op(conn, ...)`` between ``BEGIN IMMEDIATE`` and ``COMMIT`` on an
    autocommit connection; any exception rolls back and propagates."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = op(conn, *args, **kwargs)
        conn.execute("COMMIT")
    except BaseException:
        # Some errors (SQLITE_FULL, SQLITE_IOERR ...) roll back by themselves.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


# Every pool of this process, to close inherited connections after fork().
_pools: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()

# One lock per database file (by real path) in this process, held while a
# store prepares the file (SqliteStore._prepare) and while alkstore closes a
# connection to it. Closing the last connection to a file checkpoints it
# under SQLite's exclusive lock: a store preparing the file meanwhile would
# find that lock held by this process and take it for its caller's
# (ConnectionPool.run_refusing_own_locks). Re-entrant: preparing may close.
_file_locks_lock = threading.Lock()
_file_locks: dict[str, threading.RLock] = {}


def file_lock(key: str) -> threading.RLock:
    """The lock of the database file whose real path is ``key``."""
    with _file_locks_lock:
        lock = _file_locks.get(key)
        if lock is None:
            lock = _file_locks[key] = threading.RLock()
        return lock


def close_connection(conn: sqlite3.Connection, key: str) -> None:
    """Close ``conn``, a connection to the file whose real path is ``key``,
    under :func:`file_lock`."""
    with file_lock(key):
        conn.close()


def close_inherited(conn: sqlite3.Connection) -> None:
    """Close a connection a forked child inherited (see
    ``ConnectionPool._after_fork_in_child``); never raises."""
    with contextlib.suppress(sqlite3.Error):
        conn.close()


def _after_fork_in_child() -> None:
    global _file_locks_lock, _file_locks
    # Locks held by the parent's other threads would never be let go here.
    _file_locks_lock, _file_locks = threading.Lock(), {}
    for pool in list(_pools):
        pool._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


# One statement on a borrowed connection, for ``ConnectionPool.run``.


def rowcount(conn: sqlite3.Connection, sql: str, params: Any) -> int:
    """Run ``sql``; how many rows it changed."""
    return conn.execute(sql, params).rowcount


def fetchone(conn: sqlite3.Connection, sql: str, params: Any) -> Any:
    """Run ``sql``; its first row, or ``None``."""
    return conn.execute(sql, params).fetchone()


def fetchall(conn: sqlite3.Connection, sql: str, params: Any) -> list[Any]:
    """Run ``sql``; all its rows."""
    return conn.execute(sql, params).fetchall()
