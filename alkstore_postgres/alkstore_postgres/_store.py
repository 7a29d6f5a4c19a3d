# WARNING: generated from _store_async.py by tools/async_to_sync.py.
# Do not edit: change _store_async.py, then run `python tools/async_to_sync.py`.
"""The PostgreSQL :class:`~alkstore.Store` and the engine's entry point.

One source for two modules (docs/async.md "How the engines do it"):
``_store_async`` is written by hand, ``_store`` is generated from it, as
are the engine's other I/O modules (``_queue``, ``_handle``, ``_listener``
...). The options and their checks are in :mod:`alkstore_postgres._options`,
shared by both.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from psycopg import sql

from alkstore import QueueOpts, Store, VacuumReport, WorkerInfo
from alkstore.engine import (
    EncodedPayload,
    Resolved,
    Schedule,
    UnreadableSchedule,
    check_engine_options,
    check_schema_version,
)
from alkstore_postgres import (
    _operations,
    _schedules,
    _schema,
    _vacuum,
    _workers,
)
from alkstore_postgres._clock import ServerClock
from alkstore_postgres._clock_sample import SAMPLE_CLOCK
from alkstore_postgres._compact import Compactor
from alkstore_postgres._connection import DatabaseIdentity, wrap_errors
from alkstore_postgres._database import (
    Conn,
    Database,
    check_pooled_server,
    database_identity,
)
from alkstore_postgres._listener import Listener
from alkstore_postgres._maintenance import maintenance_turn
from alkstore_postgres._migrate import migrate, read_version
from alkstore_postgres._options import (
    DEFAULT_POOL_MAX_SIZE,
    DEFAULT_POOL_MIN_SIZE,
    DEFAULT_POOL_TIMEOUT_S,
    DEFAULT_QUERY_TIMEOUT_S,
    DEFAULT_REPOLL_INTERVAL_S,
    ENGINE_OPTIONS,
    store_options,
)
from alkstore_postgres._queue import PostgresQueue
from alkstore_postgres._schema import Statement, StatementCache
from alkstore_postgres._subscription import PostgresSubscription
from alkstore_postgres._url import parse_url

__all__ = ["PostgresStore", "open_store"]


def _sample_clock(conn: Conn) -> tuple[datetime, float]:
    before = time.monotonic()
    row = conn.execute(SAMPLE_CLOCK, binary=True).fetchone()
    after = time.monotonic()
    assert row is not None
    server: datetime = row[0]
    return server, (before + after) / 2


class PostgresStore(Store):
    """An alkstore store in one PostgreSQL database (docs/contract.md §2).

    Open it with ``alkstore.open("postgresql://...")`` (or
    :func:`open_store`). Operations borrow autocommit connections
    from a ``psycopg_pool.ConnectionPool``; subscriptions share one
    LISTEN connection per store.

    Parameters
    ----------
    conninfo
        A libpq connection string or URL.
    clock, rng
        As :class:`~alkstore.Store`. With no clock, instants come from
        the database server's clock (docs/contract.md §3 "Time"; see the
        package README).
    migrate
        Create or upgrade the schema now (default); with ``False`` only
        check its version.
    schema
        The PostgreSQL schema holding alkstore's tables (default
        ``"alkstore"``): ``[a-z_][a-z0-9_]*``, at most 63 bytes.
    pool_min_size, pool_max_size
        The connection pool's bounds (default 1 and 64 connections). The
        pool grows only while operations wait for a connection and closes
        connections unused for 60 s, so it holds about as many as the
        store's operations use at once. The server must have slots for every
        process's pool: docs/deployment.md "Connection budget".
    pool_timeout_s
        Seconds an operation waits for a pooled connection before it fails
        with a non-permanent :class:`~alkstore.errors.EngineError` (default
        30) that says why: every connection was in use, or connecting
        failed (the server down, or its ``max_connections`` exhausted).
    query_timeout_s
        Seconds any one call of the engine may wait for the server's answer
        (default 15): an operation's statements, a migration, a maintenance
        turn's lock, the LISTEN connection's statements and pings, a
        connect (libpq's ``connect_timeout`` unless the URL or
        ``PGCONNECT_TIMEOUT`` sets one). A call past it fails with a
        non-permanent ``EngineError`` naming it, and its connection is
        dropped (every connection of the store made before is replaced when
        next used), so a retry runs on a new connection. The server's
        ``statement_timeout`` is set to 90% of it (unless the URL's
        ``options`` or ``PGOPTIONS`` set one), and TCP keepalives and
        ``tcp_user_timeout`` to about it (unless the URL sets them); see the
        package README. Not applied to the caller's connection of
        ``enqueue_tx``.
    repoll_interval_s
        Seconds between the safety-net re-polls of a consumer that waits on
        a subscription (default 30; read by the worker runtime from
        :attr:`repoll_interval_s`). The LISTEN connection is also pinged
        after this long without traffic, to find a silently dead one: a
        dead LISTEN connection is found within ``repoll_interval_s +
        query_timeout_s``, sooner when another call of the store found its
        connection dead.
    pooler
        What stands between the engine and the server (docs/deployment.md
        "PgBouncer"): ``None`` (default) for the server itself, or
        PgBouncer's ``pool_mode`` in front of it, ``"session"`` or
        ``"transaction"``. Behind either, the session settings are made by a
        statement after connecting instead of the startup ``options``
        (which PgBouncer refuses); in ``"transaction"`` mode the engine
        prepares no statement, takes only transaction-level advisory locks,
        makes only the ``TimeZone`` setting (the server keeps its own
        ``statement_timeout``; the watchdog still bounds every call), and
        refuses a server whose ``default_transaction_isolation`` is not
        ``read committed`` (``EngineError``, permanent).
    listen_url
        A URL (as ``conninfo``) for the LISTEN connection alone, reaching
        the server without a transaction pooler (default: ``conninfo``).
        Behind ``pooler="transaction"`` without it, which cannot carry a
        LISTEN, subscriptions never wake: consumers find new jobs by their
        re-polls every ``repoll_interval_s``, and the store logs one
        WARNING saying so at its first subscription.

    Raises
    ------
    ValidationError
        For a bad option.
    SchemaVersionError
        If the schema is newer than this code, or missing with
        ``migrate=False`` (docs/contract.md §3 "Schema").
    EngineError
        If the database cannot be reached, or does not answer within
        ``query_timeout_s``.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        clock: object = None,
        rng: object = None,
        migrate: bool = True,
        schema: object = _schema.DEFAULT_SCHEMA,
        pool_min_size: object = DEFAULT_POOL_MIN_SIZE,
        pool_max_size: object = DEFAULT_POOL_MAX_SIZE,
        pool_timeout_s: object = DEFAULT_POOL_TIMEOUT_S,
        query_timeout_s: object = DEFAULT_QUERY_TIMEOUT_S,
        repoll_interval_s: object = DEFAULT_REPOLL_INTERVAL_S,
        pooler: object = None,
        listen_url: object = None,
    ) -> None:
        super().__init__(clock=clock, rng=rng)
        options = store_options(
            conninfo,
            schema=schema,
            pool_min_size=pool_min_size,
            pool_max_size=pool_max_size,
            pool_timeout_s=pool_timeout_s,
            query_timeout_s=query_timeout_s,
            repoll_interval_s=repoll_interval_s,
            pooler=pooler,
            listen_url=listen_url,
        )
        self._pooler = options.pooler
        self._listen_conninfo = options.listen_conninfo
        self._schema = options.schema
        self._query_timeout_s = options.query_timeout_s
        self._repoll_interval_s = options.repoll_interval_s
        self._url = options.url
        self._statements = StatementCache(self._schema)
        self._compactor = Compactor(self)
        self._db = Database(
            conninfo,
            min_size=options.pool_min_size,
            max_size=options.pool_max_size,
            timeout_s=options.pool_timeout_s,
            query_timeout_s=self._query_timeout_s,
            name=f"alkstore-{self._schema}",
            pooler=self._pooler,
        )
        self._server_clock = ServerClock(self._sample_clock)
        self._listener = Listener(
            self._connect_listener,
            watchdog=self._db.watchdog,
            ping_interval_s=self._repoll_interval_s,
            name=f"alkstore-listener-{self._schema}",
            disabled=options.listen_disabled,
        )
        self._db.on_dead_connection.append(self._listener.check_soon)
        self._database: DatabaseIdentity
        self._open(migrate)

    def _open(self, migrate: bool) -> None:
        # Check or migrate the schema, sample the server's clock and read
        # the database's identity, then start the pool.
        try:
            # A direct connection first: an unreachable server fails here at
            # once rather than after the pool's timeout.
            conn = self._db.connect()
            try:
                with wrap_errors(), self._db.guard(conn):
                    check_pooled_server(conn, self._pooler)
                    if migrate:
                        self._migrate_on(conn)
                    else:
                        found = read_version(conn, self._schema)
                        where = f"schema {self._schema!r} of {self._url}"
                        check_schema_version(
                            found, _schema.SCHEMA_VERSION, migrating=False, where=where
                        )
                    if not self._clock_injected:
                        self._server_clock.set_sample(*_sample_clock(conn))
                    self._database = database_identity(conn)
            finally:
                conn.close()
            self._db.open(repr(self))
        except BaseException:
            self._closed = True
            self._db.close()
            raise

    def __repr__(self) -> str:
        return f"<PostgresStore {self._url!r} schema={self._schema!r}>"

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding this store's tables."""
        return self._schema

    @property
    def query_timeout_s(self) -> float:
        """Seconds any one call of the engine may wait for the server."""
        return self._query_timeout_s

    @property
    def repoll_interval_s(self) -> float:
        """Seconds between a consumer's safety-net re-polls (docs/contract.md §3
        "Wake": a wake is a hint)."""
        return self._repoll_interval_s

    def sql(self, statement: Statement | sql.SQL) -> bytes:
        """The statement rendered for this store's schema (cached)."""
        return self._statements(statement)

    # -- helpers for the other modules ---------------------------------------

    def _sample_clock(self) -> tuple[datetime, float]:
        with self._db.connection() as conn:
            return _sample_clock(conn)

    def _now_on(self, conn: Conn) -> datetime:
        """``_now()`` for an operation that holds ``conn``, read once the
        connection is at hand: an operation that waited for one (the server
        restarting, the pool busy) is judged at the instant it runs, not
        when it was called (docs/contract.md §3 "Claim identity and handle
        validity"). A due re-sample of the server's clock runs on ``conn``:
        no second pooled connection may be free.

        Raises
        ------
        psycopg.Error
            If the re-sample fails.
        """
        if self._clock_injected:
            return self._now()
        return self._server_clock.now(lambda: _sample_clock(conn))

    def _is_own_database(self, identity: DatabaseIdentity) -> bool:
        """Whether ``identity`` (see ``database_identity``) is this store's
        database; after a server restart, the store's is read again."""
        if identity == self._database:
            return True
        with self._db.connection() as conn:
            self._database = database_identity(conn)
        return identity == self._database

    def _connect_listener(self) -> Conn:
        if self._listen_conninfo is not None:
            return self._db.connect_direct(
                self._listen_conninfo, application_name="alkstore-listener"
            )
        return self._db.connect(application_name="alkstore-listener")

    def _migrate_on(self, conn: Conn) -> None:
        # Through a transaction pooler a session-level lock could be taken
        # on one server connection and released on another.
        migrate(
            conn,
            self._schema,
            self._injected_now(),
            transaction_lock=self._pooler == "transaction",
        )

    def _injected_now(self) -> datetime | None:
        # The migration's "now": the injected clock's, else the server's own
        # (the server clock is not sampled yet when the store opens).
        return self._now() if self._clock_injected else None

    # -- engine primitives ---------------------------------------------------

    def _engine_now(self) -> datetime:
        return self._server_clock.now()

    def _open_queue(self, name: str, opts: QueueOpts) -> PostgresQueue:
        return PostgresQueue(self, name, opts)

    def _open_subscription(self, queue_name: str) -> PostgresSubscription:
        subscription = PostgresSubscription(self, queue_name)
        subscription._subscribe()
        return subscription

    def _migrate(self) -> None:
        with self._db.connection() as conn:
            self._migrate_on(conn)

    def _schema_version(self) -> int | None:
        with self._db.connection() as conn:
            return read_version(conn, self._schema)

    def _close(self) -> None:
        try:
            self._listener.stop()
        finally:
            self._db.close()

    # -- queue listing, schedules, maintenance (docs/operations.md,
    # docs/schedules.md); the SQL is in _sql.operations, _sql.schedules and
    # _sql.maintenance.

    def _queue_names(self) -> list[str]:
        return _operations.queue_names(self)

    def _put_worker(self, info: WorkerInfo) -> None:
        _workers.put_worker(self, info)

    def _delete_worker(self, worker_id: str) -> bool:
        return _workers.delete_worker(self, worker_id)

    def _list_workers(self, now: datetime) -> list[WorkerInfo]:
        return _workers.list_workers(self, now)

    def vacuum_report(self) -> VacuumReport:
        """The store's tables' live and dead row versions (the server's
        statistics) and the oldest things that hold the xmin horizon, so
        keep vacuum from removing dead rows: sessions in a transaction,
        replication slots, prepared transactions (the optional capability
        :class:`alkstore.VacuumReporting`; docs/operations.md "Long
        transactions").

        Raises
        ------
        StoreClosedError
            If the store is closed.
        EngineError
            If the database fails.
        """
        self._check_open()
        return _vacuum.vacuum_report(self)

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


