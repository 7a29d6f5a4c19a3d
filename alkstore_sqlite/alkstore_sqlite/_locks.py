"""Whether a lock SQLite needs on a file is held by this very process.

An operation that must wait for a lock held by another process waits its
busy timeout, and the other process lets go. A lock held by a connection of
this process may be held by the caller itself, for instance the
application's own transaction around ``enqueue_tx``, which will not end
before the call that waits for it returns: waiting is then a deadlock that
ends only with the busy timeout. Opening a store asks here before it waits
(:meth:`~alkstore_sqlite._connection.ConnectionPool.run_refusing_own_locks`).

SQLite's unix VFS takes POSIX record locks on fixed bytes, documented with
the file formats: in WAL mode the write lock is byte 120 of the ``-shm``
file (sqlite.org/walformat.html, "the WAL-index locks"); in rollback-journal
mode the PENDING, RESERVED and SHARED locks are bytes of the database file
from offset 2**30 (sqlite.org/fileformat2.html, "the lock-byte page";
sqlite.org/lockingv3.html). An open-file-description lock query
(``F_OFD_GETLK``, Linux) reports a conflicting record lock of this process
as well as one of another, with its owner's pid, so it tells the two apart.
It is asked through a descriptor SQLite itself holds on the file (found in
``/proc/self/fd``): opening and closing a descriptor of our own would drop
every record lock this process holds on the file (POSIX), SQLite's too.
Elsewhere the question has no answer (``None``) and callers wait as before.

:func:`pin_shared` takes such a lock itself, for the rest of the process.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys

__all__ = ["READ", "SWITCH_TO_WAL", "WRITE", "Probes", "held_by_this_process", "pin_shared"]

_PENDING_BYTE = 0x40000000
_RESERVED_BYTE = _PENDING_BYTE + 1
_SHARED_FIRST = _PENDING_BYTE + 2
_SHARED_SIZE = 510
_WAL_WRITE_LOCK = 120

# struct flock: l_type, l_whence, l_start, l_len, l_pid (Linux layout).
_FLOCK = struct.Struct("hhqqi4x")
if sys.platform == "linux":
    import fcntl

    _OFD_GETLK: int | None = getattr(fcntl, "F_OFD_GETLK", None)
    _OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
    _RDLCK, _WRLCK, _UNLCK = fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK
else:  # pragma: no cover - the query exists on Linux only
    _OFD_GETLK = _OFD_SETLK = None
    _RDLCK, _WRLCK, _UNLCK = 0, 1, 2

# (file suffix, first byte, length, the lock SQLite wants there): each
# entry's holders block the access it names.
_Probe = tuple[str, int, int, int]
#: What :func:`held_by_this_process` asks about.
Probes = tuple[_Probe, ...]
#: A read in rollback mode: blocked by a PENDING or EXCLUSIVE lock. (In
#: WAL mode reads are never blocked by a writer.)
READ: Probes = (
    ("", _PENDING_BYTE, 1, _RDLCK),
    ("", _SHARED_FIRST, _SHARED_SIZE, _RDLCK),
)
#: ``BEGIN IMMEDIATE``: the WAL write lock, or RESERVED/PENDING in rollback
#: mode.
WRITE: Probes = (
    ("-shm", _WAL_WRITE_LOCK, 1, _WRLCK),
    ("", _RESERVED_BYTE, 1, _WRLCK),
    ("", _PENDING_BYTE, 1, _WRLCK),
)
#: ``PRAGMA journal_mode = WAL`` on a rollback-mode file: an EXCLUSIVE lock,
#: which any other lock on the file blocks, a reader's too.
SWITCH_TO_WAL: Probes = (
    ("", _RESERVED_BYTE, 1, _WRLCK),
    ("", _PENDING_BYTE, 1, _WRLCK),
    ("", _SHARED_FIRST, _SHARED_SIZE, _WRLCK),
)


def held_by_this_process(path: str, probes: Probes) -> bool | None:
    """Whether a connection of this process holds a lock that blocks one of
    ``probes`` (:data:`READ`, :data:`WRITE`, :data:`SWITCH_TO_WAL`) on the
    database ``path``.

    Returns
    -------
    bool or None
        ``True`` if one does (at the instant of asking); ``False`` if no
        lock of this process blocks it (another process's may);
        ``None`` where this cannot be told (not Linux).
    """
    if _OFD_GETLK is None or not os.path.isdir("/proc/self/fd"):
        return None
    me = os.getpid()
    for suffix, start, length, wanted in probes:
        found = _open_descriptor(path + suffix)
        if found is None:
            continue  # no connection of this process has the file open
        fd, identity = found
        query = _FLOCK.pack(wanted, os.SEEK_SET, start, length, 0)
        try:
            answer = fcntl.fcntl(fd, _OFD_GETLK, query)
            still = os.fstat(fd)
        except OSError:
            continue  # closed meanwhile: its locks went with it
        if (still.st_dev, still.st_ino) != identity:
            continue  # closed and the number reused meanwhile
        kind, _, _, _, pid = _FLOCK.unpack(answer)
        if kind != _UNLCK and pid == me:
            return True
    return False


# Descriptors of pin_shared(), open until the process exits: closing one
# would drop every record lock this process holds on its file, SQLite's too.
_pinned: list[int] = []


def pin_shared(path: str, identity: tuple[int, int]) -> bool:
    """Hold a read lock on the SHARED bytes of the database ``path`` until
    this process exits, so that no connection can take SQLite's EXCLUSIVE
    lock on it meanwhile, this process's own included (an open file
    description lock conflicts with the record locks of its own process).

    SQLite's last connection to a database checkpoints its WAL into the file
    when it closes and then removes the ``-wal`` and ``-shm`` files at the
    path; it needs the EXCLUSIVE lock for that, and the pin denies it.

    Parameters
    ----------
    identity
        The (device, inode) the path must name; nothing is pinned otherwise.

    Returns
    -------
    bool
        Whether the lock is held (not on platforms without ``F_OFD_SETLK``).
    """
    if _OFD_SETLK is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    _pinned.append(fd)  # even if unused: see _pinned
    try:
        found = os.fstat(fd)
        if (found.st_dev, found.st_ino) != identity:
            return False
        lock = _FLOCK.pack(_RDLCK, os.SEEK_SET, _SHARED_FIRST, _SHARED_SIZE, 0)
        fcntl.fcntl(fd, _OFD_SETLK, lock)
    except OSError:
        return False
    return True


def _open_descriptor(path: str) -> tuple[int, tuple[int, int]] | None:
    """A descriptor this process already has open on ``path``'s file, and
    the file's identity (device, inode)."""
    try:
        target = os.stat(path)
    except OSError:
        return None
    identity = (target.st_dev, target.st_ino)
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                found = os.fstat(fd)
            except OSError:
                continue
            if (found.st_dev, found.st_ino) == identity:
                return fd, identity
    return None
