"""The PostgreSQL :class:`~alkstore.AsyncStore` and the engine's entry point.

One source for two modules (docs/async.md "How the engines do it"):
``_store_async`` is written by hand, ``_store`` is generated from it, as
are the engine's other I/O modules (``_queue``, ``_handle``, ``_listener``
...). The options and their checks are in :mod:`alkstore_postgres._options`,
shared by both.
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from psycopg import sql

from alkstore import AsyncStore, QueueOpts, VacuumReport, WorkerInfo
from alkstore.engine import (
    EncodedPayload,
    Resolved,
    Schedule,
    UnreadableSchedule,
    check_engine_options,
    check_schema_version,
)
from alkstore.engine_async import is_async
from alkstore_postgres import (
    _operations_async,
    _schedules_async,
    _schema,
    _vacuum_async,
    _workers_async,
)
from alkstore_postgres._clock_async import AsyncServerClock
from alkstore_postgres._clock_sample import SAMPLE_CLOCK
from alkstore_postgres._compact_async import AsyncCompactor
from alkstore_postgres._connection import DatabaseIdentity, wrap_errors
from alkstore_postgres._database_async import (
    AsyncConn,
    AsyncDatabase,
    check_pooled_server,
    database_identity,
)
from alkstore_postgres._listener_async import AsyncListener
from alkstore_postgres._maintenance_async import maintenance_turn
from alkstore_postgres._migrate_async import migrate, read_version
from alkstore_postgres._options import (
    DEFAULT_POOL_MAX_SIZE,
    DEFAULT_POOL_MIN_SIZE,
    DEFAULT_POOL_TIMEOUT_S,
    DEFAULT_QUERY_TIMEOUT_S,
    DEFAULT_REPOLL_INTERVAL_S,
    ENGINE_OPTIONS,
    store_options,
)
from alkstore_postgres._queue_async import AsyncPostgresQueue
from alkstore_postgres._schema import Statement, StatementCache
from alkstore_postgres._subscription_async import AsyncPostgresSubscription
from alkstore_postgres._url import parse_url

__all__ = ["AsyncPostgresStore", "open_async_store"]


async def _sample_clock(conn: AsyncConn) -> tuple[datetime, float]:
    before = time.monotonic()
    row = await (await conn.execute(SAMPLE_CLOCK, binary=True)).fetchone()
    after = time.monotonic()
    assert row is not None
    server: datetime = row[0]
    return server, (before + after) / 2


class AsyncPostgresStore(AsyncStore):
    """An alkstore store in one PostgreSQL database (docs/contract.md §2).

    Open it with ``alkstore.open_async("postgresql://...")`` (or
    :func:`open_async_store`). Operations borrow autocommit connections
    from a ``psycopg_pool.AsyncConnectionPool``; subscriptions share one
    LISTEN connection per store.

    Parameters
    ----------
    conninfo
        A libpq connection string or URL.
    clock, rng
        As :class:`~alkstore.AsyncStore`. With no clock, instants come from
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
        self._compactor = AsyncCompactor(self)
        self._db = AsyncDatabase(
            conninfo,
            min_size=options.pool_min_size,
            max_size=options.pool_max_size,
            timeout_s=options.pool_timeout_s,
            query_timeout_s=self._query_timeout_s,
            name=f"alkstore-{self._schema}",
            pooler=self._pooler,
        )
        self._server_clock = AsyncServerClock(self._sample_clock)
        self._listener = AsyncListener(
            self._connect_listener,
            watchdog=self._db.watchdog,
            ping_interval_s=self._repoll_interval_s,
            name=f"alkstore-listener-{self._schema}",
            disabled=options.listen_disabled,
        )
        self._db.on_dead_connection.append(self._listener.check_soon)
        self._database: DatabaseIdentity
        if is_async():
            # A constructor cannot await: open_async_store opens the store.
            self._migrate_at_open = migrate
        else:
            self._open(migrate)  # type: ignore[unused-coroutine]

    async def _open(self, migrate: bool) -> None:
        # Check or migrate the schema, sample the server's clock and read
        # the database's identity, then start the pool.
        try:
            # A direct connection first: an unreachable server fails here at
            # once rather than after the pool's timeout.
            conn = await self._db.connect()
            try:
                with wrap_errors():
                    async with self._db.guard(conn):
                        await check_pooled_server(conn, self._pooler)
                        if migrate:
                            await self._migrate_on(conn)
                        else:
                            found = await read_version(conn, self._schema)
                            where = f"schema {self._schema!r} of {self._url}"
                            check_schema_version(
                                found, _schema.SCHEMA_VERSION, migrating=False, where=where
                            )
                        if not self._clock_injected:
                            self._server_clock.set_sample(*await _sample_clock(conn))
                        self._database = await database_identity(conn)
            finally:
                await conn.close()
            await self._db.open(repr(self))
        except BaseException:
            self._closed = True
            await self._db.close()
            raise

    def __repr__(self) -> str:
        return f"<AsyncPostgresStore {self._url!r} schema={self._schema!r}>"

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

    async def _sample_clock(self) -> tuple[datetime, float]:
        async with self._db.connection() as conn:
            return await _sample_clock(conn)

    async def _now_on(self, conn: AsyncConn) -> datetime:
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
            return await self._now()
        return await self._server_clock.now(lambda: _sample_clock(conn))

    async def _is_own_database(self, identity: DatabaseIdentity) -> bool:
        """Whether ``identity`` (see ``database_identity``) is this store's
        database; after a server restart, the store's is read again."""
        if identity == self._database:
            return True
        async with self._db.connection() as conn:
            self._database = await database_identity(conn)
        return identity == self._database

    async def _connect_listener(self) -> AsyncConn:
        if self._listen_conninfo is not None:
            return await self._db.connect_direct(
                self._listen_conninfo, application_name="alkstore-listener"
            )
        return await self._db.connect(application_name="alkstore-listener")

    async def _migrate_on(self, conn: AsyncConn) -> None:
        # Through a transaction pooler a session-level lock could be taken
        # on one server connection and released on another.
        await migrate(
            conn,
            self._schema,
            await self._injected_now(),
            transaction_lock=self._pooler == "transaction",
        )

    async def _injected_now(self) -> datetime | None:
        # The migration's "now": the injected clock's, else the server's own
        # (the server clock is not sampled yet when the store opens).
        return await self._now() if self._clock_injected else None

    # -- engine primitives ---------------------------------------------------

    async def _engine_now(self) -> datetime:
        return await self._server_clock.now()

    def _open_queue(self, name: str, opts: QueueOpts) -> AsyncPostgresQueue:
        return AsyncPostgresQueue(self, name, opts)

    async def _open_subscription(self, queue_name: str) -> AsyncPostgresSubscription:
        subscription = AsyncPostgresSubscription(self, queue_name)
        await subscription._subscribe()
        return subscription

    async def _migrate(self) -> None:
        async with self._db.connection() as conn:
            await self._migrate_on(conn)

    async def _schema_version(self) -> int | None:
        async with self._db.connection() as conn:
            return await read_version(conn, self._schema)

    async def _close(self) -> None:
        try:
            await self._listener.stop()
        finally:
            await self._db.close()

    # -- queue listing, schedules, maintenance (docs/operations.md,
    # docs/schedules.md); the SQL is in _sql.operations, _sql.schedules and
    # _sql.maintenance.

    async def _queue_names(self) -> list[str]:
        return await _operations_async.queue_names(self)

    async def _put_worker(self, info: WorkerInfo) -> None:
        await _workers_async.put_worker(self, info)

    async def _delete_worker(self, worker_id: str) -> bool:
        return await _workers_async.delete_worker(self, worker_id)

    async def _list_workers(self, now: datetime) -> list[WorkerInfo]:
        return await _workers_async.list_workers(self, now)

    async def vacuum_report(self) -> VacuumReport:
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
        return await _vacuum_async.vacuum_report(self)

    async def _put_schedule(self, schedule: Schedule) -> Schedule:
        return await _schedules_async.put_schedule(self, schedule)

    async def _delete_schedule(self, name: str) -> bool:
        return await _schedules_async.delete_schedule(self, name)

    async def _list_schedules(self, due_at: datetime | None) -> list[Schedule | UnreadableSchedule]:
        return await _schedules_async.list_schedules(self, due_at)

    async def _fire_schedule(
        self,
        schedule: Schedule,
        boundary: datetime,
        next_run_at: datetime,
        resolved: Resolved,
        payload: EncodedPayload,
    ) -> int | None:
        return await _schedules_async.fire_schedule(
            self,
            schedule,
            boundary=boundary,
            next_run_at=next_run_at,
            resolved=resolved,
            payload=payload,
        )

    async def _skip_schedule(self, schedule: Schedule, next_run_at: datetime) -> bool:
        return await _schedules_async.skip_schedule(self, schedule, next_run_at)

    def _maintenance_turn(self, task: str, interval_s: float) -> AbstractAsyncContextManager[bool]:
        return maintenance_turn(self, task, interval_s)


async def open_async_store(url: str, **engine_options: Any) -> AsyncPostgresStore:
    """Open a PostgreSQL store: ``alkstore.open_async`` opens a
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
        ``listen_url`` (see :class:`AsyncPostgresStore`; behind PgBouncer,
        docs/deployment.md "PgBouncer").

    Returns
    -------
    AsyncPostgresStore
        Open, and migrated unless ``migrate=False``.

    Raises
    ------
    ValidationError
        For a malformed URL or an unknown or bad option (before any I/O).
    SchemaVersionError
        See :class:`AsyncPostgresStore`.
    EngineError
        If the database cannot be reached, or does not answer within
        ``query_timeout_s``.
    """
    check_engine_options(engine_options, ENGINE_OPTIONS)
    conninfo = parse_url(url)
    store = AsyncPostgresStore(conninfo, **engine_options)
    if is_async():
        await store._open(store._migrate_at_open)
    return store
