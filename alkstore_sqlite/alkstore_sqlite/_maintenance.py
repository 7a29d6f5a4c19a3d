"""Maintenance turns (``Store._maintenance_turn``): which process runs a
store-wide chore such as the expiry sweep, and when.

A turn is given to at most one caller at a time and at most once per
interval:

* the ``_alkstore_maintenance`` table keeps, per task, the instant its last
  turn was taken; a turn is due for a caller when that is at least the
  caller's own interval ago (so a sweeper with a long interval never holds
  back one with a short interval), and taking it sets it to ``now`` in one
  conditional upsert, which SQLite's write lock serialises, so two takers
  never both see it due;
* for the whole ``with`` block the taker holds an exclusive lock on a lock
  file beside the database, one per task (:func:`lock_path`), taken without
  waiting, so a turn that outlasts its interval still has no rival. SQLite
  itself has no lock that a process can hold for a while without blocking
  every writer; a file lock (``flock``: one per open file, so two stores or
  threads of one process exclude each other as two processes do) is
  dropped by the operating system when its holder dies, so a crashed
  holder never keeps the turn. Leaving the block unlocks, on an exception
  too.

The lock is asked for only when the turn looks due (one read of the task's
row first), so a process touches the lock file about once per interval. The
file is created at the first turn and left in place: removing a lock file
races with its next taker.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from alkstore.engine import duration_us
from alkstore.errors import EngineError
from alkstore_sqlite._connection import fetchone, rowcount
from alkstore_sqlite._rows import to_us

if TYPE_CHECKING:
    from alkstore_sqlite._store import SqliteStore

__all__ = ["lock_path", "maintenance_turn"]

# A task name used verbatim in the lock file's name; others are hashed.
_PLAIN_TASK = re.compile(r"[A-Za-z0-9_.-]{1,64}")

_READ = "SELECT last_run_at FROM _alkstore_maintenance WHERE task = ?"
# Counts a row only when the turn was due (or the task new).
_TAKE = """
    INSERT INTO _alkstore_maintenance (task, last_run_at) VALUES (:task, :now)
    ON CONFLICT (task) DO UPDATE SET last_run_at = excluded.last_run_at
    WHERE last_run_at <= :due_before
"""

if sys.platform == "win32":
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


def lock_path(database: str, task: str) -> str:
    """The lock file of ``task`` beside the database file ``database``."""
    if not _PLAIN_TASK.fullmatch(task):
        task = hashlib.blake2b(task.encode(), digest_size=8).hexdigest()
    return f"{database}-alkstore-{task}.lock"


def _acquire(path: str) -> int | None:
    """Lock ``path`` without waiting: the open descriptor, or ``None`` if
    someone holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise EngineError(f"cannot open the maintenance lock file {path!r}: {error}") from error
    try:
        if _try_lock(fd):
            return fd
    except OSError as error:
        os.close(fd)
        raise EngineError(f"cannot lock the maintenance lock file {path!r}: {error}") from error
    os.close(fd)
    return None


def _release(fd: int) -> None:
    try:
        _unlock(fd)
    finally:
        # Closing drops the lock in any case.
        os.close(fd)


@contextlib.contextmanager
def maintenance_turn(store: SqliteStore, task: str, interval_s: float) -> Iterator[bool]:
    """``Store._maintenance_turn`` (module docstring).

    Raises
    ------
    EngineError
        If the database or the lock file fails (before the block runs).
    """
    row = store._pool.run(fetchone, _READ, (task,))
    interval_us = duration_us(interval_s)
    if row is not None and row[0] > to_us(store._now()) - interval_us:
        yield False
        return
    fd = _acquire(lock_path(store.path, task))
    if fd is None:
        yield False
        return
    try:
        # Read after the lock: a holder that just finished has advanced the
        # row.
        now = to_us(store._now())
        params = {"task": task, "now": now, "due_before": now - interval_us}
        taken = store._pool.run(rowcount, _TAKE, params) == 1
    except BaseException:
        _release(fd)
        raise
    if not taken:
        _release(fd)
        yield False
        return
    try:
        yield True
    finally:
        _release(fd)
