"""Opening a store while the application holds a transaction on the file
(regression case 017): a file that is ready is only read, and one that needs a
write says so at once instead of waiting for the caller's own lock."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlite_children

import alkstore
from alkstore.errors import EngineError, SchemaVersionError
from alkstore_sqlite import SCHEMA_VERSION, SqliteStore, _schema

# Large, so that a wait for the caller's lock cannot pass for quick.
_BUSY_TIMEOUT_S = 30.0
# What "at once" means here: far below the busy timeout, far above the
# cost of opening a store on a loaded machine.
_AT_ONCE_S = 5.0


@pytest.fixture
def app_conn(db_path: Path) -> Iterator[sqlite3.Connection]:
    """The application's connection, explicit transactions."""
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=_BUSY_TIMEOUT_S)
    yield conn
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.close()


def _migrated(db_url: str, db_path: Path) -> None:
    """The file migrated by an earlier run, with the application's table."""
    alkstore.open(db_url).close()
    with sqlite3.connect(db_path, isolation_level=None) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def _timed_error(call: Callable[[], Any]) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(alkstore.AlkstoreError) as caught:
        call()
    return caught.value, time.monotonic() - started


def _job_ids(db_url: str, queue: str) -> list[int]:
    with alkstore.open(db_url) as store:
        handles = store.queue(queue).claim_batch("check", 100)
        return sorted(handle.id for handle in handles)


# -- the case as written: an app used first inside the caller's transaction --


@pytest.mark.parametrize("outcome", ["COMMIT", "ROLLBACK"])
def test_case_017_first_enqueue_tx_of_an_app_inside_the_callers_transaction(
    db_url: str, db_path: Path, app_conn: sqlite3.Connection, outcome: str
) -> None:
    _migrated(db_url, db_path)
    app = alkstore.App(db_url, busy_timeout_s=_BUSY_TIMEOUT_S)

    @app.task(queue="welcome")
    def welcome(user_id: int) -> None: ...

    try:
        app_conn.execute("BEGIN IMMEDIATE")
        app_conn.execute("INSERT INTO orders (id) VALUES (1)")
        job_id, took = _timed(lambda: welcome.enqueue_tx(app_conn, 1))
        assert took < _AT_ONCE_S
        assert app_conn.in_transaction
        app_conn.execute(outcome)
    finally:
        app.close()
    assert _job_ids(db_url, "welcome") == ([job_id] if outcome == "COMMIT" else [])
    orders = app_conn.execute("SELECT count(*) FROM orders").fetchone()[0]
    assert orders == (1 if outcome == "COMMIT" else 0)


def test_open_and_enqueue_tx_inside_the_callers_transaction(
    db_url: str, db_path: Path, app_conn: sqlite3.Connection
) -> None:
    _migrated(db_url, db_path)
    app_conn.execute("BEGIN IMMEDIATE")
    app_conn.execute("INSERT INTO orders (id) VALUES (1)")
    store, took = _timed(lambda: alkstore.open(db_url, busy_timeout_s=_BUSY_TIMEOUT_S))
    try:
        assert took < _AT_ONCE_S
        job_id, took = _timed(lambda: store.queue("q").enqueue_tx(app_conn, "J"))
        assert took < _AT_ONCE_S
        # Opening again and migrating an opened store need no write either.
        _, took = _timed(store.migrate)
        assert took < _AT_ONCE_S
        _, took = _timed(lambda: alkstore.open(db_url, migrate=False).close())
        assert took < _AT_ONCE_S
        app_conn.execute("COMMIT")
    finally:
        store.close()
    assert _job_ids(db_url, "q") == [job_id]


def test_outbox_add_of_an_app_inside_the_callers_transaction(
    db_url: str, db_path: Path, app_conn: sqlite3.Connection
) -> None:
    _migrated(db_url, db_path)
    app = alkstore.App(db_url, busy_timeout_s=_BUSY_TIMEOUT_S)
    try:
        app_conn.execute("BEGIN IMMEDIATE")
        app_conn.execute("INSERT INTO orders (id) VALUES (1)")
        message_id, took = _timed(lambda: app.outbox("orders.out").add(app_conn, {"order": 1}))
        assert took < _AT_ONCE_S
        app_conn.execute("COMMIT")
    finally:
        app.close()
    assert _job_ids(db_url, "orders.out") == [message_id]


def test_operations_that_only_read_do_not_wait_for_the_callers_lock(
    db_url: str, db_path: Path, app_conn: sqlite3.Connection
) -> None:
    _migrated(db_url, db_path)
    with alkstore.open(db_url, busy_timeout_s=_BUSY_TIMEOUT_S) as store:
        queue = store.queue("q")
        dead = store.queue("dead", alkstore.QueueOpts(max_attempts=1))
        job_id = queue.enqueue("J")
        dead.enqueue("D")
        handle = dead.claim_one("w")
        assert handle is not None
        handle.retry("boom")
        store.schedule("nightly", "@daily", "q", "S")
        app_conn.execute("BEGIN IMMEDIATE")
        app_conn.execute("INSERT INTO orders (id) VALUES (1)")
        reads: list[Callable[[], object]] = [
            queue.stats,
            lambda: queue.get_job(job_id),
            queue.is_paused,
            dead.dead_jobs,
            store.queue_names,
            store.schedules,
            lambda: store.queue("empty").claim_one("w"),  # the look finds nothing
            lambda: store.listen("q").close(),
            lambda: queue.enqueue_tx(app_conn, "in the transaction"),
        ]
        for read in reads:
            _, took = _timed(read)
            assert took < _AT_ONCE_S, read
        app_conn.execute("ROLLBACK")


# -- files that need a write: an error at once, never the busy timeout ----


