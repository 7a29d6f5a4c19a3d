"""The SQLite :class:`~alkstore.Subscription` (docs/contract.md §3 "Wake")."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from alkstore import Subscription
from alkstore.engine import WakeLatch
from alkstore_sqlite import _wake

if TYPE_CHECKING:
    from alkstore_sqlite._store import SqliteStore

__all__ = ["SqliteSubscription"]


class SqliteSubscription(Subscription):
    """Wakes for one queue of a :class:`~alkstore_sqlite.SqliteStore`.

    Enqueues, resumes and requeues by this process's stores wake it at
    once; commits by other processes and ``enqueue_tx`` commits wake it
    within about one poll interval of the store's file watcher
    (``poll_interval_s``). If the store's database file is deleted or
    replaced, :meth:`wait` raises ``EngineError(permanent=True)`` within a
    quarter of a second, however long its timeout.
    """

    _store: SqliteStore

    def __init__(self, store: SqliteStore, queue_name: str) -> None:
        super().__init__(store, queue_name)
        self._latch = WakeLatch()
        # Jobs (and resumes and requeues) committed after this read wake
        # the subscription.
        latest_id, latest_wake_id = store._pool.run(_read_latest_ids)
        self._watch = _wake.subscribe(
            store._wake_key,
            queue_name,
            self._latch,
            latest_id,
            latest_wake_id,
            opened=store._opened,
            poll_interval_s=store._poll_interval_s,
            busy_timeout_s=store._busy_timeout_s,
        )

    def _wait(self, timeout_s: float) -> bool:
        woken = self._latch.wait(timeout_s)
        # A watcher that saw the store's files go woke everyone: the guard
        # then compares at once, and raises (docs/contract.md §2 "Errors").
        guard = self._store._pool.guard
        if self._watch.vanished:
            guard.check_now()
        else:
            guard.check()
        return woken

    def _close(self) -> None:
        _wake.unsubscribe(self._store._wake_key, self._queue_name, self._latch)
        self._store._forget_subscription(self)
        # Release a thread blocked in wait(); its next wait() raises.
        self._latch.set()


def _read_latest_ids(conn: sqlite3.Connection) -> tuple[int, int]:
    latest_id, latest_wake_id = conn.execute(_wake.LATEST_IDS).fetchone()
    return int(latest_id), int(latest_wake_id)
