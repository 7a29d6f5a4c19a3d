"""A store whose database file is deleted, replaced or moved while it runs
(regression case 016): it notices within its check interval, says so once,
refuses every later operation for good, and loses nothing committed."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlite_children

import alkstore
from alkstore import JobHandle
from alkstore.errors import EngineError
from alkstore_contract_tests import ManualClock
from alkstore_sqlite import SqliteStore, _identity, _wake

# Generous beside CHECK_INTERVAL_S (0.1 s) and the watcher's safety look
# (0.25 s), for a loaded machine; without the guard nothing ever raises.
_BOUND_S = 5.0


class _Monotonic:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fresh_db(path: Path) -> None:
    """Another alkstore database, with a job of its own (id 1, as the
    original's first job was)."""
    with alkstore.open(f"sqlite:///{path}") as other:
        other.queue("q").enqueue("from the other file")


def _remove_all(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        os.remove(f"{path}{suffix}")


def _replace_with_another_database(path: Path) -> None:
    other = path.with_name("restored.db")
    _fresh_db(other)
    os.replace(other, path)  # its own -wal and -shm went with its last close


def _rename_away(path: Path) -> None:
    os.rename(path, path.with_name("moved.db"))


def _rename_directory(path: Path) -> None:
    os.rename(path.parent, path.parent.with_name(path.parent.name + "-moved"))


def _remove_wal_and_shm(path: Path) -> None:
    os.remove(f"{path}-wal")
    os.remove(f"{path}-shm")


_CHANGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "deleted": (_remove_all, "was deleted or moved away"),
    "replaced": (_replace_with_another_database, "was replaced by another file"),
    "renamed away": (_rename_away, "was deleted or moved away"),
    "directory renamed": (_rename_directory, "its directory was renamed"),
    # Seen between the two removals, the -wal alone is named.
    "-wal and -shm deleted": (_remove_wal_and_shm, "is still there, but its -wal"),
}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A database in a directory of its own, which a test may rename."""
    folder = tmp_path / "data"
    folder.mkdir()
    return folder / "q.db"


@pytest.fixture
def errors_logged(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The ERROR lines the engine logged."""
    caplog.set_level(logging.ERROR, logger="alkstore.sqlite")

    def lines() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "alkstore.sqlite" and r.levelno == logging.ERROR
        ]

    return lines


def _operations(
    store: SqliteStore, handle: JobHandle, dead_id: int, conn: sqlite3.Connection
) -> dict[str, Callable[[], object]]:
    queue = store.queue("q")
    return {
        "enqueue": lambda: queue.enqueue("new"),
        "enqueue_many": lambda: queue.enqueue_many(["a", "b"]),
        "enqueue_tx": lambda: queue.enqueue_tx(conn, "in the caller's transaction"),
        "claim_one": lambda: queue.claim_one("w"),
        "claim_batch": lambda: queue.claim_batch("w", 10),
        "ack": handle.ack,
        "retry": lambda: handle.retry("boom"),
        "heartbeat": handle.heartbeat,
        "fail": lambda: handle.fail("boom"),
        "ack_batch": lambda: queue.ack_batch([handle.id]),
        "cancel": lambda: queue.cancel(handle.id),
        "get_job": lambda: queue.get_job(handle.id),
        "stats": queue.stats,
        "sweep_expired": queue.sweep_expired,
        "pause": queue.pause,
        "resume": queue.resume,
        "is_paused": queue.is_paused,
        "dead_jobs": queue.dead_jobs,
        "requeue": lambda: queue.requeue(dead_id),
        "purge_dead": queue.purge_dead,
        "queue_names": store.queue_names,
        "schedule": lambda: store.schedule("s", "@daily", "q", "S"),
        "schedules": store.schedules,
        "unschedule": lambda: store.unschedule("s"),
        "listen": lambda: store.listen("q").close(),
        "migrate": store.migrate,
        "maintenance turn": lambda: store._maintenance_turn("t", 1.0).__enter__(),
    }


