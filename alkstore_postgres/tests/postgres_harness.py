"""The PostgreSQL engine's side of the shared contract suite.

``test_postgres_contract.py`` plugs it in as
``class TestPostgresContract(ContractSuite, PostgresHarness): pass``, and
again through PgBouncer in transaction mode (:class:`BouncerHarness`). Every
test gets a fresh store schema in the server named by the ``postgres_url``
fixture (``conftest.py``), dropped afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from postgres_bouncer import Bouncer
from postgres_server import drop_schema, fresh_schema_name
from psycopg import sql

from alkstore.engine import SCHEDULE_COLUMNS
from alkstore_contract_tests.harness import JOB_INSERT_FAULT, EngineHarness, StoreTarget

__all__ = ["BouncerHarness", "PostgresHarness"]

_FAULT_FUNCTION = "alkstore_test_dead_insert_fails"
_JOB_FAULT_FUNCTION = "alkstore_test_job_insert_fails"
_WRITE_FAULT_FUNCTION = "alkstore_test_job_write_fails"


class PostgresHarness(EngineHarness):
    """A fresh schema per test (``schema=`` engine option)."""

    stores_survive_fork = True

    @pytest.fixture
    def alkstore_target(self, postgres_url: str) -> Iterator[StoreTarget]:
        """The test server's URL and a schema no other test uses."""
        schema = fresh_schema_name("contract")
        yield StoreTarget(postgres_url, {"schema": schema})
        drop_schema(postgres_url, schema)

    @contextlib.contextmanager
    def app_connection(
        self, target: StoreTarget
    ) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
        """An autocommit psycopg connection (the suite's :meth:`begin` sends
        ``BEGIN``) whose ``search_path`` is a fresh application schema, so
        the application's ``CREATE TABLE orders`` never collides between
        tests; the schema is dropped afterwards."""
        app_schema = fresh_schema_name("app")
        with psycopg.connect(target.url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(app_schema)))
        try:
            with psycopg.connect(target.url, autocommit=True) as conn:
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(app_schema)))
                yield conn
        finally:
            drop_schema(target.url, app_schema)

    @contextlib.asynccontextmanager
    async def async_app_connection(
        self, target: StoreTarget
    ) -> AsyncIterator[psycopg.AsyncConnection[tuple[object, ...]]]:
        """As :meth:`app_connection`, a ``psycopg.AsyncConnection``: what the
        native async store's ``enqueue_tx`` takes."""
        app_schema = fresh_schema_name("app")
        async with await psycopg.AsyncConnection.connect(target.url, autocommit=True) as admin:
            await admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(app_schema)))
        try:
            async with await psycopg.AsyncConnection.connect(target.url, autocommit=True) as conn:
                await conn.execute(
                    sql.SQL("SET search_path TO {}").format(sql.Identifier(app_schema))
                )
                yield conn
        finally:
            async with await psycopg.AsyncConnection.connect(target.url, autocommit=True) as admin:
                await admin.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(app_schema))
                )

    @contextlib.contextmanager
    def dead_letter_inserts_fail(self, target: StoreTarget) -> Iterator[None]:
        """A trigger makes every insert into the store's ``dead`` table raise."""
        schema = target.options["schema"]
        function = sql.Identifier(schema, _FAULT_FUNCTION)
        dead = sql.Identifier(schema, "dead")
        trigger = sql.Identifier(_FAULT_FUNCTION)
        with psycopg.connect(target.url, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'injected dead-letter failure'; END $$"
                ).format(function)
            )
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()"
                ).format(trigger, dead, function)
            )
            try:
                yield
            finally:
                conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(trigger, dead))
                conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(function))

    @contextlib.contextmanager
    def job_inserts_fail(self, target: StoreTarget, queue: str) -> Iterator[None]:
        """A trigger makes every insert into the store's ``jobs`` table for
        ``queue`` raise."""
        schema = target.options["schema"]
        function = sql.Identifier(schema, _JOB_FAULT_FUNCTION)
        jobs = sql.Identifier(schema, "jobs")
        trigger = sql.Identifier(_JOB_FAULT_FUNCTION)
        with psycopg.connect(target.url, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION {}; END $$"
                ).format(function, sql.Literal(JOB_INSERT_FAULT))
            )
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER {} BEFORE INSERT ON {} FOR EACH ROW "
                    "WHEN (NEW.queue = {}) EXECUTE FUNCTION {}()"
                ).format(trigger, jobs, sql.Literal(queue), function)
            )
            try:
                yield
            finally:
                conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(trigger, jobs))
                conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(function))

    def overwrite_schedule_column(
        self, target: StoreTarget, name: str, column: str, value: str | bytes
    ) -> None:
        """One ``UPDATE`` of the store's ``schedules`` table, whose columns are
        ``SCHEDULE_COLUMNS``."""
        assert column in SCHEDULE_COLUMNS, column
        schedules = sql.Identifier(target.options["schema"], "schedules")
        with psycopg.connect(target.url, autocommit=True) as conn:
            updated = conn.execute(
                sql.SQL("UPDATE {} SET {} = %s WHERE name = %s").format(
                    schedules, sql.Identifier(column)
                ),
                (value, name),
            ).rowcount
        assert updated == 1, f"no stored schedule {name!r}"

    @contextlib.contextmanager
    def job_writes_fail(self, target: StoreTarget) -> Iterator[None]:
        """A trigger makes every update and delete of the store's ``jobs``
        table raise ``lock_not_available`` (55P03), an error that passes."""
        schema = target.options["schema"]
        function = sql.Identifier(schema, _WRITE_FAULT_FUNCTION)
        jobs = sql.Identifier(schema, "jobs")
        trigger = sql.Identifier(_WRITE_FAULT_FUNCTION)
        with psycopg.connect(target.url, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'injected job-write failure' "
                    "USING ERRCODE = 'lock_not_available'; END $$"
                ).format(function)
            )
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER {} BEFORE UPDATE OR DELETE ON {} "
                    "FOR EACH ROW EXECUTE FUNCTION {}()"
                ).format(trigger, jobs, function)
            )
            try:
                yield
            finally:
                conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(trigger, jobs))
                conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(function))


