"""Fixtures of the PostgreSQL engine's own tests; the server comes from
:func:`postgres_server.postgres_server` (``ALKSTORE_TEST_POSTGRES_URL``,
else testcontainers, else a local ``initdb`` cluster, else skip; with
``ALKSTORE_REQUIRE_POSTGRES=1`` a skip is a failure)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from postgres_bouncer import Bouncer, BouncerUnavailable, pgbouncer
from postgres_proxy import StallingProxy
from postgres_server import drop_schema, fresh_schema_name, postgres_server, skip_or_fail
from psycopg import sql

from alkstore_contract_tests import ManualClock
from alkstore_postgres import PostgresStore, open_store


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a PostgreSQL server for the whole session."""
    with postgres_server() as url:
        yield url


def _bouncer(postgres_url: str, pool_mode: str) -> Iterator[Bouncer]:
    with contextlib.ExitStack() as stack:
        try:
            bouncer = stack.enter_context(pgbouncer(postgres_url, pool_mode))
        except BouncerUnavailable as error:
            skip_or_fail(f"PgBouncer: {error}")
        yield bouncer


@pytest.fixture(scope="session")
def bouncer_transaction(postgres_url: str) -> Iterator[Bouncer]:
    """A PgBouncer of the session's own in ``pool_mode = transaction``, stock
    settings otherwise, in front of the test server (``postgres_bouncer``);
    without ``pgbouncer`` the test skips, or fails under
    ``ALKSTORE_REQUIRE_POSTGRES=1``."""
    yield from _bouncer(postgres_url, "transaction")


@pytest.fixture(scope="session")
def bouncer_session(postgres_url: str) -> Iterator[Bouncer]:
    """As ``bouncer_transaction``, in ``pool_mode = session``."""
    yield from _bouncer(postgres_url, "session")


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    """A fresh store schema name; the schema is dropped after the test."""
    name = fresh_schema_name()
    yield name
    drop_schema(postgres_url, name)


@pytest.fixture
def clock() -> ManualClock:
    """A manual clock at the regression cases' T0 (2030-01-01T00:00:00Z)."""
    return ManualClock()


@pytest.fixture
def admin(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain autocommit connection for inspecting the database."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def open_pg(
    postgres_url: str, schema: str, clock: ManualClock
) -> Iterator[Callable[..., PostgresStore]]:
    """Open stores on the test's schema with the test's clock (``clock=None``
    for the server's); all closed at teardown."""
    stores: list[PostgresStore] = []

    def opener(url: str | None = None, **options: Any) -> PostgresStore:
        options.setdefault("clock", clock)
        options.setdefault("schema", schema)
        store = open_store(url or postgres_url, **options)
        stores.append(store)
        return store

    yield opener
    for store in stores:
        store.close()


@pytest.fixture
def other_database_url(postgres_url: str, admin: psycopg.Connection[Any]) -> Iterator[str]:
    """The URL of a new database on the same server, dropped afterwards
    (whatever database the server's URL names: a throwaway cluster's is
    ``postgres``)."""
    name = fresh_schema_name("db")
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield urlsplit(postgres_url)._replace(path=f"/{name}").geturl()
    admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def store(open_pg: Callable[..., PostgresStore]) -> PostgresStore:
    """A store on a fresh schema with the test's manual clock."""
    return open_pg()


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[StallingProxy]:
    """A proxy in front of the test server that can stop forwarding on its
    open connections without closing them (``postgres_proxy``)."""
    with StallingProxy(postgres_url) as running:
        yield running


@pytest.fixture
def direct(open_pg: Callable[..., PostgresStore]) -> PostgresStore:
    """A store on the test's schema straight to the server (it migrates
    the schema, so the proxied stores only read its version)."""
    return open_pg(clock=None)
