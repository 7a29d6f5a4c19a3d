"""Real ``alkstore worker`` and ``alkstore scheduler`` processes for the
restart and failover tests, and the record of every execution of their
tasks across processes.

:func:`write_app` writes a project folder with ``jobs.py``: an App on the
URL and schema given, with two tasks on the queue :data:`QUEUE`:

``work(i)``
    works for :data:`WORK_S` seconds, then records the execution;
``hold(i)``
    records that it started, waits until :func:`release` was called (at
    most :data:`HOLD_S` seconds), then records the execution.

Each record is a file of its own under the runs folder (an execution is
``I PID STARTED FINISHED``, the instants on the monotonic clock, which every
process of the machine shares), written whole and renamed into place, so the
parent reads every finished execution and never half of one, whichever
process ran it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HOLD_S",
    "QUEUE",
    "WORK_S",
    "AppProcess",
    "Run",
    "counts_of",
    "not_recorded",
    "release",
    "runs_of",
    "started_of",
    "write_app",
]

#: The task's queue.
QUEUE = "drain"
#: Seconds each execution works (so that jobs are running, finishing and
#: being acked when the server goes away).
WORK_S = 0.05

_JOBS = textwrap.dedent(
    """
    import os
    import tempfile
    import time

    import alkstore

    app = alkstore.App(
        os.environ["RESTART_URL"],
        schema=os.environ["RESTART_SCHEMA"],
        query_timeout_s=float(os.environ["RESTART_QUERY_TIMEOUT_S"]),
    )
    RUNS = os.environ["RESTART_RUNS"]
    RELEASE = os.environ["RESTART_RELEASE"]
    VISIBILITY_TIMEOUT_S = float(os.environ["RESTART_VISIBILITY_TIMEOUT_S"])


    def write(kind, i, text):
        # Whole, then renamed into place: a reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=RUNS, prefix=".tmp-")
        with os.fdopen(fd, "w") as file:
            file.write(text)
        name = f"{{kind}}-{{i}}-{{os.getpid()}}-{{time.monotonic_ns()}}"
        os.replace(tmp, os.path.join(RUNS, name))


    @app.task(queue={queue!r}, name="work", visibility_timeout_s=VISIBILITY_TIMEOUT_S)
    def work(i):
        started = time.monotonic()
        time.sleep({work_s!r})  # the job's own work
        write("run", i, f"{{i}} {{os.getpid()}} {{started}} {{time.monotonic()}}\\n")


    @app.task(queue={queue!r}, name="hold", visibility_timeout_s=VISIBILITY_TIMEOUT_S)
    def hold(i):
        started = time.monotonic()
        write("started", i, "")
        while not os.path.exists(RELEASE):
            if time.monotonic() > started + {hold_s!r}:
                raise TimeoutError(f"{{RELEASE}} did not appear")
            time.sleep(0.02)
        write("run", i, f"{{i}} {{os.getpid()}} {{started}} {{time.monotonic()}}\\n")
    """
)
#: How long a ``hold`` job waits for :func:`release` at most, seconds.
HOLD_S = 60.0


def write_app(
    project: Path,
    *,
    url: str,
    schema: str,
    query_timeout_s: float,
    visibility_timeout_s: float,
) -> dict[str, str]:
    """Write ``project/jobs.py`` and make ``project/runs``; return the
    environment the app reads (for :class:`AppProcess`)."""
    (project / "jobs.py").write_text(_JOBS.format(queue=QUEUE, work_s=WORK_S, hold_s=HOLD_S))
    runs = project / "runs"
    runs.mkdir()
    return {
        "RESTART_URL": url,
        "RESTART_SCHEMA": schema,
        "RESTART_RUNS": str(runs),
        "RESTART_RELEASE": str(project / "release"),
        "RESTART_QUERY_TIMEOUT_S": str(query_timeout_s),
        "RESTART_VISIBILITY_TIMEOUT_S": str(visibility_timeout_s),
    }


@dataclass(frozen=True)
class Run:
    """One finished execution of ``work(i)``."""

    i: int
    pid: int
    started: float
    finished: float


def runs_of(project: Path) -> list[Run]:
    """Every finished execution so far, in the order they started."""
    runs = []
    for path in (project / "runs").glob("run-*"):
        i, pid, started, finished = path.read_text().split()
        runs.append(Run(int(i), int(pid), float(started), float(finished)))
    return sorted(runs, key=lambda run: run.started)


def started_of(project: Path) -> Counter[int]:
    """How many times each ``hold(i)`` started."""
    return Counter(int(path.name.split("-")[1]) for path in (project / "runs").glob("started-*"))


def release(project: Path) -> None:
    """Let every ``hold`` job, running or future, finish."""
    (project / "release").touch()


def counts_of(project: Path) -> Counter[int]:
    """How many times each ``i`` ran."""
    return Counter(run.i for run in runs_of(project))


def not_recorded(log: str) -> set[int]:
    """The ids of the jobs whose outcome a worker's ``log`` says it could not
    record as its own: ``lost`` (the claim was no longer the worker's: it
    lapsed and may have been reclaimed), or ``unknown`` (an ``ack_batch``
    acked only some of its jobs and this one is gone; it is what a worker
    logs when one batch holds two runs of one job, the first one's claim
    having lapsed and the second one's being this worker's again)."""
    found = re.findall(rf"job (\d+) of '{QUEUE}' \(\w+\) (?:lost|unknown): attempt", log)
    return {int(job_id) for job_id in found}


class AppProcess:
    """``python -m alkstore ARGS...`` in ``project`` with ``env``; its stderr
    (the log) collected by a thread, so the pipe never fills."""

    def __init__(self, project: Path, env: dict[str, str], *args: str) -> None:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
        environ.update(env)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "alkstore", *args],
            cwd=project,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()

    @property
    def log(self) -> str:
        """Its stderr so far."""
        with self._cond:
            return "".join(self._lines)

    def wait_for_lines(self, text: str, count: int, timeout_s: float) -> None:
        """Wait until ``count`` lines of its log hold ``text``; fail after
        ``timeout_s`` seconds, or if it exited first."""

        def seen() -> int:
            return sum(text in line for line in self._lines)

        with self._cond:
            self._cond.wait_for(
                lambda: seen() >= count or self.process.poll() is not None, timeout_s
            )
            found = seen()
        assert found >= count, (
            f"{found} of {count} lines with {text!r} in the log of {self.process.args}:\n{self.log}"
        )

    def stop(self, timeout_s: float) -> int:
        """SIGTERM, then its exit status (fails if it has not exited within
        ``timeout_s``)."""
        self.process.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.process.args} still runs {timeout_s} s after SIGTERM:\n{self.log}"
            ) from None

    def __enter__(self) -> AppProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        self._reader.join(30)
        assert self.process.stderr is not None
        self.process.stderr.close()
