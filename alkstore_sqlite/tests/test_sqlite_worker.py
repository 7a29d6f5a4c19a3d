"""The worker on SQLite's own faults: the application holding the database's
write lock while the worker's finished jobs wait for their ack (regression case
015; the engine-independent form is the contract's
``test_case_015_writes_on_held_jobs_are_retried_through_a_passing_fault``), and a
database file the worker cannot write."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import alkstore
from alkstore import App, WorkerCounts
from alkstore_sqlite import SqliteStore

WAIT_S = 60.0


def wait_until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_case_015_acks_wait_out_the_applications_write_lock(
    open_sqlite: Callable[..., SqliteStore], db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ten jobs finish while the application holds the write lock past the
    store's busy timeout: their batched ack fails on ``database is locked``
    and is tried again while the claims hold (30 s), so it lands once the
    lock is released; each job ran once and none is reclaimed (before the
    fix the ack was abandoned and the jobs ran again after their claims
    lapsed)."""
    store = open_sqlite(clock=None, busy_timeout_s=0.2)
    app = App(store=store)
    gate = threading.Event()
    ran: list[int] = []

    @app.task(queue="q", name="short", visibility_timeout_s=30)
    def short(n: int) -> None:
        assert gate.wait(WAIT_S)
        ran.append(n)

    app.queue("q").enqueue_many([short.payload(n) for n in range(10)])
    worker = app.worker(concurrency=10, handle_signals=False, poll_interval_s=0.05)
    result: list[WorkerCounts] = []
    thread = threading.Thread(target=lambda: result.append(worker.run(burst=True)))
    blocker = sqlite3.connect(db_path, isolation_level=None)
    try:
        with caplog.at_level(logging.INFO, logger="alkstore.worker"):
            thread.start()
            wait_until(lambda: worker.running == 10, "the ten jobs to start")
            blocker.execute("BEGIN IMMEDIATE")  # the application's write transaction
            gate.set()
            wait_until(
                lambda: "database is locked" in caplog.text, "the ack to fail on the held lock"
            )
            assert "left to lapse" not in caplog.text
            assert "trying again while the claim holds" in caplog.text
            blocker.execute("COMMIT")
            thread.join(WAIT_S)
    finally:
        blocker.close()
    assert not thread.is_alive()
    assert result == [WorkerCounts(succeeded=10)]
    assert sorted(ran) == list(range(10))
    assert tuple(app.queue("q").stats()) == (0, 0, 0, 0)
    assert "left to lapse" not in caplog.text


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """Make the database file unwritable for this process: ``chmod`` for an
    ordinary user, the immutable attribute for root (who ignores modes)."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(0o644)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], check=False).returncode:
        pytest.skip("root cannot make the file unwritable here (no chattr +i)")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_a_worker_on_an_unwritable_file_exits_non_zero(tmp_path: Path) -> None:
    """Issue 11: ``alkstore worker`` on a database file it cannot write
    stops with one clear line and status 1 at its first claim, instead of
    retrying forever (SQLITE_READONLY is a permanent EngineError)."""
    (tmp_path / "jobs.py").write_text(
        "import alkstore\n"
        "app = alkstore.App()\n"
        "@app.task(queue='q', name='noop')\n"
        "def noop():\n"
        "    pass\n"
    )
    db = tmp_path / "alkstore.db"
    with alkstore.open(f"sqlite:///{db}") as store:
        store.queue("q").enqueue({"task": "noop"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    with unwritable(db):
        result = subprocess.run(
            [sys.executable, "-m", "alkstore", "worker", "jobs:app"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: SQLite error: attempt to write a readonly database: ")
    assert last.endswith("(EngineError)")
    assert "stops: SQLite error: attempt to write a readonly database" in result.stderr
