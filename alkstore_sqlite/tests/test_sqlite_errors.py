"""Driver errors are wrapped (docs/contract.md §2 "Errors"); live-to-dead moves are
atomic under injected faults (regression case 011)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from harness import SqliteHarness

import alkstore
from alkstore import QueueOpts
from alkstore.errors import EngineError
from alkstore_contract_tests import ManualClock, StoreTarget
from alkstore_sqlite import SqliteStore
from alkstore_sqlite._connection import engine_error


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
        assert caught.value.permanent is False  # a held lock passes
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
    assert caught.value.permanent is True


def _open_error(path: Path) -> str:
    with pytest.raises(EngineError) as caught:
        alkstore.open(f"sqlite:///{path}")
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    return str(caught.value)


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    path = tmp_path / "missing-dir" / "x.db"
    message = _open_error(path)
    assert "unable to open database file" in message
    assert repr(str(path)) in message
    assert f"the directory {str(tmp_path / 'missing-dir')!r} does not exist" in message


def test_a_file_that_is_not_a_database_is_named(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database, but long enough to have a header" * 4)
    with pytest.raises(EngineError) as caught:
        alkstore.open(f"sqlite:///{path}")
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)
    assert caught.value.permanent is True
    assert str(caught.value) == (
        f"SQLite error: file is not a database: {str(path)!r} (the file exists but is "
        "not an SQLite database; the URL should name a new file or an alkstore database)"
    )
    assert path.read_text().startswith("not a database")  # left as it was


def test_a_directory_given_as_the_path_is_named(tmp_path: Path) -> None:
    message = _open_error(tmp_path)
    assert repr(str(tmp_path)) in message
    assert "it is a directory" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
@pytest.mark.parametrize("exists", [False, True])
def test_a_read_only_directory_is_named(tmp_path: Path, exists: bool) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = directory / "x.db"
    if exists:
        alkstore.open(f"sqlite:///{path}").close()
        for extra in directory.glob("x.db-*"):
            extra.unlink()
    directory.chmod(0o555)
    try:
        message = _open_error(path)
    finally:
        directory.chmod(0o755)
    assert repr(str(path)) in message
    assert f"the directory {str(directory)!r} is not writable" in message


def test_open_errors_say_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The diagnosis itself, also where a test cannot make a directory
    read-only (as root)."""
    directory = tmp_path / "d"
    directory.mkdir()
    path = str(directory / "x.db")
    cantopen = sqlite3.OperationalError("unable to open database file")
    cantopen.sqlite_errorcode = 14  # type: ignore[attr-defined]
    readonly = sqlite3.OperationalError("attempt to write a readonly database")
    readonly.sqlite_errorcode = 8 | (6 << 8)  # type: ignore[attr-defined]
    monkeypatch.setattr(os, "access", lambda p, mode: p != str(directory))
    for error in (cantopen, readonly):
        message = str(engine_error(error, path))
        assert message.startswith(f"SQLite error: {error}: {path!r} (")
        assert "is not writable" in message
    monkeypatch.setattr(os, "access", lambda p, mode: p != path)
    (directory / "x.db").write_bytes(b"")
    assert "the file is not readable and writable" in str(engine_error(readonly, path))
    # Other errors do not blame the file.
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = 5  # type: ignore[attr-defined]
    assert str(engine_error(locked, path)) == "SQLite error: database is locked"
