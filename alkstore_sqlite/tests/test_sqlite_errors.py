"""Driver errors are wrapped (SPEC §2 "Errors"); live-to-dead moves are
atomic under injected faults (handed case 011)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from harness import SqliteHarness

from alkstore import QueueOpts
from alkstore.errors import EngineError
from alkstore_contract_tests import ManualClock, StoreTarget
from alkstore_sqlite import SqliteStore


@pytest.fixture
def faults(db_url: str) -> Callable[[], AbstractContextManager[None]]:
    harness = SqliteHarness()
    target = StoreTarget(db_url, {})
    return lambda: harness.dead_letter_inserts_fail(target)


def _where(store: SqliteStore, job_id: int) -> list[str]:
    with sqlite3.connect(store.path) as conn:
        live = conn.execute("SELECT 1 FROM _alkstore_jobs WHERE id = ?", (job_id,)).fetchall()
        dead = conn.execute("SELECT 1 FROM _alkstore_dead WHERE id = ?", (job_id,)).fetchall()
    return ["live"] * len(live) + ["dead"] * len(dead)


def _assert_engine_error(caught: pytest.ExceptionInfo[EngineError]) -> None:
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    assert "injected" in str(caught.value)


def test_fail_under_a_failing_dead_table_keeps_the_job(
    store: SqliteStore, clock: ManualClock, faults: Callable[[], AbstractContextManager[None]]
) -> None:
    queue = store.queue("q")
    job_id = queue.enqueue("x")
    handle = queue.claim_one("w")
    assert handle is not None
    with faults():
        with pytest.raises(EngineError) as caught:
            handle.fail("boom")
        _assert_engine_error(caught)
        assert _where(store, job_id) == ["live"]
        # retry at the budget moves too
        last = store.queue("q", QueueOpts(max_attempts=1))
        last_id = last.enqueue("y", priority=5)
        last_handle = last.claim_one("w")
        assert last_handle is not None
        assert last_handle.id == last_id
        with pytest.raises(EngineError) as caught:
            last_handle.retry("e")
        _assert_engine_error(caught)
        assert _where(store, last_id) == ["live"]
        # the claim's own dead-letter step
        clock.advance(31)
        with pytest.raises(EngineError) as caught:
            queue.claim_one("w2")
        _assert_engine_error(caught)
        assert _where(store, last_id) == ["live"]
        # and the sweep
        expiring = queue.enqueue("z", expires=1)
        clock.advance(2)
        with pytest.raises(EngineError):
            queue.sweep_expired()
        assert _where(store, expiring) == ["live"]
    assert not handle.fail("boom")  # lapsed meanwhile
    again = queue.claim_one("w3")
    assert again is not None
    assert again.id == job_id
    assert again.fail("boom")
    assert _where(store, job_id) == ["dead"]
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.state, job.last_error) == ("dead", "boom")


def test_a_missing_table_is_an_engine_error(store: SqliteStore) -> None:
    with sqlite3.connect(store.path) as conn:
        conn.execute("DROP TABLE _alkstore_dead")
    with pytest.raises(EngineError) as caught:
        store.queue("q").stats()
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)


def test_a_held_write_lock_times_out_as_an_engine_error(
    open_sqlite: Callable[..., SqliteStore], db_path: Path
) -> None:
    store = open_sqlite(busy_timeout_s=0.05)
    queue = store.queue("q")
    queue.enqueue(1)
    blocker = sqlite3.connect(db_path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(EngineError, match="locked") as caught:
            queue.enqueue(2)
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        # Reads and empty-looking claims do not need the write lock.
        assert queue.stats().pending == 1
        assert queue.get_job(1) is not None
        assert store.queue("empty").claim_one("w") is None
    finally:
        blocker.close()
    assert queue.enqueue(3) > 1


def test_unopenable_file_is_an_engine_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError) as caught:
        SqliteStore(str(tmp_path / "missing-dir" / "x.db"))
    assert isinstance(caught.value.__cause__, sqlite3.Error)