def _app_tables(db_path: Path, *, wal: bool) -> None:
    """A file the application made, without alkstore's schema."""
    with sqlite3.connect(db_path, isolation_level=None) as conn:
        if wal:
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")


def _older_schema(db_path: Path) -> None:
    """A file left by code of schema version 2, in WAL mode."""
    with sqlite3.connect(db_path, isolation_level=None) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_schema._CREATE_META)
        for statements in _schema._MIGRATIONS[:2]:
            for statement in statements:
                conn.execute(statement, {"now": 0})
        conn.execute("PRAGMA legacy_alter_table = OFF")
        conn.execute("INSERT INTO _alkstore_meta (key, value) VALUES ('schema_version', 2)")
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        conn.execute("COMMIT")


_NEEDS_A_WRITE = {
    "unmigrated, WAL": lambda path: _app_tables(path, wal=True),
    "unmigrated, rollback journal": lambda path: _app_tables(path, wal=False),
    "schema version 2": _older_schema,
}


@pytest.mark.parametrize("begin", ["BEGIN IMMEDIATE", "BEGIN EXCLUSIVE"])
@pytest.mark.parametrize("kind", sorted(_NEEDS_A_WRITE))
def test_a_file_that_needs_a_write_refuses_at_once(
    db_url: str, db_path: Path, app_conn: sqlite3.Connection, kind: str, begin: str
) -> None:
    _NEEDS_A_WRITE[kind](db_path)
    app = alkstore.App(db_url, busy_timeout_s=_BUSY_TIMEOUT_S)

    @app.task(queue="welcome")
    def welcome(user_id: int) -> None: ...

    app_conn.execute(begin)
    app_conn.execute("INSERT INTO orders (id) VALUES (1)")
    error, took = _timed_error(lambda: welcome.enqueue_tx(app_conn, 1))
    assert took < _AT_ONCE_S
    assert isinstance(error, SchemaVersionError), error
    message = str(error)
    assert str(db_path) in message
    assert "a connection of this process holds a lock" in message
    assert "`alkstore migrate`" in message
    assert "before starting transactions on the file" in message
    # The caller's transaction is untouched and still commits.
    assert app_conn.in_transaction
    app_conn.execute("COMMIT")
    assert app_conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    # Done as the message says, the same steps work.
    app.store  # noqa: B018 - opens and migrates, outside any transaction
    app_conn.execute(begin)
    welcome.enqueue_tx(app_conn, 2)
    app_conn.execute("COMMIT")
    app.close()
    with alkstore.open(db_url, migrate=False) as store:
        assert store.queue("welcome").stats().pending == 1


def test_alkstore_open_refuses_at_once_on_an_unmigrated_file(
    db_url: str, db_path: Path, app_conn: sqlite3.Connection
) -> None:
    _app_tables(db_path, wal=True)
    app_conn.execute("BEGIN IMMEDIATE")
    app_conn.execute("INSERT INTO orders (id) VALUES (1)")
    error, took = _timed_error(lambda: alkstore.open(db_url, busy_timeout_s=_BUSY_TIMEOUT_S))
    assert took < _AT_ONCE_S
    assert isinstance(error, SchemaVersionError)
    assert "create the alkstore schema in" in str(error)


def test_the_refusal_holds_from_another_thread_of_the_process(
    db_url: str, db_path: Path, app_conn: sqlite3.Connection
) -> None:
    """The caller waits in the thread that holds the lock while the store
    is opened on another: still a wait for ourselves."""
    _app_tables(db_path, wal=True)
    app_conn.execute("BEGIN IMMEDIATE")
    app_conn.execute("INSERT INTO orders (id) VALUES (1)")
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            alkstore.open(db_url, busy_timeout_s=_BUSY_TIMEOUT_S).close()
        except BaseException as error:
            errors.append(error)

    opener = threading.Thread(target=open_store)
    started = time.monotonic()
    opener.start()
    opener.join(_BUSY_TIMEOUT_S * 2)
    assert time.monotonic() - started < _AT_ONCE_S
    assert len(errors) == 1
    assert isinstance(errors[0], SchemaVersionError)


def test_another_processs_lock_is_still_waited_for(db_url: str, db_path: Path) -> None:
    """Only this process's locks are refused at once: another process's
    writer lets go, so opening waits for it up to the busy timeout."""
    _app_tables(db_path, wal=True)
    held, release = sqlite_children.event(), sqlite_children.event()
    holder = sqlite_children.start_child(
        sqlite_children.hold_write_lock, (str(db_path), held, release)
    )
    try:
        assert held.wait(sqlite_children.CHILD_TIMEOUT_S)
        error, took = _timed_error(lambda: alkstore.open(db_url, busy_timeout_s=0.5))
        assert isinstance(error, EngineError)
        assert not isinstance(error, SchemaVersionError)
        assert "database is locked" in str(error)
        assert took >= 0.5
        release.set()
    finally:
        release.set()
        holder.join(sqlite_children.CHILD_TIMEOUT_S)
    assert holder.exitcode == 0
    with alkstore.open(db_url) as store:
        assert isinstance(store, SqliteStore)


def test_threads_opening_one_new_file_at_once_all_succeed(db_url: str, db_path: Path) -> None:
    """Stores of one process prepare a file one at a time, so one's
    migration is never taken for a lock of the caller's."""
    count = 8
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def open_store() -> None:
        barrier.wait()
        try:
            alkstore.open(db_url).close()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=open_store) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(sqlite_children.CHILD_TIMEOUT_S)
    assert errors == []
    with sqlite3.connect(db_path) as conn:
        assert _schema.read_version(conn) == SCHEMA_VERSION