def _populated(db_url: str, clock: ManualClock) -> tuple[SqliteStore, JobHandle, int]:
    """A store with 30 pending jobs, one claim held and one dead job."""
    store = alkstore.open(db_url, clock=clock)
    assert isinstance(store, SqliteStore)
    queue = store.queue("q")
    queue.enqueue_many(list(range(30)))
    dead = store.queue("q")
    dead_id = dead.enqueue("dies", priority=9)
    dying = dead.claim_one("w")
    assert dying is not None
    assert dying.id == dead_id
    assert dying.fail("boom")
    handle = queue.claim_one("w")
    assert handle is not None
    return store, handle, dead_id


@pytest.mark.parametrize("kind", sorted(_CHANGES))
def test_every_operation_refuses_for_good_once_the_file_is_gone(
    db_path: Path,
    clock: ManualClock,
    errors_logged: Callable[[], list[str]],
    kind: str,
) -> None:
    change, said = _CHANGES[kind]
    db_url = f"sqlite:///{db_path}"
    store, handle, dead_id = _populated(db_url, clock)
    guard = store._pool.guard
    monotonic = _Monotonic()
    guard._monotonic = monotonic
    guard.check_now()  # restart the interval on the test's clock
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("BEGIN")
    try:
        change(db_path)
        # Within the interval the store may not have looked yet ...
        store.queue("q").stats()
        assert errors_logged() == []
        # ... once it passed, every operation refuses, and keeps refusing.
        monotonic.now += _identity.CHECK_INTERVAL_S
        operations = _operations(store, handle, dead_id, conn)
        for _ in range(2):
            for name, operation in operations.items():
                with pytest.raises(EngineError) as caught:
                    operation()
                assert caught.value.permanent, name
                assert said in str(caught.value), name
                assert str(db_path) in str(caught.value), name
                assert "open a new one" in str(caught.value), name
    finally:
        conn.close()
        store.close()  # never raises
    (line,) = errors_logged()
    assert said in line
    assert str(db_path) in line
    assert "30 live and 1 dead job(s)" in line


@pytest.mark.parametrize("kind", sorted(set(_CHANGES) - {"directory renamed"}))
def test_a_copy_of_what_the_vanished_files_held_is_saved(
    db_path: Path, clock: ManualClock, errors_logged: Callable[[], list[str]], kind: str
) -> None:
    change, _ = _CHANGES[kind]
    db_url = f"sqlite:///{db_path}"
    store, handle, _ = _populated(db_url, clock)
    try:
        change(db_path)
        with pytest.raises(EngineError):
            store._pool.guard.check_now()
    finally:
        store.close()
    (rescue,) = db_path.parent.glob("q.db-alkstore-rescue-*.db")
    (line,) = errors_logged()
    assert str(rescue) in line
    with alkstore.open(f"sqlite:///{rescue}", clock=clock, migrate=False) as saved:
        stats = saved.queue("q").stats()
        assert (stats.pending, stats.processing, stats.dead) == (29, 1, 1)
        job = saved.queue("q").get_job(handle.id)
        assert job is not None
        assert job.state == "processing"


def test_the_stale_wal_is_removed_from_beside_a_replacement(
    db_path: Path, clock: ManualClock, errors_logged: Callable[[], list[str]]
) -> None:
    """A database renamed onto the path while the store runs leaves the
    store's -wal and -shm at the path, which SQLite would replay into it."""
    db_url = f"sqlite:///{db_path}"
    store, _, _ = _populated(db_url, clock)
    wal = Path(f"{db_path}-wal")
    assert wal.stat().st_size > 0  # commits not checkpointed yet
    try:
        _replace_with_another_database(db_path)
        assert wal.exists()
        with pytest.raises(EngineError):
            store._pool.guard.check_now()
        assert not wal.exists()
        assert not Path(f"{db_path}-shm").exists()
    finally:
        store.close()
    with alkstore.open(db_url) as restored:
        handle = restored.queue("q").claim_one("w")
        assert handle is not None
        assert handle.payload == "from the other file"
        assert restored.queue("q").stats().pending == 0
    assert "was removed so that SQLite does not apply it" in errors_logged()[0]


