"""Fixtures of the Django Tasks backend's tests (alkstore.contrib.django).

A real Django project lives beside this file: ``djsite`` (settings, read from
the environment) and ``djshop`` (a model and tasks), with ``manage.py``.
Django is set up once, in this process, by the session fixture
``django_project``, which only the tests of this folder use: the rest of the
suite never sees Django configured, nor the environment it sets.

SQLite: a temporary file is Django's ``default`` database and the store of
the ``default`` task backend. PostgreSQL: with ``ALKSTORE_TEST_POSTGRES_URL``
(a server URL), a throwaway database is created on that server, used as
Django's ``pg`` database and the ``pg`` backend's store, and dropped at the
end; without it the PostgreSQL tests skip, or fail under
``ALKSTORE_REQUIRE_POSTGRES=1``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from djhelpers import URL_ENV, Engine, on_database, skip_or_fail


@pytest.fixture(scope="session")
def django_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Django set up on the test project; the environment its worker
    processes need (the settings module, the databases)."""
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    env = {
        "DJANGO_SETTINGS_MODULE": "djsite.settings",
        "ALKSTORE_DJANGO_SQLITE": str(tmp_path_factory.mktemp("django") / "site.db"),
    }
    server = os.environ.get(URL_ENV)
    database = f"alkstore_django_{os.getpid()}_{secrets.token_hex(4)}"
    if server:
        import psycopg
        from psycopg import sql

        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        env["ALKSTORE_DJANGO_POSTGRES"] = on_database(server, database)
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            django.setup()
            # Creates djshop's table, and (post_migrate) each store's schema.
            call_command("migrate", run_syncdb=True, verbosity=0)
            if server:
                call_command("migrate", database="pg", run_syncdb=True, verbosity=0)
            try:
                yield env
            finally:
                from alkstore.contrib.django import backend_app

                connections.close_all()
                for alias in settings.TASKS:
                    backend_app(alias).close()
    finally:
        if server:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(database)
                    )
                )


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def engine(request: pytest.FixtureRequest, django_project: dict[str, str]) -> Engine:
    """Each engine: SQLite (Django's ``default`` database) and PostgreSQL."""
    if request.param == "postgres":
        if "ALKSTORE_DJANGO_POSTGRES" not in django_project:
            skip_or_fail(f"PostgreSQL: set {URL_ENV} to a server's URL")
        return Engine("postgres", "pg", "pg")
    return Engine("sqlite", "default", "default")
