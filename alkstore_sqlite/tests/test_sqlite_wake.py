"""Wakes: the in-process signal and the cross-process change detector (docs/contract.md
§3 "Wake")."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlite_children

from alkstore.engine import WakeLatch
from alkstore.errors import StoreClosedError
from alkstore_sqlite import SqliteStore, _inotify, _wake


def _enqueue_elsewhere(store: SqliteStore, queue: str, *, commit: bool = True) -> None:
    """Enqueue through another connection, as another process would: no
    in-process signal, only the commit for the watcher to find."""
    conn = sqlite3.connect(store.path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        store.queue(queue).enqueue_tx(conn, "elsewhere")
        conn.execute("COMMIT" if commit else "ROLLBACK")
    finally:
        conn.close()


def _write_elsewhere(store: SqliteStore) -> None:
    """Commit something that is not an enqueue."""
    conn = sqlite3.connect(store.path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS app (x)")
        conn.execute("INSERT INTO app VALUES (1)")
    finally:
        conn.close()


def _watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("alkstore-sqlite-watch")]


def test_own_enqueue_wakes_at_once_and_only_once(store: SqliteStore) -> None:
    queue = store.queue("q")
    with store.listen("q") as sub:
        assert not sub.wait(0)
        queue.enqueue(1)
        assert sub.wait(0)
        # The watcher sees the same commit later: it must not wake again.
        time.sleep(0.05)
        assert not sub.wait(0)
        queue.enqueue_many([1, 2, 3])
        queue.enqueue(4)
        assert sub.wait(0)
        assert not sub.wait(0.05)


def test_another_queue_does_not_wake(store: SqliteStore) -> None:
    with store.listen("a") as sub:
        store.queue("b").enqueue(1)
        assert not sub.wait(0.05)


def test_another_store_in_the_process_wakes(open_sqlite: Callable[..., SqliteStore]) -> None:
    listener, writer = open_sqlite(), open_sqlite()
    with listener.listen("q") as sub:
        writer.queue("q").enqueue(1)
        assert sub.wait(0)


def test_another_process_wakes_within_the_poll(db_url: str, store: SqliteStore) -> None:
    barrier = sqlite_children.barrier(2)
    with store.listen("q") as sub:
        woke: list[bool] = []

        def wait_for_wake() -> None:
            barrier.wait()
            woke.append(sub.wait(sqlite_children.CHILD_TIMEOUT_S))

        waiter = threading.Thread(target=wait_for_wake)
        waiter.start()
        (job_id,) = sqlite_children.run_children(
            sqlite_children.enqueue_after, [(db_url, barrier, "q", "hi")]
        )
        waiter.join()
    assert woke == [True]
    handle = store.queue("q").claim_one("w")
    assert handle is not None
    assert handle.id == job_id


def test_another_connections_commit_wakes(store: SqliteStore) -> None:
    with store.listen("q") as sub:
        _write_elsewhere(store)
        assert not sub.wait(0.05)  # a commit, but no job
        _enqueue_elsewhere(store, "other")
        assert not sub.wait(0.05)
        _enqueue_elsewhere(store, "q", commit=False)
        assert not sub.wait(0.05)
        _enqueue_elsewhere(store, "q")
        assert sub.wait(5)
        assert not sub.wait(0.05)
        _enqueue_elsewhere(store, "q")
        _enqueue_elsewhere(store, "q")
        assert sub.wait(5)


def test_a_late_subscription_gets_jobs_the_watcher_passed(store: SqliteStore) -> None:
    with store.listen("a"):
        (watch,) = _wake._registry.watches.values()
        before = watch.looked_up_to
        assert before is not None
        _enqueue_elsewhere(store, "b")
        # Let the watcher look past the new job while nobody listens to "b".
        for _ in range(5000):
            if watch.looked_up_to != before:
                break
            time.sleep(0.001)
        assert watch.looked_up_to == before + 1
        latch = WakeLatch()
        wakes = watch.wakes_looked_up_to
        assert wakes is not None
        _wake.subscribe(
            store._wake_key,
            "b",
            latch,
            before,
            wakes,
            opened=store._opened,
            poll_interval_s=0.001,
            busy_timeout_s=5,
        )
        try:
            assert latch.wait(5)
        finally:
            _wake.unsubscribe(store._wake_key, "b", latch)


def test_one_watcher_per_file_stopped_with_the_last_subscription(
    open_sqlite: Callable[..., SqliteStore], tmp_path: Path
) -> None:
    assert _watchers() == []
    first, second = open_sqlite(), open_sqlite()
    subs = [first.listen("a"), first.listen("b"), second.listen("a")]
    assert len(_watchers()) == 1
    other = SqliteStore(str(tmp_path / "other.db"))
    try:
        other_sub = other.listen("a")
        assert len(_watchers()) == 2
        other_sub.close()
        assert len(_watchers()) == 1
    finally:
        other.close()
    for sub in subs[:-1]:
        sub.close()
    assert len(_watchers()) == 1
    subs[-1].close()
    assert _watchers() == []
    assert _wake._registry.watches == {}


def test_store_close_closes_its_subscriptions(store: SqliteStore) -> None:
    sub = store.listen("q")
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(sub.wait(30))
        except StoreClosedError as error:
            outcome.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    store.close()
    waiter.join(10)
    assert not waiter.is_alive()
    # The blocked wait is released with the closed state (docs/contract.md §3 "Closed
    # store"), not a wake.
    assert [type(o) for o in outcome] == [StoreClosedError]
    assert _watchers() == []
    with pytest.raises(StoreClosedError):
        sub.wait(0)
    sub.close()
    sub.close()


def test_closed_subscription_raises_and_close_is_idempotent(store: SqliteStore) -> None:
    sub = store.listen("q")
    sub.close()
    sub.close()
    with pytest.raises(StoreClosedError):
        sub.wait(0)
    # The store's other subscriptions keep working.
    with store.listen("q") as again:
        store.queue("q").enqueue(1)
        assert again.wait(0)


def test_watcher_survives_a_failing_connection(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    with store.listen("q") as sub:
        (watch,) = _wake._registry.watches.values()
        calls = {"n": 0}
        real = watch._scan

        def flaky(conn: sqlite3.Connection) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise sqlite3.OperationalError("disk I/O error (injected)")
            real(conn)

        monkeypatch.setattr(watch, "_scan", flaky)
        monkeypatch.setattr(_wake, "_RECONNECT_PAUSE_S", 0.001)
        _enqueue_elsewhere(store, "x")
        # The failure wakes everyone (a wake may have been lost) ...
        assert sub.wait(5)
        # ... and the reconnected watcher still delivers.
        _enqueue_elsewhere(store, "q")
        assert sub.wait(5)
        assert calls["n"] >= 2


def test_without_inotify_the_watcher_polls(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_wake, "watch_file", lambda path, companions=(): None)
    with store.listen("q") as sub:
        (watch,) = _wake._registry.watches.values()
        assert watch._events is None
        _enqueue_elsewhere(store, "q")
        assert sub.wait(5)


def _until(condition: Callable[[], bool], timeout_s: float = 5) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_without_inotify_an_idle_watcher_backs_off(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_wake, "watch_file", lambda path, companions=(): None)
    with store.listen("q") as sub:
        (watch,) = _wake._registry.watches.values()
        # Quiet: the pause doubles up to the ceiling ...
        assert _until(lambda: watch.pause_s == _wake._IDLE_POLL_MAX_S)
        # ... a commit is still found, and the poller speeds up again.
        _enqueue_elsewhere(store, "q")
        assert sub.wait(5)
        assert _until(lambda: watch.pause_s == store._poll_interval_s)
        # Busy: each commit brings it back to its fastest. (Waited for, not
        # read at once: on a loaded host the poller may look only after
        # the active window has passed, and then it backs off rightly.)
        for _ in range(5):
            time.sleep(_wake._ACTIVE_WINDOW_S / 4)
            _write_elsewhere(store)
            assert _until(lambda: watch.pause_s == store._poll_interval_s)
        assert _until(lambda: watch.pause_s == _wake._IDLE_POLL_MAX_S)
        # Closing does not wait out a long pause.
        monkeypatch.setattr(_wake, "_IDLE_POLL_MAX_S", 60.0)
        assert _until(lambda: watch.pause_s > 1)
        began = time.monotonic()
    assert _watchers() == []
    assert time.monotonic() - began < 1


@pytest.mark.skipif(_inotify.watch_file(__file__) is None, reason="no inotify here")
def test_file_events(tmp_path: Path) -> None:
    target = tmp_path / "x.db-wal"
    events = _inotify.watch_file(str(target))
    assert events is not None
    try:
        assert not events.wait(0)
        (tmp_path / "other").write_bytes(b"1")
        assert not events.wait(0.01)
        target.write_bytes(b"1")  # created
        assert events.wait(5)
        with target.open("ab") as file:
            file.write(b"2")
        assert events.wait(5)
        assert not events.wait(0)
        events.interrupt()
        assert events.wait(5)
    finally:
        events.close()
