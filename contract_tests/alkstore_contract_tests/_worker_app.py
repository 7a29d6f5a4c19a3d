"""The tasks and the child-process entry point of :mod:`alkstore_contract_tests.suite.worker`.

Importable by a ``spawn``-started child, so it holds no engine-specific code:
a child opens the target with :func:`alkstore.open` after importing the
harness's ``child_process_imports``.

Every execution of a task is recorded as one line ``TOKEN PID`` in a file
of its own under the test's ``log_dir`` (one file per execution, written
whole and renamed into place), so the parent can count how many times each
job ran across threads and processes, including in a process it killed.
"""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import alkstore
from alkstore import App

__all__ = [
    "GATE_TIMEOUT_S",
    "QUEUE",
    "child_worker",
    "executions",
    "register_tasks",
    "release",
    "started",
]

#: The queue of the suite's tasks.
QUEUE = "work"
#: How long a gated task waits for its release, seconds, before it raises.
GATE_TIMEOUT_S = 60.0
_GATE_POLL_S = 0.02


def _write_whole(path: Path, text: str) -> None:
    # Written to a temporary name and renamed: a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.replace(tmp, path)


def _record(log_dir: str, kind: str, token: str) -> None:
    pid = os.getpid()
    name = f"{kind}-{token}-{pid}-{time.monotonic_ns()}"
    _write_whole(Path(log_dir) / name, f"{token} {pid}\n")


def executions(log_dir: str | Path, kind: str = "done") -> Counter[str]:
    """How many times each token's task finished (``kind="done"``) or
    started (``kind="started"``)."""
    counts: Counter[str] = Counter()
    for path in Path(log_dir).glob(f"{kind}-*"):
        token, _pid = path.read_text().split()
        counts[token] += 1
    return counts


def started(log_dir: str | Path) -> Counter[str]:
    """How many times each token's gated task started."""
    return executions(log_dir, "started")


def release(log_dir: str | Path) -> None:
    """Let every gated task, running or future, finish."""
    _write_whole(Path(log_dir) / "release", "")


def register_tasks(app: App, visibility_timeout_s: float = 30) -> None:
    """Register the suite's tasks on ``app``, on the queue :data:`QUEUE` with
    the given visibility timeout.

    ``record(log_dir, token)``
        Records one execution and returns.
    ``gated(log_dir, token)``
        Records that it started, waits until :func:`release` was called for
        ``log_dir``, then records one execution.
    """

    @app.task(queue=QUEUE, name="record", visibility_timeout_s=visibility_timeout_s)
    def record(log_dir: str, token: str) -> None:
        _record(log_dir, "done", token)

    @app.task(queue=QUEUE, name="gated")
    def gated(log_dir: str, token: str) -> None:
        _record(log_dir, "started", token)
        gate = Path(log_dir) / "release"
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{gate} did not appear within {GATE_TIMEOUT_S} s")
            time.sleep(_GATE_POLL_S)
        _record(log_dir, "done", token)


def child_worker(
    *,
    url: str,
    options: Mapping[str, Any],
    imports: Sequence[str],
    visibility_timeout_s: float,
    worker_options: Mapping[str, Any],
    burst: bool,
    log_path: str,
) -> None:
    """A spawned child's whole life: open the target, run a worker in the
    main thread (so SIGTERM/SIGINT handlers are installed) and exit 0 when
    it returns. The worker's log goes to ``log_path``."""
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.getLogger("alkstore").addHandler(handler)
    logging.getLogger("alkstore").setLevel(logging.INFO)
    for module in imports:
        importlib.import_module(module)
    with alkstore.App(url, **options) as app:
        register_tasks(app, visibility_timeout_s)
        app.worker(**worker_options).run(burst=burst)
