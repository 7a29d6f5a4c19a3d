"""A worker's batching completer (docs/tasks-and-workers.md "Acks", W14).

Handler threads hand each finished job to :meth:`Completer.add` and go on to
the next job; one background thread collects them and calls ``flush`` with up
to ``max_batch`` of them at a time, as soon as that many are waiting or
``max_delay_s`` after the first of them arrived, whichever comes first. The
worker's ``flush`` acks them with one ``Queue.ack_many`` per queue. This is
River's batching completer: a job's completion costs a share of one store
round trip instead of one of its own, and concurrent handlers no longer
queue behind each other for the database's write lock to ack one job each.

:meth:`Completer.close` flushes whatever is still waiting before it returns,
so a worker's ``run()`` never returns with an ack still held back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Completer"]

log = logging.getLogger("alkstore.worker")

T = TypeVar("T")


class Completer(Generic[T]):
    """Batches items handed in from many threads into ``flush`` calls made
    from one background thread.

    Parameters
    ----------
    flush
        Called on the completer's thread with 1 to ``max_batch`` items, in
        the order they were added. It should handle its own errors; one it
        raises is logged and the items are dropped.
    name
        The thread's name.
    max_batch
        Flush as soon as this many items wait, ``>= 1``.
    max_delay_s
        Flush at the latest this long after the first waiting item arrived.
    max_backlog
        :meth:`add` blocks while this many items wait (a flush slower than
        the handlers holds them back rather than letting claims pile up).
    monotonic
        The clock, seconds.
    """

    def __init__(
        self,
        flush: Callable[[list[T]], None],
        name: str,
        *,
        max_batch: int = 100,
        max_delay_s: float = 0.005,
        max_backlog: int = 1000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._flush = flush
        self._name = name
        self._max_batch = max(1, max_batch)
        self._max_delay_s = max(0.0, max_delay_s)
        self._max_backlog = max(self._max_batch, max_backlog)
        self._monotonic = monotonic
        self._cond = threading.Condition(threading.Lock())
        self._items: list[T] = []
        self._first_at = 0.0
        self._closed = False
        self._flushing = 0
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> int:
        """Items added and not yet flushed (including a flush under way)."""
        with self._cond:
            return len(self._items) + self._flushing

    def start(self) -> None:
        """Start the background thread."""
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def add(self, item: T) -> bool:
        """Hand ``item`` over to be flushed; ``False`` (and nothing done) once
        :meth:`close` was called, so the caller completes it itself."""
        with self._cond:
            while len(self._items) >= self._max_backlog and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._items.append(item)
            count = len(self._items)
            if count == 1:
                self._first_at = self._monotonic()
                self._cond.notify_all()
            elif count == self._max_batch:
                self._cond.notify_all()
            return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Accept no more items, flush every waiting one, and wait up to
        ``timeout_s`` seconds (``None``: no limit) for that to end; return
        whether it did. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        thread = self._thread
        if thread is None:  # never started: flush here
            self._drain_here()
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def _drain_here(self) -> None:
        while True:
            with self._cond:
                batch = self._take()
            if not batch:
                return
            self._call(batch)

    def _take(self) -> list[T]:
        """The next batch (the lock held)."""
        batch = self._items[: self._max_batch]
        del self._items[: self._max_batch]
        # Items left over have waited at least as long as the batch: their
        # clock keeps running from the batch's first item.
        self._flushing = len(batch)
        self._cond.notify_all()  # wakes adders blocked on the backlog
        return batch

    def _call(self, batch: list[T]) -> None:
        try:
            self._flush(batch)
        except BaseException:
            # A bug must not end the thread: every later ack would hang.
            log.exception("acking a batch of %d finished job(s) failed", len(batch))
        finally:
            with self._cond:
                self._flushing = 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                if not self._items:  # closed, nothing left
                    return
                while len(self._items) < self._max_batch and not self._closed:
                    remaining = self._first_at + self._max_delay_s - self._monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                batch = self._take()
            self._call(batch)