def test_closing_after_a_deleted_wal_keeps_what_others_committed(
    db_path: Path, errors_logged: Callable[[], list[str]]
) -> None:
    """SQLite's last close would checkpoint the deleted WAL into the file
    and remove the -wal other processes made since, with their commits."""
    db_url = f"sqlite:///{db_path}"
    store = alkstore.open(db_url)
    store.queue("q").enqueue_many([f"before {i}" for i in range(5)])
    _remove_wal_and_shm(db_path)
    sqlite_children.run_children(sqlite_children.enqueue_one, [(db_url, "q", "after")])
    with pytest.raises(EngineError):
        store._pool.guard.check_now()
    store.close()
    (payloads,) = sqlite_children.run_children(sqlite_children.pending_payloads, [(db_url, "q")])
    assert payloads == ["after"]  # the other side; this store's is in the copy
    assert "keeps a shared lock on the database until it exits" in errors_logged()[0]
    (rescue,) = db_path.parent.glob("q.db-alkstore-rescue-*.db")
    (saved,) = sqlite_children.run_children(
        sqlite_children.pending_payloads, [(f"sqlite:///{rescue}", "q")]
    )
    assert saved == [f"before {i}" for i in range(5)]


def test_a_connection_made_after_the_replacement_refuses_at_once(
    db_path: Path, clock: ManualClock
) -> None:
    """Before the interval passed, the idle connections are still on the
    opened file; a new one would open the new file, where ids start again:
    it refuses whatever the interval."""
    db_url = f"sqlite:///{db_path}"
    store, handle, _ = _populated(db_url, clock)
    store._pool.guard._monotonic = _Monotonic()  # the interval never passes
    try:
        _replace_with_another_database(db_path)
        pool = store._pool
        with pool._lock:
            idle, pool._idle = pool._idle, []
        for conn in idle:
            conn.close()
        # Job 1 of the new file has attempts 0; the stale handle's id is 1's
        # neighbour in the old one. Neither may reach the new file.
        with pytest.raises(EngineError) as caught:
            handle.ack()
        assert caught.value.permanent
    finally:
        store.close()
    with alkstore.open(db_url) as restored:
        assert restored.queue("q").stats().pending == 1


def test_operations_refuse_within_the_interval_in_real_time(
    db_path: Path, errors_logged: Callable[[], list[str]]
) -> None:
    with alkstore.open(f"sqlite:///{db_path}") as store:
        queue = store.queue("q")
        queue.enqueue_many(list(range(5)))
        _remove_all(db_path)
        removed = time.monotonic()
        refused: EngineError | None = None
        while refused is None and time.monotonic() - removed < _BOUND_S * 2:
            try:
                queue.stats()
            except EngineError as error:
                refused = error
        took = time.monotonic() - removed
        assert refused is not None
        assert refused.permanent
        assert took < _BOUND_S
    assert len(errors_logged()) == 1


@pytest.mark.parametrize("inotify", [True, False])
@pytest.mark.parametrize("kind", ["deleted", "replaced", "-wal and -shm deleted"])
def test_a_blocked_wait_raises_within_the_bound(
    db_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    errors_logged: Callable[[], list[str]],
    kind: str,
    inotify: bool,
) -> None:
    if not inotify:
        monkeypatch.setattr(_wake, "watch_file", lambda path, companions=(): None)
    change, said = _CHANGES[kind]
    with alkstore.open(f"sqlite:///{db_path}") as store, store.listen("q") as sub:
        store.queue("q").enqueue("J")
        assert sub.wait(5)
        waiting, outcome = threading.Event(), []

        def wait() -> None:
            # As a consumer does: a wake (spurious ones are allowed) and
            # back to waiting, until the wait raises.
            waiting.set()
            try:
                while sub.wait(60):
                    pass
            except EngineError as error:
                outcome.append(error)

        waiter = threading.Thread(target=wait)
        waiter.start()
        assert waiting.wait(5)
        change(db_path)
        changed = time.monotonic()
        waiter.join(60)
        took = time.monotonic() - changed
        assert not waiter.is_alive()
        (error,) = outcome
        assert isinstance(error, EngineError), error
        assert error.permanent
        assert said in str(error)
        assert took < _BOUND_S
        with pytest.raises(EngineError):
            sub.wait(0)
    assert len(errors_logged()) == 1


