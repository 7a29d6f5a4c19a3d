"""Blocking until a file is written, with Linux inotify (through ctypes).

The wake detector (:mod:`alkstore_sqlite._wake`) sleeps here instead of
polling while nothing happens, so an idle subscriber costs almost no CPU.
A commit to a WAL database always writes the ``-wal`` file, so a write event
on it is the cue to look at ``PRAGMA data_version``; an event that may have
removed or replaced the database or its ``-wal`` or ``-shm`` file (a
delete, a rename from or onto one of their names, a new file under one, the
directory itself moved or deleted) is the cue to compare the files with
those the store opened (:mod:`alkstore_sqlite._identity`). Elsewhere (no
inotify, or no ``libc``), :func:`watch_file` returns ``None`` and the
detector polls.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import struct

__all__ = ["FileEvents", "watch_file"]

# <sys/inotify.h>
_IN_MODIFY = 0x00000002
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
# Events that may have removed or replaced a file of the database.
_NAME_MOVES = _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_SELF_MOVES = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_READ_SIZE = 64 * 1024


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018 - probe: absent outside Linux
        libc.inotify_add_watch  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


class FileEvents:
    """Write events of one file, watched through its directory (so the file
    may be created, replaced or truncated later), and events that may have
    moved it or its companions.

    Use :func:`watch_file` to make one.
    """

    def __init__(self, inotify_fd: int, name: bytes, companions: frozenset[bytes]) -> None:
        self._fd = inotify_fd
        self._name = name
        self._names = companions | {name}
        self._moved = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._poller = select.poll()
        self._poller.register(self._fd, select.POLLIN)
        self._poller.register(self._wake_r, select.POLLIN)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for a write to the file.

        Returns
        -------
        bool
            ``True`` if the file was written (or events were lost, or one
            may have moved a file, or :meth:`interrupt` was called),
            ``False`` on timeout.
        """
        ready = self._poller.poll(max(0, round(timeout_s * 1000)))
        touched = False
        for fd, _ in ready:
            if fd == self._wake_r:
                os.read(self._wake_r, 4096)
                touched = True
            else:
                touched = self._drain() or touched
        return touched

    def _drain(self) -> bool:
        touched = False
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return touched
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                start = offset + _EVENT.size
                name = data[start : start + length].rstrip(b"\0")
                offset = start + length
                moved = bool(mask & _SELF_MOVES) or bool(mask & _NAME_MOVES and name in self._names)
                if mask & _IN_Q_OVERFLOW or moved:
                    self._moved = True
                if mask & _IN_Q_OVERFLOW or moved or name == self._name:
                    touched = True

    def take_moved(self) -> bool:
        """Whether an event since the last call may have removed, replaced
        or moved the file or a companion (or events were lost)."""
        moved, self._moved = self._moved, False
        return moved

    def interrupt(self) -> None:
        """Make a current or the next :meth:`wait` return at once."""
        # A full pipe means a wake is pending already.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"\0")

    def close(self) -> None:
        """Release the descriptors; the object is unusable afterwards."""
        for fd in (self._fd, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def watch_file(path: str, companions: tuple[str, ...] = ()) -> FileEvents | None:
    """Start watching writes to ``path``; ``None`` where inotify is unavailable.

    Parameters
    ----------
    path
        The file; its directory must exist.
    companions
        Files in the same directory whose removal or replacement
        :meth:`FileEvents.take_moved` reports too (``path``'s own always).
    """
    libc = _libc()
    if libc is None:
        return None
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return None
    directory, name = os.path.split(os.path.abspath(path))
    watch = libc.inotify_add_watch(
        fd, os.fsencode(directory), _IN_MODIFY | _NAME_MOVES | _IN_DELETE_SELF | _IN_MOVE_SELF
    )
    if watch < 0:
        # ENOSPC (too many watches) or a filesystem without inotify support.
        os.close(fd)
        return None
    others = frozenset(os.fsencode(os.path.basename(c)) for c in companions)
    return FileEvents(fd, os.fsencode(name), others)
