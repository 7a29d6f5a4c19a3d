"""``enqueue_tx`` through the application's own ``sqlite3`` connection (docs/contract.md
§3 "Transactional enqueue")."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from alkstore.errors import EngineError, ValidationError
from alkstore_sqlite import SqliteStore


@pytest.fixture
def app(store: SqliteStore, db_path: Path) -> Iterator[sqlite3.Connection]:
    """The application's connection, explicit transactions, with a table."""
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=30)
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
    yield conn
    conn.close()


def test_commit_makes_the_job_visible_and_wakes(
    store: SqliteStore, app: sqlite3.Connection
) -> None:
    queue = store.queue("q")
    with store.listen("q") as sub:
        app.execute("BEGIN")
        app.execute("INSERT INTO orders (id) VALUES (43)")
        job_id = queue.enqueue_tx(app, {"order": 43})
        assert app.in_transaction
        assert queue.claim_one("w") is None
        assert not sub.wait(0.05)
        app.execute("COMMIT")
        assert sub.wait(5)
    handle = queue.claim_one("w")
    assert handle is not None
    assert (handle.id, handle.payload) == (job_id, {"order": 43})


def test_rollback_leaves_no_job_and_no_wake(store: SqliteStore, app: sqlite3.Connection) -> None:
    queue = store.queue("q")
    with store.listen("q") as sub:
        app.execute("BEGIN")
        queue.enqueue_tx(app, {"order": 42})
        app.execute("ROLLBACK")
        assert not sub.wait(0.1)
    assert queue.stats().pending == 0
    assert queue.claim_one("w") is None


def test_rolled_back_savepoint(store: SqliteStore, app: sqlite3.Connection) -> None:
    queue = store.queue("q")
    app.execute("BEGIN")
    app.execute("SAVEPOINT sp")
    first = queue.enqueue_tx(app, "J1")
    app.execute("ROLLBACK TO sp")
    second = queue.enqueue_tx(app, "J2")
    app.execute("COMMIT")
    # SQLite's AUTOINCREMENT counter rolls back with the savepoint, so J2 may
    # reuse the id J1 was given: that id never belonged to a committed job.
    assert second >= first
    job = queue.get_job(second)
    assert job is not None
    assert job.payload == "J2"
    assert queue.stats().pending == 1
    handle = queue.claim_one("w")
    assert handle is not None
    assert handle.payload == "J2"
    assert queue.claim_one("w") is None


