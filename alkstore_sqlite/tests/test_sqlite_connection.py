"""The connection pool: busy retries, error wrapping, closing."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

import alkstore
from alkstore.errors import EngineError, StoreClosedError
from alkstore_sqlite import SqliteStore
from alkstore_sqlite._connection import ConnectionPool, is_busy


def _busy(code: int = 5) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = code  # type: ignore[attr-defined]
    return error


def test_busy_codes() -> None:
    assert is_busy(_busy(5))
    assert is_busy(_busy(5 | (2 << 8)))  # SQLITE_BUSY_SNAPSHOT
    assert is_busy(_busy(6))
    assert not is_busy(_busy(1))


def test_a_busy_operation_is_retried(tmp_path: Path) -> None:
    pool = ConnectionPool(str(tmp_path / "x.db"), busy_timeout_s=5)
    calls: list[int] = []

    def op(conn: sqlite3.Connection, value: int) -> int:
        calls.append(value)
        if len(calls) < 3:
            raise _busy()
        return int(conn.execute("SELECT ?", (value,)).fetchone()[0])

    assert pool.run(op, 7) == 7
    assert calls == [7, 7, 7]
    pool.close()


def test_busy_past_the_timeout_and_other_errors_are_wrapped(tmp_path: Path) -> None:
    pool = ConnectionPool(str(tmp_path / "x.db"), busy_timeout_s=0.01)

    def always_busy(conn: sqlite3.Connection) -> None:
        raise _busy()

    with pytest.raises(EngineError) as caught:
        pool.run(always_busy)
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("SELECT * FROM nowhere")

    with pytest.raises(EngineError, match="no such table") as caught:
        pool.run(broken)
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    pool.close()


def test_a_failed_transaction_rolls_back(tmp_path: Path) -> None:
    pool = ConnectionPool(str(tmp_path / "x.db"), busy_timeout_s=5)
    pool.run(lambda conn: conn.execute("CREATE TABLE t (x UNIQUE)"))

    def twice(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO t VALUES (1)")

    with pytest.raises(EngineError) as caught:
        pool.transaction(twice)
    assert isinstance(caught.value.__cause__, sqlite3.IntegrityError)
    assert pool.run(lambda conn: conn.execute("SELECT count(*) FROM t").fetchone()[0]) == 0
    pool.close()


def test_connections_are_reused_and_closed(tmp_path: Path) -> None:
    pool = ConnectionPool(str(tmp_path / "x.db"), busy_timeout_s=5)
    seen: set[int] = set()
    barrier = threading.Barrier(3)

    def hold(conn: sqlite3.Connection) -> None:
        seen.add(id(conn))
        barrier.wait()

    threads = [threading.Thread(target=pool.run, args=(hold,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 3
    assert len(pool._idle) == 3
    idle = list(pool._idle)
    pool.close()
    for conn in idle:
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")
    with pytest.raises(StoreClosedError):
        pool.run(hold)


@pytest.mark.parametrize(("option", "pragma"), [({}, 2), ({"synchronous": "normal"}, 1)])
def test_commits_are_synced_to_disk_unless_told_otherwise(
    tmp_path: Path, option: dict[str, str], pragma: int
) -> None:
    # PRAGMA synchronous: 2 is FULL (a commit is on disk before it returns,
    # nothing committed is lost to a power cut), 1 is NORMAL.
    with alkstore.open(f"sqlite:///{tmp_path / 'a.db'}", **option) as store:
        assert isinstance(store, SqliteStore)
        seen = store._pool.run(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
        assert seen == pragma


@pytest.mark.parametrize("bad", ["off", "FULL", 2, None])
def test_synchronous_takes_full_or_normal(tmp_path: Path, bad: object) -> None:
    with pytest.raises(alkstore.ValidationError, match="synchronous"):
        alkstore.open(f"sqlite:///{tmp_path / 'a.db'}", synchronous=bad)