class BouncerHarness(PostgresHarness):
    """The engine through a PgBouncer in ``pool_mode = transaction``
    (``bouncer_transaction``, ``conftest.py``): the store's URL is
    PgBouncer's, with ``pooler="transaction"`` and the LISTEN connection on
    the server itself (``listen_url``), as docs/deployment.md "PgBouncer"
    recommends. The suite's application connection (``enqueue_tx``) and
    its fault triggers reach the server directly: the application's
    ``SET search_path`` would not stay with a transaction pooler's client,
    and ``enqueue_tx`` runs on the caller's connection, not the engine's."""

    @pytest.fixture
    def alkstore_target(
        self, postgres_url: str, bouncer_transaction: Bouncer
    ) -> Iterator[StoreTarget]:
        """PgBouncer's URL and a schema no other test uses."""
        schema = fresh_schema_name("bouncer")
        options = {"schema": schema, "pooler": "transaction", "listen_url": postgres_url}
        self._server_url = postgres_url
        yield StoreTarget(bouncer_transaction.url(), options)
        drop_schema(postgres_url, schema)

    def _direct(self, target: StoreTarget) -> StoreTarget:
        return StoreTarget(self._server_url, target.options)

    @contextlib.contextmanager
    def app_connection(
        self, target: StoreTarget
    ) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
        """As :meth:`PostgresHarness.app_connection`, on the server."""
        with super().app_connection(self._direct(target)) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def async_app_connection(
        self, target: StoreTarget
    ) -> AsyncIterator[psycopg.AsyncConnection[tuple[object, ...]]]:
        """As :meth:`PostgresHarness.async_app_connection`, on the server."""
        async with super().async_app_connection(self._direct(target)) as conn:
            yield conn

    def dead_letter_inserts_fail(
        self, target: StoreTarget
    ) -> contextlib.AbstractContextManager[None]:
        """As :meth:`PostgresHarness.dead_letter_inserts_fail`, on the server."""
        return super().dead_letter_inserts_fail(self._direct(target))

    def job_inserts_fail(
        self, target: StoreTarget, queue: str
    ) -> contextlib.AbstractContextManager[None]:
        """As :meth:`PostgresHarness.job_inserts_fail`, on the server."""
        return super().job_inserts_fail(self._direct(target), queue)

    def job_writes_fail(self, target: StoreTarget) -> contextlib.AbstractContextManager[None]:
        """As :meth:`PostgresHarness.job_writes_fail`, on the server."""
        return super().job_writes_fail(self._direct(target))

    def overwrite_schedule_column(
        self, target: StoreTarget, name: str, column: str, value: str | bytes
    ) -> None:
        """As :meth:`PostgresHarness.overwrite_schedule_column`, on the server."""
        super().overwrite_schedule_column(self._direct(target), name, column, value)