def test_python_default_transactions_work(store: SqliteStore, db_path: Path) -> None:
    # sqlite3's legacy mode opens the transaction implicitly at the first DML.
    conn = sqlite3.connect(db_path, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO orders (id) VALUES (1)")
        job_id = store.queue("q").enqueue_tx(conn, "legacy")
        conn.commit()
    finally:
        conn.close()
    assert store.queue("q").get_job(job_id) is not None


def test_not_a_connection_is_refused(store: SqliteStore, app: sqlite3.Connection) -> None:
    queue = store.queue("q")
    app.execute("BEGIN")
    for wrong in (None, "conn", app.cursor(), object()):
        with pytest.raises(ValidationError, match=r"sqlite3\.Connection"):
            queue.enqueue_tx(wrong, 1)
    app.execute("ROLLBACK")


def test_a_connection_outside_a_transaction_is_refused(
    store: SqliteStore, app: sqlite3.Connection
) -> None:
    before = app.total_changes
    with pytest.raises(ValidationError, match="open transaction"):
        store.queue("q").enqueue_tx(app, 1)
    assert app.total_changes == before
    assert not app.in_transaction
    assert store.queue("q").stats().pending == 0


def test_a_connection_to_another_file_is_refused(store: SqliteStore, tmp_path: Path) -> None:
    other = sqlite3.connect(tmp_path / "other.db", isolation_level=None)
    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for conn in (other, memory):
            conn.execute("BEGIN")
            conn.execute("CREATE TABLE t (x)")
            with pytest.raises(ValidationError, match="store's database"):
                store.queue("q").enqueue_tx(conn, 1)
            # The caller's transaction is untouched and still usable.
            assert conn.in_transaction
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("COMMIT")
    finally:
        other.close()
        memory.close()


def test_the_same_file_by_another_name_is_accepted(
    store: SqliteStore, db_path: Path, tmp_path: Path
) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(db_path)
    conn = sqlite3.connect(link, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN")
        job_id = store.queue("q").enqueue_tx(conn, 1)
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert store.queue("q").get_job(job_id) is not None


def test_a_closed_or_foreign_thread_connection_is_refused(
    store: SqliteStore, db_path: Path
) -> None:
    closed = sqlite3.connect(db_path)
    closed.close()
    with pytest.raises(ValidationError, match="cannot use this connection") as refused:
        store.queue("q").enqueue_tx(closed, 1)
    assert "check_same_thread" not in str(refused.value)

    made: list[sqlite3.Connection] = []
    thread = threading.Thread(target=lambda: made.append(sqlite3.connect(db_path)))
    thread.start()
    thread.join()
    # What an async store's enqueue_tx meets: it uses the connection from
    # one of its threads. The message says how to open one it can use.
    with pytest.raises(ValidationError, match="cannot use this connection") as refused:
        store.queue("q").enqueue_tx(made[0], 1)
    assert "sqlite3.connect(..., check_same_thread=False)" in str(refused.value)
    # Only its own thread may close it; garbage collection does it here.
    made.clear()


def test_a_refused_payload_leaves_the_transaction_usable(
    store: SqliteStore, app: sqlite3.Connection
) -> None:
    app.execute("BEGIN")
    app.execute("INSERT INTO orders (id) VALUES (7)")
    with pytest.raises(ValidationError):
        store.queue("q").enqueue_tx(app, {"s": "\ud800"})
    assert app.execute("SELECT 1").fetchone() == (1,)
    app.execute("COMMIT")
    assert app.execute("SELECT id FROM orders").fetchall() == [(7,)]


def test_a_database_error_keeps_the_callers_transaction(
    store: SqliteStore, app: sqlite3.Connection, db_path: Path
) -> None:
    app.execute(
        "CREATE TRIGGER insert_fails BEFORE INSERT ON _alkstore_jobs "
        "BEGIN SELECT RAISE(ABORT, 'injected'); END"
    )
    app.execute("BEGIN")
    app.execute("INSERT INTO orders (id) VALUES (8)")
    with pytest.raises(EngineError) as caught:
        store.queue("q").enqueue_tx(app, 1)
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    # The failed statement left nothing behind; the order is still there.
    assert app.in_transaction
    app.execute("COMMIT")
    app.execute("DROP TRIGGER insert_fails")
    assert app.execute("SELECT id FROM orders").fetchall() == [(8,)]
    assert store.queue("q").stats() == (0, 0, 0, 0)


@pytest.mark.parametrize("commit", [True, False])
def test_the_sqlite3_modules_implicit_transaction_is_the_callers(
    store: SqliteStore, db_path: Path, commit: bool
) -> None:
    """sqlite3's default (legacy transaction control): the module begins a
    transaction before the first write, so the enqueue opens it and the
    caller's commit or rollback decides, as for its own first write."""
    conn = sqlite3.connect(db_path, timeout=30)  # isolation_level "" (DEFERRED)
    try:
        assert not conn.in_transaction
        job_id = store.queue("q").enqueue_tx(conn, {"order": 1})
        assert conn.in_transaction
        assert store.queue("q").get_job(job_id) is None  # not committed yet
        conn.commit() if commit else conn.rollback()
    finally:
        conn.close()
    got = store.queue("q").get_job(job_id)
    assert (got is not None) == commit
    assert store.queue("q").stats().pending == (1 if commit else 0)
