"""How the PostgreSQL engine's tests find a server.

One environment variable, ``ALKSTORE_TEST_POSTGRES_URL`` (for example
``postgresql://postgres@127.0.0.1:5432/test``), names the server. When it is
unset the tests try, in order:

1. testcontainers, when the package is installed and a Docker engine
   answers (a throwaway ``postgres`` container);
2. a throwaway cluster made with the local ``initdb``/``pg_ctl`` (on
   ``PATH`` or under ``/usr/lib/postgresql/*/bin``), run as the ``postgres``
   or ``nobody`` user when the tests run as root (``initdb`` refuses root);
3. else every PostgreSQL test is skipped, with the reasons.

With ``ALKSTORE_REQUIRE_POSTGRES=1`` (as ``.ci/run`` sets) any such skip is a
failure instead, so a CI run can never pass without the server.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

URL_ENV = "ALKSTORE_TEST_POSTGRES_URL"
REQUIRE_ENV = "ALKSTORE_REQUIRE_POSTGRES"
# Seconds a throwaway server may take to start.
_START_TIMEOUT_S = 60


def skip_or_fail(reason: str) -> None:
    """Skip the test, or fail it when ``ALKSTORE_REQUIRE_POSTGRES=1``."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} (and {REQUIRE_ENV}=1 forbids skipping)", pytrace=False)
    pytest.skip(reason)


def _from_testcontainers(stack: contextlib.ExitStack, reasons: list[str]) -> str | None:
    try:
        from testcontainers.postgres import (  # type: ignore[import-not-found, unused-ignore]
            PostgresContainer,
        )
    except ImportError:
        reasons.append("testcontainers is not installed")
        return None
    try:
        container = PostgresContainer("postgres:16-alpine", driver=None)
        container.start()
    except Exception as error:  # no Docker engine, no image, ...
        reasons.append(f"testcontainers could not start PostgreSQL ({error})")
        return None
    stack.callback(container.stop)
    url: str = container.get_connection_url()
    return url


def _find_pg_bin() -> Path | None:
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: [int(x) for x in Path(p).parent.parent.name.split(".") if x.isdigit()],
    )
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _from_initdb(stack: contextlib.ExitStack, reasons: list[str]) -> str | None:
    bindir = _find_pg_bin()
    if bindir is None:
        reasons.append("no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin")
        return None
    prefix: list[str] = []
    user = None
    if os.geteuid() == 0:
        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                user = pwd.getpwnam(name)
                break
        runuser = shutil.which("runuser")
        if user is None or runuser is None:
            reasons.append("running as root and no 'postgres'/'nobody' user or runuser for initdb")
            return None
        prefix = [runuser, "-u", user.pw_name, "--"]
    base = Path(tempfile.mkdtemp(prefix="alkstore-pg-"))
    stack.callback(shutil.rmtree, base, ignore_errors=True)
    if user is not None:
        os.chown(base, user.pw_uid, user.pw_gid)
    data, port = base / "data", _free_port()

    def run(*args: str) -> None:
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=_START_TIMEOUT_S)

    try:
        run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-sync")  # fmt: skip
        options = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={base} "
        options += "-c fsync=off -c max_connections=200"
        run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "log"), "-w",
            "-t", str(_START_TIMEOUT_S), "-o", options, "start")  # fmt: skip
    except (subprocess.SubprocessError, OSError) as error:
        detail = getattr(error, "stderr", b"") or b""
        reasons.append(f"a local initdb cluster failed to start ({error}: {detail!r})")
        return None
    stack.callback(
        subprocess.run,
        [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
        capture_output=True,
        timeout=_START_TIMEOUT_S,
    )
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yield the URL of a PostgreSQL server (see the module docstring);
    skips (or fails) when there is none; stops a throwaway server after."""
    url = os.environ.get(URL_ENV)
    if url:
        try:
            psycopg.connect(url, connect_timeout=10).close()
        except psycopg.Error as error:
            pytest.fail(f"{URL_ENV}={url!r} is set but not reachable: {error}", pytrace=False)
        yield url
        return
    reasons: list[str] = [f"{URL_ENV} is not set"]
    with contextlib.ExitStack() as stack:
        found = _from_testcontainers(stack, reasons) or _from_initdb(stack, reasons)
        if found is None:
            skip_or_fail("no PostgreSQL server: " + "; ".join(reasons))
        assert found is not None
        yield found


def fresh_schema_name(prefix: str = "t") -> str:
    """A schema name no other test uses."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it; waits at most 30 s for locks."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '30s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
