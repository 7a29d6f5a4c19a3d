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

A test that restarts, crashes, stops or promotes a server makes its own
:class:`Cluster` (:func:`throwaway_cluster`), whatever the variable says, and
never touches the shared one; without ``initdb``/``pg_ctl``/``pg_basebackup``
it is skipped, or fails under ``ALKSTORE_REQUIRE_POSTGRES=1``.
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
import time
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


def find_pg_bin() -> Path | None:
    """The folder of the server's programs (``initdb``, ``pg_ctl``,
    ``pg_basebackup``): that of ``initdb`` on ``PATH``, links followed (a
    link in ``/usr/local/bin`` leads to the real folder, which has them
    all), else the newest ``/usr/lib/postgresql/*/bin`` (Debian's layout)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
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


class ClusterUnavailable(Exception):
    """No throwaway cluster can be made here (the reason is the message)."""


def _run_as() -> tuple[list[str], pwd.struct_passwd | None]:
    # initdb and postgres refuse to run as root: run them as 'postgres' (or
    # 'nobody') through runuser.
    if os.geteuid() != 0:
        return [], None
    user = None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam(name)
            break
    runuser = shutil.which("runuser")
    if user is None or runuser is None:
        raise ClusterUnavailable(
            "running as root and no 'postgres'/'nobody' user or runuser for initdb"
        )
    return [runuser, "-u", user.pw_name, "--"], user


class Cluster:
    """A throwaway PostgreSQL cluster of the test's own, in a temporary
    folder, listening on 127.0.0.1 at a free port: made with ``initdb``
    (:meth:`create`) or as a hot standby of another with ``pg_basebackup
    -R`` (:meth:`standby`), run with ``pg_ctl``. Never the shared server,
    so a test may restart, crash, stop or promote it.

    :meth:`start`, :meth:`restart` and :meth:`promote` return the instant
    the server first accepted a connection (or, promoted, a write), found
    by trying every 10 ms; every wait is bounded by :data:`_START_TIMEOUT_S`.
    At the end of the ``ExitStack`` given to the constructor the server is
    stopped (``-m immediate``) and the folder removed.

    ``settings`` are server settings (``-c name=value``) added to the
    defaults: ``fsync=off`` (only an operating-system crash needs it; a
    server crash, ``pg_ctl stop -m immediate``, still replays every
    committed transaction from the WAL in the page cache) and
    ``max_connections=200``.
    """

    def __init__(
        self, stack: contextlib.ExitStack, *, settings: dict[str, str] | None = None
    ) -> None:
        bindir = find_pg_bin()
        if bindir is None:
            raise ClusterUnavailable("no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin")
        self.bindir = bindir
        self._prefix, user = _run_as()
        self.base = Path(tempfile.mkdtemp(prefix="alkstore-pg-"))
        stack.callback(shutil.rmtree, self.base, ignore_errors=True)
        if user is not None:
            os.chown(self.base, user.pw_uid, user.pw_gid)
        self.data = self.base / "data"
        self.log = self.base / "log"
        self.port = _free_port()
        self.settings = {"fsync": "off", "max_connections": "200", **(settings or {})}
        stack.callback(self._stop_quietly)

    @classmethod
    def create(
        cls, stack: contextlib.ExitStack, *, settings: dict[str, str] | None = None
    ) -> Cluster:
        """A new cluster (``initdb``, trust authentication, user
        ``postgres``), started.

        Raises
        ------
        ClusterUnavailable
            If no cluster can be made on this machine.
        subprocess.SubprocessError
            If ``initdb`` or ``pg_ctl start`` fails.
        """
        cluster = cls(stack, settings=settings)
        cluster.run("initdb", "-D", str(cluster.data), "-U", "postgres", "-A", "trust",
                    "-E", "UTF8", "--no-sync")  # fmt: skip
        cluster.start()
        return cluster

    def standby(
        self, stack: contextlib.ExitStack, *, settings: dict[str, str] | None = None
    ) -> Cluster:
        """A hot standby of this (running) cluster: ``pg_basebackup -R``
        (streaming replication, ``standby.signal``, ``primary_conninfo``
        naming this cluster, ``application_name`` ``standby``), started;
        it replays this cluster's WAL until :meth:`promote`."""
        if not (self.bindir / "pg_basebackup").exists():
            raise ClusterUnavailable(f"no pg_basebackup in {self.bindir}")
        standby = type(self)(stack, settings=settings)
        conninfo = f"host=127.0.0.1 port={self.port} user=postgres application_name=standby"
        standby.run("pg_basebackup", "-D", str(standby.data), "-d", conninfo, "-R",
                    "-X", "stream", "-c", "fast", "--no-sync")  # fmt: skip
        standby.start()
        return standby

    def url(self, database: str = "postgres") -> str:
        """``postgresql://postgres@127.0.0.1:PORT/DATABASE``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def run(self, program: str, *args: str) -> str:
        """Run one of the server's programs as the cluster's user; its output.

        Raises
        ------
        subprocess.CalledProcessError
            With its stderr, if it fails.
        """
        done = subprocess.run(
            [*self._prefix, str(self.bindir / program), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=_START_TIMEOUT_S,
        )
        return done.stdout

    def _options(self) -> str:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} "
        options += f"-c unix_socket_directories={self.base}"
        return " ".join([options, *(f"-c {k}={v}" for k, v in self.settings.items())])

    def _ctl(self, action: str, *args: str, wait: bool = True) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log),
                 "-w" if wait else "-W", "-t", str(_START_TIMEOUT_S), *args, action)  # fmt: skip

    def _ready_at(self, query: str = "SELECT true") -> float:
        # pg_ctl -w looks every 0.1 s: the instant is taken here instead, by
        # connecting every 10 ms until a connection answers ``query`` with
        # true (at most _START_TIMEOUT_S).
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                with psycopg.connect(self.url(), autocommit=True, connect_timeout=2) as conn:
                    while True:
                        row = conn.execute(query).fetchone()  # type: ignore[arg-type]
                        if row is not None and row[0] is True:
                            return time.monotonic()
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.01)
            except psycopg.OperationalError:
                pass  # not up yet, or still starting up
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the server was not ready after {_START_TIMEOUT_S} s:\n{self.log_text()}"
                )
            time.sleep(0.01)

    def start(self) -> float:
        """Start the server; return (monotonic seconds) when it first
        accepted a connection, found within 10 ms."""
        self._ctl("start", "-o", self._options(), wait=False)
        return self._ready_at()

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m MODE``: ``smart``, ``fast``, or
        ``immediate``, a crash: the next start replays the WAL); return once
        it is down."""
        self._ctl("stop", "-m", mode)

    def restart(self, mode: str = "fast") -> float:
        """``pg_ctl restart -m MODE``; return when the server first
        accepted a connection again (monotonic seconds, found within
        10 ms)."""
        self._ctl("restart", "-m", mode, "-o", self._options(), wait=False)
        return self._ready_at()

    def promote(self) -> float:
        """Promote a standby (``pg_ctl promote``); return when it first
        answered as a primary (``pg_is_in_recovery()`` false; monotonic
        seconds, found within 10 ms)."""
        self._ctl("promote", wait=False)
        return self._ready_at("SELECT NOT pg_is_in_recovery()")

    def _stop_quietly(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            if (self.data / "postmaster.pid").exists():
                self.stop("immediate")

    def log_text(self) -> str:
        """The server's log so far (for failure messages)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError as error:
            return f"(no log: {error})"


def throwaway_cluster(
    stack: contextlib.ExitStack, *, settings: dict[str, str] | None = None
) -> Cluster:
    """A started :class:`Cluster` of the test's own; skips the test, or fails
    it under ``ALKSTORE_REQUIRE_POSTGRES=1``, when none can be made here."""
    try:
        return Cluster.create(stack, settings=settings)
    except ClusterUnavailable as error:
        skip_or_fail(f"no throwaway PostgreSQL cluster: {error}")
        raise  # not reached: skip_or_fail raises
    except subprocess.CalledProcessError as error:
        pytest.fail(f"a throwaway cluster failed to start ({error}): {error.stderr}", pytrace=False)


def throwaway_standby(
    primary: Cluster, stack: contextlib.ExitStack, *, settings: dict[str, str] | None = None
) -> Cluster:
    """:meth:`Cluster.standby`, skipping the test (or failing it under
    ``ALKSTORE_REQUIRE_POSTGRES=1``) when no standby can be made here."""
    try:
        return primary.standby(stack, settings=settings)
    except ClusterUnavailable as error:
        skip_or_fail(f"no throwaway standby: {error}")
        raise  # not reached: skip_or_fail raises
    except subprocess.CalledProcessError as error:
        pytest.fail(f"a throwaway standby failed to start ({error}): {error.stderr}", pytrace=False)


def _from_initdb(stack: contextlib.ExitStack, reasons: list[str]) -> str | None:
    try:
        return Cluster.create(stack).url()
    except ClusterUnavailable as error:
        reasons.append(str(error))
    except (subprocess.SubprocessError, OSError) as error:
        detail = getattr(error, "stderr", b"") or b""
        reasons.append(f"a local initdb cluster failed to start ({error}: {detail!r})")
    return None


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
