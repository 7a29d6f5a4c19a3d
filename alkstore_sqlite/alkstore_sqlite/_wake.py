"""The change detector behind subscriptions (docs/contract.md §3 "Wake").

The job rows themselves are the change record: ids come from
``AUTOINCREMENT`` under SQLite's single write lock, so they grow in commit
order, and a job that is visible with an id above the last one looked at was
enqueued by a commit since. A rolled-back enqueue leaves no row and wakes
nobody. Nothing extra is written per enqueue. Two paths deliver the wake:

* in-process: after the store's own enqueue commits it calls :func:`notify`
  with the new job id, which wakes the subscriptions of this process at once;
* cross-process (and ``enqueue_tx``, whose commit alkstore does not see): one
  watcher thread per database file per process, shared by every
  subscription on that file, reads ``PRAGMA data_version`` on a dedicated
  connection (it changes whenever another connection commits) and, when it
  moved, groups the jobs above its last id by queue. It reads when the
  ``-wal`` file is written (Linux inotify, :mod:`alkstore_sqlite._inotify`)
  and then every ``poll_interval_s`` for a short while, because the write
  event comes a moment before the commit becomes visible; with no writes it
  sleeps, looking only every quarter second as a safety net. Without
  inotify it polls: every ``poll_interval_s`` while commits keep coming,
  backing off (doubling the pause up to 50 ms) once the file has been quiet
  for a moment, so an idle poller costs little and the first wake after a
  quiet spell arrives within one backed-off pause.

Two operations make work claimable without a new job id: ``resume`` (no
row at all) and ``requeue`` (the job keeps its old id, below what the
watcher has looked at). Each replaces its queue's row in
``_alkstore_wakes`` in its own transaction (:func:`record_wake`); that
table's ``AUTOINCREMENT`` ids grow in commit order too, so the watcher
follows it exactly as it follows the jobs, with one more rowid range read
per change it sees, and :func:`notify_wake` is their in-process signal.
The table holds one row per queue ever resumed or requeued into; enqueues
never write it.

A queue's subscriptions are woken when a job id (or wake id) above the
highest one already delivered for it shows up, so the commit that
:func:`notify` (or :func:`notify_wake`) reported is not delivered a second
time by the watcher. A job claimed and finished before the watcher looked
wakes nobody, which is harmless: there is nothing left to claim. If the
watcher's connection fails it wakes everyone (a wake may have been missed),
reconnects and goes on.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time

from alkstore.engine import WakeLatch
from alkstore_sqlite._connection import close_connection, close_inherited, connect
from alkstore_sqlite._identity import CHECK_INTERVAL_S, FileIdentity
from alkstore_sqlite._inotify import FileEvents, watch_file

__all__ = [
    "LATEST_ID",
    "LATEST_IDS",
    "FileWatch",
    "WatchKey",
    "notify",
    "notify_wake",
    "record_wake",
    "subscribe",
    "unsubscribe",
]

log = logging.getLogger("alkstore.sqlite")

# Pause after the watcher's connection failed before it reconnects (seconds).
_RECONNECT_PAUSE_S = 0.1
# With inotify: how long to keep polling after a write event (seconds) ...
_ACTIVE_WINDOW_S = 0.02
# ... and how often to look without any event, in case one was missed.
_SAFETY_POLL_S = 0.25
# Without inotify: the longest pause between two looks once the file has
# been quiet for _ACTIVE_WINDOW_S (seconds); the pause doubles up to it.
_IDLE_POLL_MAX_S = 0.05

#: The largest job id ever committed (0 before the first): a subscription's
#: starting point.
LATEST_ID = "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = '_alkstore_jobs'), 0)"
#: The largest job id and the largest wake id ever committed, in one
#: snapshot: a subscription's starting points.
LATEST_IDS = """
    SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = '_alkstore_jobs'), 0),
           coalesce((SELECT seq FROM sqlite_sequence WHERE name = '_alkstore_wakes'), 0)
