"""The SQLite :class:`~alkstore.Store` and the engine's entry point."""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from alkstore import QueueOpts, Store, WorkerInfo
from alkstore.engine import (
    EncodedPayload,
    Resolved,
    Schedule,
    UnreadableSchedule,
    check_engine_options,
    check_schema_version,
    duration_s,
)
from alkstore.errors import SchemaVersionError, ValidationError
from alkstore_sqlite import _identity, _locks, _operations, _schedules, _schema, _workers
from alkstore_sqlite._connection import (
    SYNCHRONOUS,
    ConnectionPool,
    file_lock,
    run_in_transaction,
)
from alkstore_sqlite._maintenance import maintenance_turn
from alkstore_sqlite._queue import SqliteQueue
from alkstore_sqlite._rows import to_us
from alkstore_sqlite._subscription import SqliteSubscription
from alkstore_sqlite._url import parse_url
from alkstore_sqlite._wake import WatchKey

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "DEFAULT_POLL_INTERVAL_S",
    "ENGINE_OPTIONS",
    "SqliteStore",
    "open_store",
]

#: Seconds an operation waits for another connection's write lock.
DEFAULT_BUSY_TIMEOUT_S = 30.0
#: Seconds between two polls of the cross-process change detector.
DEFAULT_POLL_INTERVAL_S = 0.001
#: The engine options of this engine, besides docs/contract.md §2's common ones.
ENGINE_OPTIONS = frozenset({"busy_timeout_s", "poll_interval_s", "synchronous"})


