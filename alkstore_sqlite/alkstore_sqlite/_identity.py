"""Noticing that a store's path no longer names the database it opened.

A SQLite connection keeps working on the file it opened when that file is
deleted, replaced (a restore from a backup, a new database made at the same
path) or renamed away, its directory included: the store would go on
claiming from a file nobody else sees while new work piles up in the one
at the path, and a connection the store opened later would be on the new
file, where ids start again and a stale handle's ack could hit another
job. Deleting the ``-wal`` or ``-shm`` file while the database stays is
worse: commits not yet checkpointed then live only in this process's open
descriptors, and other processes start from the file without them.

Files are told apart by (device, inode). A :class:`FileGuard` records the
three files' identities once the store is open, compares them with what
the path names at most every :data:`CHECK_INTERVAL_S` (one ``stat`` per
file; the store's operations ask, and its file watcher wakes the waiting
subscriptions when it sees a change), and the first change it sees is
final: every later operation of the store raises
``EngineError(permanent=True)``, and it logs one ERROR naming the path and
what happened. Before that it saves a copy of the database as the store
sees it beside the path (:func:`rescue_path`), so that no commit is lost
with the files (the deleted file's unrun jobs, commits since the backup a
restore went back to, commits only a deleted ``-wal`` held). Then, if the
database at the path is another one (or none) but the ``-wal`` and
``-shm`` files there are still the opened ones, it removes them: SQLite
would replay that WAL into the new database and corrupt it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from alkstore.errors import EngineError
from alkstore_sqlite._locks import pin_shared

__all__ = ["CHECK_INTERVAL_S", "FileGuard", "FileIdentity", "rescue_path", "settle"]

log = logging.getLogger("alkstore.sqlite")

#: The longest time between two comparisons of the path with the files a
#: store opened, while the store is used (seconds).
CHECK_INTERVAL_S = 0.1

_Id = tuple[int, int]


def _identity(path: str) -> _Id | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    return found.st_dev, found.st_ino


@dataclass(frozen=True)
class FileIdentity:
    """The (device, inode) of a database file and of its ``-wal`` and
    ``-shm`` files; ``None`` for one that does not exist."""

    db: _Id | None
    wal: _Id | None
    shm: _Id | None

    @classmethod
    def of(cls, path: str) -> FileIdentity:
        """What ``path`` (and ``path-wal``, ``path-shm``) name now."""
        return cls(_identity(path), _identity(path + "-wal"), _identity(path + "-shm"))

    def change_from(self, opened: FileIdentity) -> str | None:
        """What happened since ``opened`` was taken, for a message, or
        ``None`` if every file that existed then is still at its path.

        Only the files that existed in ``opened`` count: SQLite creates the
        ``-wal`` and ``-shm`` files with the first connection in WAL mode
        and removes them only with the last, which the store keeps open.
        """
        if self.db is None:
            return (
                "was deleted or moved away (or its directory was renamed) while this "
                "store had it open"
            )
        if self.db != opened.db:
            return (
                "was replaced by another file (a restore from a backup, or a new "
                "database made at the same path) while this store had the old one open"
            )
        gone = [
            suffix
            for suffix, now, then in (
                ("-wal", self.wal, opened.wal),
                ("-shm", self.shm, opened.shm),
            )
            if then is not None and now != then
        ]
        if gone:
            files = f"{gone[0]} file was" if len(gone) == 1 else "-wal and -shm files were"
            return (
                f"is still there, but its {files} deleted or replaced "
                "while this store had it open: commits not yet checkpointed into the "
                "database file are in this store's view only, and other processes "
                "no longer see the same database"
            )
        return None


def rescue_path(path: str, now: datetime | None = None) -> str:
    """Where a rescue copy of the database ``path`` goes: beside it, named
    ``<database>-alkstore-rescue-<UTC time>-<pid>.db``."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{path}-alkstore-rescue-{stamp}-{os.getpid()}.db"