"""
# A rowid range: costs the jobs enqueued since the last look, whatever waits.
_NEW_JOBS = "SELECT queue, max(id) FROM _alkstore_jobs WHERE id > ? GROUP BY queue"
# The same for the wake record, which has at most one row per queue.
_NEW_WAKES = "SELECT queue, id FROM _alkstore_wakes WHERE id > ?"
# Deletes the queue's row and inserts one with the next id.
_RECORD_WAKE = "INSERT OR REPLACE INTO _alkstore_wakes (queue) VALUES (?)"

#: What a watch serves: the database file's real path and its (device,
#: inode) when the store opened it.
WatchKey = tuple[str, tuple[int, int] | None]


def record_wake(conn: sqlite3.Connection, queue: str) -> int:
    """Record a wake of ``queue`` for the watchers of every process, inside
    the caller's write transaction; return the wake id to pass to
    :func:`notify_wake` once the transaction committed."""
    wake_id = conn.execute(_RECORD_WAKE, (queue,)).lastrowid
    assert wake_id is not None
    return wake_id


class FileWatch:
    """The subscriptions of this process on one database file, and the
    watcher thread that serves them.

    Parameters
    ----------
    key
        The database file's real path and identity (the registry's key).
    opened
        The files as the store that started the watch opened them.
    poll_interval_s
        Seconds between two polls of ``PRAGMA data_version``.
    busy_timeout_s
        The watcher connection's busy timeout, seconds.

    Attributes
    ----------
    vanished
        Set (for good) once the watcher saw the files at the path differ
        from ``opened``; subscriptions then ask their store's guard at every
        wait.
    """

    def __init__(
        self, key: WatchKey, opened: FileIdentity, poll_interval_s: float, busy_timeout_s: float
    ) -> None:
        self.path = key[0]
        self.opened = opened
        self.vanished = False
        self._next_identity_check = 0.0
        self.poll_interval_s = poll_interval_s
        self.busy_timeout_s = busy_timeout_s
        self.lock = threading.Lock()
        # Held while the watcher thread is inside SQLite, and by fork() (see
        # _before_fork): a child must not inherit a SQLite mutex held by a
        # thread it does not have, or its first connect hangs (D15).
        self.sqlite_lock = threading.Lock()
        # The watcher thread's connection, under sqlite_lock.
        self.conn: sqlite3.Connection | None = None
        self.latches: dict[str, set[WakeLatch]] = {}
        # The highest job id delivered per subscribed queue.
        self.seen: dict[str, int] = {}
        # The highest wake id delivered per subscribed queue.
        self.wakes_seen: dict[str, int] = {}
        # The watcher has looked at every job (wake) up to this id.
        self.looked_up_to: int | None = None
        self.wakes_looked_up_to: int | None = None
        # Set when a looked_up_to moved back: look even if nothing committed.
        self._rescan = False
        self._stopping = False
        self._events: FileEvents | None = None
        # Without inotify: ends the polling pause early (stop, new subscriber).
        self._interrupt = threading.Event()
        # Without inotify: the current pause between two looks (seconds).
        self.pause_s = poll_interval_s
        self._thread = threading.Thread(
            target=self._run, name=f"alkstore-sqlite-watch {self.path}", daemon=True
        )

    # -- bookkeeping, under the registry lock --------------------------------

    def add(self, queue: str, latch: WakeLatch, latest_id: int, latest_wake_id: int) -> None:
        with self.lock:
            if queue not in self.seen:
                self.seen[queue] = latest_id
                self.wakes_seen[queue] = latest_wake_id
            self.latches.setdefault(queue, set()).add(latch)
            # Look again from here: jobs (wakes) the watcher passed over
            # before this queue was subscribed may be news for it.
            rescan = False
            if self.looked_up_to is None or latest_id < self.looked_up_to:
                self.looked_up_to = latest_id
                rescan = True
            if self.wakes_looked_up_to is None or latest_wake_id < self.wakes_looked_up_to:
                self.wakes_looked_up_to = latest_wake_id
                rescan = True
            if rescan:
                self._rescan = True
                self._wake_thread()

    def remove(self, queue: str, latch: WakeLatch) -> bool:
        """Drop a latch; return whether no subscription is left."""
        with self.lock:
            latches = self.latches.get(queue)
            if latches is not None:
                latches.discard(latch)
                if not latches:
                    del self.latches[queue]
                    del self.seen[queue]
                    del self.wakes_seen[queue]
            return not self.latches

    def deliver(self, queue: str, job_id: int) -> None:
        """Wake ``queue``'s subscriptions if ``job_id`` is news."""
        self._deliver(self.seen, queue, job_id)

    def deliver_wake(self, queue: str, wake_id: int) -> None:
        """Wake ``queue``'s subscriptions if ``wake_id`` is news."""
        self._deliver(self.wakes_seen, queue, wake_id)

    def _deliver(self, seen_ids: dict[str, int], queue: str, new_id: int) -> None:
        with self.lock:
            seen = seen_ids.get(queue)
            if seen is None or new_id <= seen:
                return
            seen_ids[queue] = new_id
            latches = list(self.latches[queue])
        for latch in latches:
            latch.set()

    def wake_all(self) -> None:
        with self.lock:
            latches = [latch for group in self.latches.values() for latch in group]
        for latch in latches:
            latch.set()

    # -- the watcher thread --------------------------------------------------

    def start(self) -> None:
        # Watch before the first look, so no write between the two is missed.
        self._events = watch_file(self.path + "-wal", (self.path, self.path + "-shm"))
        self._thread.start()

    def _wake_thread(self) -> None:
        if self._events is not None:
            self._events.interrupt()
        self._interrupt.set()

    def stop(self) -> None:
        """Ask the thread to end and wait for it (it closes its connection)."""
        self._stopping = True
        self._wake_thread()
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join()
            # Only now: closing while the thread waits could let it read a
            # reused descriptor number.
            if self._events is not None:
                self._events.close()

    def _pause(self, active_until: float, changed: bool) -> float:
        """Wait for the next look; return the new end of the active window.

        ``changed``: whether the last look found a commit.
        """
        events = self._events
        if events is None:
            now = time.monotonic()
            if changed:
                active_until = now + _ACTIVE_WINDOW_S
            if now < active_until:
                self.pause_s = self.poll_interval_s
            else:
                ceiling = max(self.poll_interval_s, _IDLE_POLL_MAX_S)
                self.pause_s = min(self.pause_s * 2, ceiling)
            self._interrupt.wait(self.pause_s)
            self._interrupt.clear()
            return active_until
        quiet = time.monotonic() >= active_until
        if events.wait(_SAFETY_POLL_S if quiet else self.poll_interval_s):
            return time.monotonic() + _ACTIVE_WINDOW_S
        return active_until

    def _run(self) -> None:
        last_version: int | None = None
        active_until = 0.0
        try:
            while not self._stopping:
                self._compare_files()
                changed = False
                try:
                    with self.sqlite_lock:
                        if self.conn is None and not self.vanished:
                            self.conn = self._connect_opened()
                            last_version = None
                        if self.conn is not None:
                            version = self.conn.execute("PRAGMA data_version").fetchone()[0]
                            changed = version != last_version
                            if changed or self._rescan:
                                last_version = version
                                self._scan(self.conn)
                except sqlite3.Error:
                    log.warning(
                        "alkstore-sqlite watcher on %s failed; reconnecting",
                        self.path,
                        exc_info=True,
                    )
                    self._close_conn()
                    self.wake_all()
                    time.sleep(_RECONNECT_PAUSE_S)
                    continue
                active_until = self._pause(active_until, changed)
        finally:
            self._close_conn()

    def _connect_opened(self) -> sqlite3.Connection | None:
        """A connection to the opened file; ``None`` (and the watch marked
        vanished) if the path names another one now, checked before the
        connection reads anything (see ``ConnectionPool._acquire``). Under
        sqlite_lock."""

        def check() -> None:
            if FileIdentity.of(self.path).db != self.opened.db:
                raise _Vanished

        try:
            return connect(self.path, self.busy_timeout_s, before_first_read=check)
        except _Vanished:
            self.vanished = True
            self.wake_all()
            return None

    def _compare_files(self) -> None:
        """Compare the files at the path with the opened ones, if due or if
        inotify saw one move; wake everyone at the first change."""
        moved = self._events is not None and self._events.take_moved()
        now = time.monotonic()
        if self.vanished or not (moved or now >= self._next_identity_check):
            return
        self._next_identity_check = now + CHECK_INTERVAL_S
        if FileIdentity.of(self.path).change_from(self.opened) is not None:
            self.vanished = True
            self.wake_all()

    def _close_conn(self) -> None:
        with self.sqlite_lock:
            conn, self.conn = self.conn, None
            if conn is not None:
                close_connection(conn, self.path)

    def after_fork_in_child(self) -> None:
        """Close what the watcher held; its thread did not survive fork().
        The connection is closed before the child opens any of its own (see
        ``ConnectionPool._after_fork_in_child``); fork() took sqlite_lock,
        so the thread was outside SQLite."""
        if self.conn is not None:
            close_inherited(self.conn)
            self.conn = None
        if self._events is not None:
            self._events.close()
            self._events = None

    def _scan(self, conn: sqlite3.Connection) -> None:
        with self.lock:
            start = self.looked_up_to
            wakes_start = self.wakes_looked_up_to
            self._rescan = False
        if start is None or wakes_start is None:
            return
        rows = conn.execute(_NEW_JOBS, (start,)).fetchall()
        wakes = conn.execute(_NEW_WAKES, (wakes_start,)).fetchall()
        for queue, job_id in rows:
            self.deliver(queue, job_id)
        for queue, wake_id in wakes:
            self.deliver_wake(queue, wake_id)
        with self.lock:
            # Unless add() moved them back meanwhile (and asked for a rescan).
            if self.looked_up_to == start:
                self.looked_up_to = max((job_id for _, job_id in rows), default=start)
            if self.wakes_looked_up_to == wakes_start:
                self.wakes_looked_up_to = max(
                    (wake_id for _, wake_id in wakes), default=wakes_start
                )


