"""A level-triggered wake latch for subscriptions (docs/contract.md §3 "Wake")."""

from __future__ import annotations

import os
import threading
import weakref

__all__ = ["WakeLatch"]


class WakeLatch:
    """Remembers that at least one wake arrived until a waiter consumes it.

    :meth:`set` may be called from any thread, any number of times;
    :meth:`wait` returns ``True`` once for all wakes set since the previous
    ``True``, so a claim-then-wait loop misses nothing.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._woken = False
        _latches.add(self)

    def _after_fork_in_child(self) -> None:
        # A thread of the parent may have held the lock at fork() (a wake
        # being set, a waiter waking): the child's copy would stay locked
        # for good, and the child's first set() (a subscription's close, say)
        # would hang. The child's waiters are gone; the pending wake stays.
        self._cond = threading.Condition(threading.Lock())

    def set(self) -> None:
        """Record a wake and release any waiter."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for a wake and consume it.

        Returns
        -------
        bool
            ``True`` if a wake was pending or arrived in time.
        """
        with self._cond:
            woken = self._cond.wait_for(lambda: self._woken, timeout_s)
            self._woken = False
            return woken


# Every latch of this process, to renew its lock in a forked child.
_latches: weakref.WeakSet[WakeLatch] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for latch in list(_latches):
        latch._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