class FileGuard:
    """Whether the path of a store still names the files it opened.

    Parameters
    ----------
    path
        The database file, as the store names it.
    interval_s
        Seconds between two comparisons in :meth:`check`.
    monotonic
        The clock of ``interval_s``.
    """

    def __init__(
        self,
        path: str,
        *,
        interval_s: float = CHECK_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.real_path = os.path.realpath(path)
        self.interval_s = interval_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # None until armed: a store that is still opening has no files yet.
        self.opened: FileIdentity | None = None
        # A connection that read the files, kept open so that SQLite never
        # removes the -wal and -shm files under the store (it does when the
        # last connection closes) and to read what a vanished file still
        # held; None before arming and in a forked child.
        self._witness: sqlite3.Connection | None = None
        self._next_check = 0.0
        self._failure: str | None = None

    @property
    def failure(self) -> str | None:
        """The message of the change seen, or ``None``."""
        return self._failure

    def arm(self, witness: sqlite3.Connection) -> None:
        """Record the files' identities, once ``witness`` (a connection that
        has read the database) holds them open."""
        with self._lock:
            self._witness = witness
            self.opened = FileIdentity.of(self.path)
            self._next_check = self._monotonic() + self.interval_s
        with _armed.lock:
            _armed.guards.add(self)

    def disarm(self) -> sqlite3.Connection | None:
        """Stop comparing, as the store closes; hand over the witness
        connection for closing. Once the store's last connection closes,
        SQLite removes the ``-wal`` and ``-shm`` files: that is no change
        to report, including by :func:`settle` when this process opens the
        path again while the closed store object is still alive."""
        with self._lock:
            witness, self._witness = self._witness, None
            self.opened = None
        with _armed.lock:
            _armed.guards.discard(self)
        return witness

    def after_fork_in_child(self) -> sqlite3.Connection | None:
        """Start over in a forked child; return the inherited witness
        connection, to close without using it.

        The child forgets the ``-wal`` and ``-shm`` files: it holds no
        connection that keeps them (the parent closing its store may remove
        them, rightly). The database file itself is still compared.
        """
        self._lock = threading.Lock()
        witness, self._witness = self._witness, None
        if self.opened is not None:
            self.opened = FileIdentity(self.opened.db, None, None)
        return witness

    def check(self) -> None:
        """Compare if :attr:`interval_s` passed since the last comparison;
        raise if the files are not (or no longer) the ones opened. The hot
        path: a clock read when nothing is due.

        Raises
        ------
        EngineError
            ``permanent=True``, once a change was seen.
        """
        if self._failure is not None:
            raise self._error()
        if self.opened is not None and self._monotonic() >= self._next_check:
            self.check_now()

    def check_now(self) -> None:
        """Compare now; raise as :meth:`check`."""
        with self._lock:
            opened = self.opened
            if self._failure is None and opened is not None:
                self._next_check = self._monotonic() + self.interval_s
                change = FileIdentity.of(self.path).change_from(opened)
                if change is not None:
                    self._fail(change, opened)
        if self._failure is not None:
            raise self._error()

    def _error(self) -> EngineError:
        return EngineError(str(self._failure), permanent=True)

    def _fail(self, change: str, opened: FileIdentity) -> None:
        """Record the change (under the lock) and say so once, loudly."""
        self._failure = (
            f"the SQLite database {self.path!r} {change}. This store no longer works "
            "on it: close it and open a new one on the path (a worker exits so that "
            "its supervisor starts it again)"
        )
        log.error("alkstore: %s.%s", self._failure, self._save(opened))

    def _save(self, opened: FileIdentity) -> str:
        """Save a copy of what the opened files hold beside the path, then
        remove their ``-wal`` and ``-shm`` files if they are still at the
        path beside another database (or none), which SQLite would replay
        into it; return what was done, for the log."""
        witness = self._witness
        if witness is None:
            return ""  # a forked child: the parent holds the files
        try:
            live, dead = witness.execute(
                "SELECT (SELECT count(*) FROM _alkstore_jobs), "
                "(SELECT count(*) FROM _alkstore_dead)"
            ).fetchone()
        except sqlite3.Error as error:
            return f" What the opened files hold could not be read: {error}."
        text = f" The files this store opened hold {live} live and {dead} dead job(s)."
        if not os.path.isdir(os.path.dirname(self.path)):
            return text + " Their directory is no longer at its path; they moved with it."
        target = rescue_path(self.path)
        try:
            copy = sqlite3.connect(target)
            try:
                witness.backup(copy)
            finally:
                copy.close()
        except (sqlite3.Error, OSError) as error:
            return text + f" Saving a copy of them to {target!r} failed: {error}."
        text += (
            f" A copy of the database as this store sees it, every commit included, "
            f"was saved to {target!r}."
        )
        # Only the -wal or -shm went? When this process's last connection to
        # the database closes, SQLite would checkpoint the deleted WAL into
        # the file and remove the -wal at the path, with what other
        # processes committed since: the pin stops it.
        if (
            opened.db is not None
            and _identity(self.path) == opened.db
            and pin_shared(self.path, opened.db)
        ):
            text += (
                " This process keeps a shared lock on the database until it exits, "
                "so that closing it does not write this store's view into the file "
                "over the commits other processes made since."
            )
        removed = []
        if _identity(self.path) != opened.db:
            for suffix, ours in (("-wal", opened.wal), ("-shm", opened.shm)):
                if ours is not None and _identity(self.path + suffix) == ours:
                    try:
                        os.remove(self.path + suffix)
                    except OSError:
                        continue
                    removed.append(suffix)
        if removed:
            text += (
                f" Its {' and '.join(removed)} file, still at the path, was removed so that "
                "SQLite does not apply it to the database now there."
            )
        return text + (
            " Stop every process that had the old database open before using the new one."
        )


class _Armed:
    """The armed guards of this process, for settle()."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.guards: weakref.WeakSet[FileGuard] = weakref.WeakSet()


_armed = _Armed()


def settle(path: str) -> None:
    """Before a store of this process opens ``path``: make every store of
    this process whose files were at that path compare now, so that one
    whose files went deals with what they left at the path (the ``-wal``
    and ``-shm`` files a new database there must never read) first."""
    real = os.path.realpath(path)
    with _armed.lock:
        guards = [guard for guard in _armed.guards if guard.real_path == real]
    for guard in guards:
        with contextlib.suppress(EngineError):
            guard.check_now()


def _after_fork_in_child() -> None:
    # The lock may have been held by a thread the child does not have; the
    # guards themselves start over in their pools' own fork handlers.
    guards = list(_armed.guards)
    _armed.reset()
    _armed.guards.update(guards)


os.register_at_fork(after_in_child=_after_fork_in_child)