class _Vanished(Exception):
    """The path no longer names the watched file."""


class _Registry:
    """The watches of this process, by :data:`WatchKey`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.watches: dict[WatchKey, FileWatch] = {}


_registry = _Registry()


def subscribe(
    key: WatchKey,
    queue: str,
    latch: WakeLatch,
    latest_id: int,
    latest_wake_id: int,
    *,
    opened: FileIdentity,
    poll_interval_s: float,
    busy_timeout_s: float,
) -> FileWatch:
    """Register ``latch`` for wakes of ``queue`` on the file of ``key``;
    return the watch that serves it.

    Parameters
    ----------
    opened
        The files as the subscribing store opened them.
    latest_id, latest_wake_id
        :data:`LATEST_IDS` read before this call: jobs and wake records
        above them wake the latch.
    poll_interval_s, busy_timeout_s
        The watcher's settings if this starts it; a shorter poll interval
        also shortens a running watcher's.
    """
    with _registry.lock:
        watch = _registry.watches.get(key)
        started = watch is None
        if watch is None:
            watch = FileWatch(key, opened, poll_interval_s, busy_timeout_s)
            _registry.watches[key] = watch
        watch.poll_interval_s = min(watch.poll_interval_s, poll_interval_s)
        watch.add(queue, latch, latest_id, latest_wake_id)
        if started:
            watch.start()
        return watch


def unsubscribe(key: WatchKey, queue: str, latch: WakeLatch) -> None:
    """Drop ``latch``; the last one on a file stops its watcher."""
    with _registry.lock:
        watch = _registry.watches.get(key)
        if watch is None or not watch.remove(queue, latch):
            return
        del _registry.watches[key]
    watch.stop()


def notify(key: WatchKey, queue: str, job_id: int) -> None:
    """Wake this process's subscriptions of ``queue`` after an enqueue whose
    last job is ``job_id`` committed."""
    watch = _registry.watches.get(key)
    if watch is not None:
        watch.deliver(queue, job_id)


def notify_wake(key: WatchKey, queue: str, wake_id: int) -> None:
    """Wake this process's subscriptions of ``queue`` after a transaction
    that :func:`record_wake` returned ``wake_id`` in committed."""
    watch = _registry.watches.get(key)
    if watch is not None:
        watch.deliver_wake(queue, wake_id)


def _before_fork() -> None:
    _registry.lock.acquire()
    for watch in _registry.watches.values():
        watch.sqlite_lock.acquire()


def _after_fork_in_parent() -> None:
    for watch in _registry.watches.values():
        watch.sqlite_lock.release()
    _registry.lock.release()


def _after_fork_in_child() -> None:
    # The watcher threads did not survive fork(): close what they held and
    # start from an empty registry (the child's own subscriptions start
    # their own watchers).
    for watch in _registry.watches.values():
        watch.after_fork_in_child()
    _registry.reset()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