def open_store(url: str, **engine_options: Any) -> PostgresStore:
    """Open a PostgreSQL store: ``alkstore.open`` opens a
    ``postgresql://`` or ``postgres://`` URL with it (through the
    ``alkstore.engines`` entry points).

    Parameters
    ----------
    url
        A libpq connection URI, ``postgresql://user:password@host:port/db``
        (``postgres://`` too; every libpq parameter works).
    **engine_options
        ``clock``, ``rng``, ``migrate`` (docs/contract.md §2), and ``schema``,
        ``pool_min_size``, ``pool_max_size``, ``pool_timeout_s``,
        ``query_timeout_s``, ``repoll_interval_s``, ``pooler``,
        ``listen_url`` (see :class:`PostgresStore`; behind PgBouncer,
        docs/deployment.md "PgBouncer").

    Returns
    -------
    PostgresStore
        Open, and migrated unless ``migrate=False``.

    Raises
    ------
    ValidationError
        For a malformed URL or an unknown or bad option (before any I/O).
    SchemaVersionError
        See :class:`PostgresStore`.
    EngineError
        If the database cannot be reached, or does not answer within
        ``query_timeout_s``.
    """
    check_engine_options(engine_options, ENGINE_OPTIONS)
    conninfo = parse_url(url)
    store = PostgresStore(conninfo, **engine_options)
    return store