class SqliteStore(Store):
    """An alkstore store in one SQLite database file (docs/contract.md §2).

    Open it with ``alkstore.open("sqlite:///path.db")`` (or
    :func:`open_store`). The file is put in WAL mode; a store lends
    connections from a small pool to the threads that use it.

    Parameters
    ----------
    path
        The database file; created if missing (unless ``migrate=False``).
    clock, rng
        As :class:`~alkstore.Store`; with no clock, instants come from the
        system clock (docs/contract.md §3 "Time").
    migrate
        Create or upgrade the schema now (default); with ``False`` only
        check its version.
    busy_timeout_s
        Seconds an operation waits for another connection's write lock
        before it fails with :class:`~alkstore.errors.EngineError`
        (default 30).
    poll_interval_s
        Seconds between two polls of the cross-process wake detector while
        commits are coming (default 0.001); when the file is quiet it waits
        for inotify, or without inotify backs off to 50 ms.
    synchronous
        ``"full"`` (default): each commit is on disk before the call
        returns, so nothing committed is lost even to a power cut;
        ``"normal"``: a commit survives a crash of the process but a power
        loss may drop the last ones, for about ten times the commit rate.

    Raises
    ------
    ValidationError
        For a bad option.
    SchemaVersionError
        If the schema is newer than this code, or missing or older with
        ``migrate=False`` (docs/contract.md §3 "Schema"); or, at once, if the file needs
        a write to be ready (no schema yet, an older one, not in WAL mode)
        while a connection of this process holds a lock that the write
        must wait for, such as the application's own open transaction.
        Opening a file that is ready only reads it.
    EngineError
        If the database cannot be opened.
    """

    def __init__(
        self,
        path: str,
        *,
        clock: object = None,
        rng: object = None,
        migrate: bool = True,
        busy_timeout_s: object = DEFAULT_BUSY_TIMEOUT_S,
        poll_interval_s: object = DEFAULT_POLL_INTERVAL_S,
        synchronous: object = "full",
    ) -> None:
        super().__init__(clock=clock, rng=rng)
        if synchronous not in SYNCHRONOUS:
            raise ValidationError(
                f"synchronous must be one of {', '.join(map(repr, SYNCHRONOUS))}, "
                f"got {synchronous!r}"
            )
        self._busy_timeout_s = duration_s(busy_timeout_s, "busy_timeout_s", positive=True)
        self._poll_interval_s = duration_s(poll_interval_s, "poll_interval_s", positive=True)
        self._path = os.path.abspath(path)
        if not migrate and not os.path.exists(self._path):
            # Do not create an empty file only to report that it is empty.
            check_schema_version(None, _schema.SCHEMA_VERSION, migrating=False, where=self._path)
        self._pool = ConnectionPool(self._path, self._busy_timeout_s, str(synchronous))
        self._subscriptions: set[SqliteSubscription] = set()
        self._subscriptions_lock = threading.Lock()
        try:
            # The registry key of the wake detector: one per file, whatever
            # relative path or symlink named it.
            self._file_key = os.path.realpath(self._path)
            self._prepare(migrate)
            # From here on the path must go on naming the files opened
            # (_identity): a deleted or replaced file fails every operation.
            self._pool.arm_guard()
            opened = self._pool.guard.opened
            assert opened is not None
            self._opened = opened
            self._wake_key: WatchKey = (self._file_key, opened.db)
        except BaseException:
            self._closed = True
            self._pool.close()
            raise

    def __repr__(self) -> str:
        return f"<SqliteStore {self._path!r}>"

    @property
    def path(self) -> str:
        """The database file's absolute path."""
        return self._path

    # -- engine primitives ---------------------------------------------------

    def _open_queue(self, name: str, opts: QueueOpts) -> SqliteQueue:
        return SqliteQueue(self, name, opts)

    def _open_subscription(self, queue_name: str) -> SqliteSubscription:
        subscription = SqliteSubscription(self, queue_name)
        with self._subscriptions_lock:
            self._subscriptions.add(subscription)
        return subscription

    def _forget_subscription(self, subscription: SqliteSubscription) -> None:
        with self._subscriptions_lock:
            self._subscriptions.discard(subscription)

    def _migrate(self) -> None:
        self._prepare(migrate=True)

    def _prepare(self, migrate: bool) -> None:
        """Make the file ready for this code: WAL mode and, with ``migrate``,
        the current schema; otherwise check its version (docs/contract.md §3 "Schema").

        A file that is ready already is only read: no write lock, so
        opening never waits for the application's transaction on the file
        (a first ``enqueue_tx`` inside it opens the store). A file that
        needs a write does not wait for a lock of this process either: the
        holder may be that very transaction, so it raises
        :class:`SchemaVersionError` at once, saying to open the store or run
        ``alkstore migrate`` first. Other processes' locks are waited for
        up to the busy timeout. Stores of this process prepare one file one
        at a time, so they never take each other's locks for the caller's.
        """
        pool = self._pool
        with file_lock(self._file_key):
            # A store of this process whose files were replaced at this
            # path removes what they left there before this one reads it.
            _identity.settle(self._path)
            found, journal_mode = pool.run_refusing_own_locks(
                _locks.READ, lambda: self._refusal("read the schema version of"), _read_state
            )
            check_schema_version(found, _schema.SCHEMA_VERSION, migrating=migrate, where=self._path)
            if journal_mode != "wal":
                pool.run_refusing_own_locks(
                    _locks.SWITCH_TO_WAL, lambda: self._refusal("switch to WAL mode"), _set_wal
                )
            if found == _schema.SCHEMA_VERSION:
                return
            if not migrate:
                # This code's statements need the current schema.
                raise SchemaVersionError(
                    f"the database schema is version {found}, older than this "
                    f"code's {_schema.SCHEMA_VERSION}; open it with migrate=True "
                    "or run `alkstore migrate`",
                    found=found,
                    expected=_schema.SCHEMA_VERSION,
                )
            what = (
                "create the alkstore schema in"
                if found is None
                else f"upgrade the alkstore schema (version {found}) to {_schema.SCHEMA_VERSION} in"
            )
            pool.run_refusing_own_locks(
                _locks.WRITE,
                lambda: self._refusal(what),
                run_in_transaction,
                _schema.migrate,
                to_us(self._now()),
            )

    def _refusal(self, what: str) -> SchemaVersionError:
        return SchemaVersionError(
            f"cannot {what} {self._path!r}: a connection of this process holds a lock "
            "on the database that this needs (a transaction is open on the file, perhaps "
            "the one this call is part of), and waiting for it would wait for ourselves. "
            "Open the store (alkstore.open, or App.store at start-up) or run "
            "`alkstore migrate` before starting transactions on the file"
        )

    def _schema_version(self) -> int | None:
        return self._pool.run(_schema.read_version)

    def _close(self) -> None:
        with self._subscriptions_lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            subscription.close()
        self._pool.close()

    # -- operations, schedules and maintenance turns (docs/operations.md,
    # docs/schedules.md); the SQL is in _operations, _schedules and
    # _maintenance.

    def _queue_names(self) -> list[str]:
        return _operations.queue_names(self)

    def _put_worker(self, info: WorkerInfo) -> None:
        _workers.put_worker(self, info)

    def _delete_worker(self, worker_id: str) -> bool:
        return _workers.delete_worker(self, worker_id)

    def _list_workers(self, now: datetime) -> list[WorkerInfo]:
        return _workers.list_workers(self, now)

    def _put_schedule(self, schedule: Schedule) -> Schedule:
        return _schedules.put_schedule(self, schedule)

    def _delete_schedule(self, name: str) -> bool:
        return _schedules.delete_schedule(self, name)

    def _list_schedules(self, due_at: datetime | None) -> list[Schedule | UnreadableSchedule]:
        return _schedules.list_schedules(self, due_at)

    def _fire_schedule(
        self,
        schedule: Schedule,
        boundary: datetime,
        next_run_at: datetime,
        resolved: Resolved,
        payload: EncodedPayload,
    ) -> int | None:
        return _schedules.fire_schedule(
            self,
            schedule,
            boundary=boundary,
            next_run_at=next_run_at,
            resolved=resolved,
            payload=payload,
        )

    def _skip_schedule(self, schedule: Schedule, next_run_at: datetime) -> bool:
        return _schedules.skip_schedule(self, schedule, next_run_at)

    def _maintenance_turn(self, task: str, interval_s: float) -> AbstractContextManager[bool]:
        return maintenance_turn(self, task, interval_s)


def _read_state(conn: sqlite3.Connection) -> tuple[int | None, str]:
    """The schema version and the journal mode; reads only."""
    # The version first: reading the file tells SQLite its journal mode.
    version = _schema.read_version(conn)
    mode: str = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return version, mode.lower()


def _set_wal(conn: sqlite3.Connection) -> None:
    # WAL lets readers run beside the one writer; the setting is stored in
    # the file, so only the first open of a file changes it.
    conn.execute("PRAGMA journal_mode = WAL").fetchone()


def open_store(url: str, **engine_options: Any) -> SqliteStore:
    """Open a SQLite store; the ``alkstore.engines`` entry point ``sqlite``.

    Parameters
    ----------
    url
        ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``
        (docs/contract.md §2).
    **engine_options
        ``clock``, ``rng``, ``migrate`` (docs/contract.md §2), ``busy_timeout_s`` and
        ``poll_interval_s`` (see :class:`SqliteStore`).

    Returns
    -------
    SqliteStore
        Open, and migrated unless ``migrate=False``.

    Raises
    ------
    ValidationError
        For a malformed URL or an unknown or bad option.
    SchemaVersionError
        See :class:`SqliteStore`.
    EngineError
        If the database cannot be opened.
    """
    check_engine_options(engine_options, ENGINE_OPTIONS)
    path = parse_url(url)
    return SqliteStore(path, **engine_options)