def test_a_store_on_the_new_file_gets_its_own_watcher(db_path: Path) -> None:
    """A store opened on the file that replaced another is woken by commits
    to it, not served by the old file's watcher."""
    db_url = f"sqlite:///{db_path}"
    with alkstore.open(db_url) as old, old.listen("q") as old_sub:
        _replace_with_another_database(db_path)
        with alkstore.open(db_url) as new, new.listen("q") as new_sub:
            assert len(_wake._registry.watches) == 2
            conn = sqlite3.connect(db_path, isolation_level=None)
            try:
                conn.execute("BEGIN")
                new.queue("q").enqueue_tx(conn, "elsewhere")
                conn.execute("COMMIT")
            finally:
                conn.close()
            assert new_sub.wait(5)
            handle = new.queue("q").claim_one("w")
            assert handle is not None
            assert handle.payload == "from the other file"
        with pytest.raises(EngineError):
            old_sub.wait(5)


def test_a_store_in_another_process_notices(db_path: Path, tmp_path: Path) -> None:
    """Opened in another process before the file was replaced here."""
    ready, changed = sqlite_children.event(), sqlite_children.event()
    report = tmp_path / "report.txt"
    child = sqlite_children.start_child(
        sqlite_children.drain_until_refused,
        (f"sqlite:///{db_path}", ready, changed, str(report)),
    )
    try:
        assert ready.wait(sqlite_children.CHILD_TIMEOUT_S)
        _replace_with_another_database(db_path)
        changed.set()
    finally:
        changed.set()
        child.join(sqlite_children.CHILD_TIMEOUT_S)
    assert child.exitcode == 0
    permanent, message = report.read_text().split("\n", 1)
    assert permanent == "True"
    assert "was replaced by another file" in message


def test_the_guard_compares_at_most_once_per_interval(db_path: Path) -> None:
    with alkstore.open(f"sqlite:///{db_path}") as store:
        guard = store._pool.guard
        monotonic = _Monotonic()
        guard._monotonic = monotonic
        guard.check_now()
        _remove_all(db_path)
        monotonic.now += _identity.CHECK_INTERVAL_S / 2
        guard.check()  # not due: no stat, no error
        assert guard.failure is None
        monotonic.now += _identity.CHECK_INTERVAL_S
        with pytest.raises(EngineError):
            guard.check()
        assert guard.failure is not None


def test_nothing_changes_for_a_file_left_alone(db_path: Path, tmp_path: Path) -> None:
    """Other processes opening and closing the file, checkpoints and a
    symlinked path are no change."""
    link = tmp_path / "link.db"
    with alkstore.open(f"sqlite:///{db_path}") as store:
        link.symlink_to(db_path)
        with alkstore.open(f"sqlite:///{link}") as linked:
            sqlite_children.run_children(
                sqlite_children.churn, [(f"sqlite:///{db_path}", "other", 50)]
            )
            conn = sqlite3.connect(db_path, isolation_level=None)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
            for guarded in (store, linked):
                guarded._pool.guard.check_now()
                guarded.queue("churn").stats()


def test_reopening_a_closed_store_s_file_is_no_change(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A closed store's last connection lets SQLite remove the -wal and
    -shm files; opening the path again in the same process, while the
    closed store object is still alive, must not report them replaced
    (it logged a false ERROR and saved a rescue copy)."""
    first = alkstore.open(f"sqlite:///{db_path}")
    first.queue("q").enqueue(1)
    first.close()
    assert not os.path.exists(f"{db_path}-wal")  # SQLite removed them on the last close
    with caplog.at_level(logging.WARNING, logger="alkstore.sqlite"):
        with alkstore.open(f"sqlite:///{db_path}") as second:
            assert second.queue("q").stats().pending == 1
            second._pool.guard.check_now()
        with alkstore.open(f"sqlite:///{db_path}") as third:
            assert third.queue("q").stats().pending == 1
    assert caplog.records == []
    assert first._pool.guard.failure is None
    assert list(db_path.parent.glob("*-alkstore-rescue-*")) == []
