"""PgBouncer instances of the tests' own, in front of a PostgreSQL server.

:func:`pgbouncer` starts the local ``pgbouncer`` (Debian's package) on a free
port of 127.0.0.1 with its stock settings except what points it at the
server and lets the tests in: the ``[databases]`` entry (every database
name, forwarded to the same name on the server), ``auth_type = trust`` with
an ``auth_file`` naming the server URL's user, ``pool_mode``, and the
listen address, log file and pid file in a temporary folder. When the tests
run as root it runs as ``postgres`` (or ``nobody``), through PgBouncer's
own ``-u`` (it refuses to run as root). It is stopped, and the folder
removed, on leaving the ``with`` block.

Used by the engine's tests (``conftest.py``'s ``bouncer`` fixtures) and by
``bench/bench_postgres.py``. Without a ``pgbouncer`` binary,
:class:`BouncerUnavailable` says so (the fixtures skip, or fail under
``ALKSTORE_REQUIRE_POSTGRES=1``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from psycopg.conninfo import conninfo_to_dict

__all__ = ["Bouncer", "BouncerUnavailable", "find_pgbouncer", "pgbouncer"]

# Seconds PgBouncer may take to start listening, and to stop.
_START_TIMEOUT_S = 15.0
_STOP_TIMEOUT_S = 10.0
_RUN_AS = ("postgres", "nobody")


class BouncerUnavailable(Exception):
    """No PgBouncer can be started here (the reason is the message)."""


def find_pgbouncer() -> str | None:
    """The ``pgbouncer`` program: on ``PATH``, else Debian's
    ``/usr/sbin/pgbouncer`` (``/usr/sbin`` is not on every user's PATH)."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Bouncer:
    """A running PgBouncer (see :func:`pgbouncer`)."""

    def __init__(self, server_url: str, port: int, pool_mode: str, folder: Path) -> None:
        self.server_url = server_url
        self.port = port
        self.pool_mode = pool_mode
        self.folder = folder

    def url(self) -> str:
        """The server URL's user, password and database, through PgBouncer."""
        given = conninfo_to_dict(self.server_url)
        user = quote(str(given.get("user", "postgres")), safe="")
        password = given.get("password")
        auth = f"{user}:{quote(str(password), safe='')}" if password else user
        database = quote(str(given.get("dbname", given.get("user", "postgres"))), safe="")
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def log_text(self) -> str:
        """PgBouncer's log so far."""
        with contextlib.suppress(OSError):
            return (self.folder / "pgbouncer.log").read_text(errors="replace")
        return ""


def _ini(server_url: str, port: int, pool_mode: str, folder: Path, settings: dict[str, str]) -> str:
    given = conninfo_to_dict(server_url)
    target = f"host={given.get('host', '127.0.0.1')} port={given.get('port', 5432)}"
    if given.get("password"):
        target += f" password={given['password']}"
    lines = [
        "[databases]",
        f"* = {target}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {folder / 'users.txt'}",
        f"pool_mode = {pool_mode}",
        f"logfile = {folder / 'pgbouncer.log'}",
        f"pidfile = {folder / 'pgbouncer.pid'}",
    ]
    lines += [f"{name} = {value}" for name, value in settings.items()]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def pgbouncer(
    server_url: str, pool_mode: str, settings: dict[str, str] | None = None
) -> Iterator[Bouncer]:
    """Run a PgBouncer in ``pool_mode`` (``"transaction"`` or ``"session"``)
    in front of the server at ``server_url`` for the ``with`` block.

    ``settings`` are further ``[pgbouncer]`` settings (``default_pool_size``
    for a test that counts server connections); the others are stock.

    Raises
    ------
    BouncerUnavailable
        Without a ``pgbouncer`` program, or when it does not start listening
        within 15 s (its log is in the message).
    """
    program = find_pgbouncer()
    if program is None:
        raise BouncerUnavailable("no pgbouncer program (apt-get install pgbouncer)")
    user = str(conninfo_to_dict(server_url).get("user", "postgres"))
    port = _free_port()
    with (
        tempfile.TemporaryDirectory(prefix="alkstore-pgbouncer-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        folder = Path(tmp)
        (folder / "users.txt").write_text(f'"{user}" ""\n')
        (folder / "pgbouncer.ini").write_text(
            _ini(server_url, port, pool_mode, folder, settings or {})
        )
        command = [program]
        if os.geteuid() == 0:
            # PgBouncer refuses to run as root; -u switches user after
            # reading its configuration, so the folder must be the user's.
            for name in _RUN_AS:
                with contextlib.suppress(KeyError):
                    account = pwd.getpwnam(name)
                    break
            else:
                raise BouncerUnavailable("running as root and no 'postgres'/'nobody' user")
            for path in (folder, *folder.iterdir()):
                os.chown(path, account.pw_uid, account.pw_gid)
            command += ["-u", account.pw_name]
        command.append(str(folder / "pgbouncer.ini"))
        # Not a pipe: PgBouncer logs to stderr too, and would block once a
        # pipe nobody reads is full.
        stderr = stack.enter_context((folder / "stderr.txt").open("wb"))
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
        )
        bouncer = Bouncer(server_url, port, pool_mode, folder)
        try:
            deadline = time.monotonic() + _START_TIMEOUT_S
            while True:
                if process.poll() is not None:
                    said = (folder / "stderr.txt").read_text(errors="replace")
                    raise BouncerUnavailable(f"pgbouncer exited ({process.returncode}): {said}")
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=1),
                ):
                    break
                if time.monotonic() > deadline:
                    raise BouncerUnavailable(f"pgbouncer did not listen: {bouncer.log_text()}")
                time.sleep(0.02)
            yield bouncer
        finally:
            # SIGTERM: immediate shutdown (its client connections are cut).
            process.terminate()
            try:
                process.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(_STOP_TIMEOUT_S)
