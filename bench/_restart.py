"""The restart-recovery row of bench_postgres.py: how soon a worker runs jobs
again after the PostgreSQL server accepts connections again.

It needs a server it may restart, so it makes a throwaway cluster of its own
(``initdb``/``pg_ctl`` from ``PATH`` or ``/usr/lib/postgresql/*/bin``, run as
the ``postgres`` user when run as root) on a free port, never the server
named by ``--url``. One ``alkstore worker`` process (concurrency 4) drains a
backlog that outlasts the run; the cluster is restarted under it with
``pg_ctl restart -m fast``, with ``-m immediate`` (a crash: the server
replays its WAL), and stopped for 8 s then started (a long restart: the
pool's reconnection must not have backed off past the bound). Each time the
recovery is the time from the first connection the server accepts (found by
trying every 10 ms) to the start of the first job after it, on the monotonic
clock both processes share. The row gives the worst of them (target: under
5 s).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from _report import Row

import alkstore

__all__ = ["restart_recovery_row"]

#: The target: seconds from the server accepting connections to jobs running.
TARGET_S = 5.0
#: How long the long restart keeps the server stopped, seconds.
LONG_STOP_S = 8.0
_WAIT_S = 60.0

_JOBS = textwrap.dedent(
    """
    import os
    import time

    import alkstore

    app = alkstore.App(os.environ["BENCH_URL"], query_timeout_s=2)
    _STARTS = os.open(os.environ["BENCH_STARTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)


    @app.task(queue="restart", name="work", visibility_timeout_s=10)
    def work():
        # One short append per job: atomic, so lines never interleave.
        os.write(_STARTS, f"{time.monotonic()}\\n".encode())
        time.sleep(0.005)
    """
)


def _pg_bin() -> Path:
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: [int(x) for x in Path(p).parent.parent.name.split(".") if x.isdigit()],
    )
    if not candidates:
        raise RuntimeError("no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin")
    return Path(candidates[-1]).parent


class _Cluster:
    def __init__(self, base: Path) -> None:
        self.bindir = _pg_bin()
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse root
            user = pwd.getpwnam("postgres")
            os.chown(base, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.base, self.data = base, base / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")

    def _run(self, program: str, *args: str) -> None:
        subprocess.run(
            [*self.prefix, str(self.bindir / program), *args],
            check=True,
            capture_output=True,
            timeout=_WAIT_S,
        )

    def ctl(self, action: str, *args: str, wait: bool = True) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} "
        options += f"-c unix_socket_directories={self.base}"
        if action != "stop":
            args = (*args, "-o", options)
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.base / "log"),
                  "-w" if wait else "-W", "-t", str(int(_WAIT_S)), *args, action)  # fmt: skip

    def ready_at(self) -> float:
        """The instant the server first accepts a connection (tried every 10 ms)."""
        deadline = time.monotonic() + _WAIT_S
        while True:
            with contextlib.suppress(psycopg.OperationalError):
                psycopg.connect(self.url, connect_timeout=2).close()
                return time.monotonic()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the throwaway server was not ready after {_WAIT_S} s")
            time.sleep(0.01)


@contextlib.contextmanager
def _cluster() -> Iterator[_Cluster]:
    base = Path(tempfile.mkdtemp(prefix="alkstore-bench-restart-"))
    cluster = None
    try:
        cluster = _Cluster(base)
        cluster.ctl("start")
        yield cluster
    finally:
        if cluster is not None:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                cluster.ctl("stop", "-m", "immediate")
        shutil.rmtree(base, ignore_errors=True)


def _starts(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def _first_start_after(path: Path, instant: float) -> float:
    deadline = time.monotonic() + _WAIT_S
    while True:
        later = [at for at in _starts(path) if at > instant]
        if later:
            return min(later)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker ran nothing within {_WAIT_S} s of the restart")
        time.sleep(0.01)


def restart_recovery_row(quick: bool = False) -> Row:
    """Measure the recovery after each kind of restart (once each with
    ``quick``, else three times) and return the row: the worst recovery in
    seconds as alkstore's figure, with the median in the scenario's name.

    Raises
    ------
    RuntimeError
        If no throwaway cluster can be made, or the worker never runs again.
    """
    repeat = 1 if quick else 3
    kinds = ["fast", "immediate", f"{LONG_STOP_S:g} s stop"]
    recoveries: list[float] = []
    with _cluster() as cluster, tempfile.TemporaryDirectory() as project:
        folder = Path(project)
        (folder / "jobs.py").write_text(_JOBS)
        starts = folder / "starts"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
        env.update(BENCH_URL=cluster.url, BENCH_STARTS=str(starts))
        with alkstore.open(cluster.url) as store:
            # More than the run can drain (at most about 700 jobs a second).
            store.queue("restart").enqueue_many([{"task": "work"}] * 100_000)
        worker = subprocess.Popen(
            [sys.executable, "-m", "alkstore", "worker", "jobs:app", "-c", "4"],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            ready = time.monotonic()
            for kind in kinds * repeat:
                _first_start_after(starts, ready)  # working before each restart
                if kind in ("fast", "immediate"):
                    cluster.ctl("restart", "-m", kind, wait=False)
                else:
                    cluster.ctl("stop", "-m", "fast")
                    time.sleep(LONG_STOP_S)  # the outage itself, not a wait for anything
                    cluster.ctl("start", wait=False)
                ready = cluster.ready_at()
                recoveries.append(_first_start_after(starts, ready) - ready)
        finally:
            worker.terminate()
            try:
                worker.wait(_WAIT_S)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    worst = max(recoveries)
    return Row(
        f"restart recovery time after the server accepts connections (worst of "
        f"{len(recoveries)}: {', '.join(kinds)}; median {statistics.median(recoveries):.2f} s)",
        "s",
        {"alkstore": worst},
        f"< {TARGET_S:g} s",
        "ok" if worst < TARGET_S else "MISS",
    )


if __name__ == "__main__":  # python bench/_restart.py [--quick]
    print(restart_recovery_row(quick="--quick" in sys.argv))
