"""The worker on SQLite's own faults: the application holding the database's
write lock while the worker's finished jobs wait for their ack (handed case
015). The engine-independent form is the contract's
``test_writes_on_held_jobs_are_retried_through_a_passing_fault``."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

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
