"""A pool of daemon threads that run a worker's handlers, started as needed.

``concurrent.futures.ThreadPoolExecutor`` joins its (non-daemon) threads at
interpreter exit, so a handler still running when a worker's grace period
ends would keep the process alive. A worker must instead be able to exit and
leave that job to lapse and be reclaimed (docs/tasks-and-workers.md
"Stopping"), hence daemon threads.

A thread is started only when a callable is submitted while every started
thread is busy, up to the pool's size: a worker whose jobs are mostly async
tasks (coroutines on its event loop) starts only the threads its sync tasks
need at once.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["DaemonPool"]

log = logging.getLogger("alkstore.worker")


class DaemonPool:
    """Run submitted callables on up to ``size`` daemon threads, first in
    first out. A callable's exception is logged, never propagated.

    Parameters
    ----------
    size
        The most threads, ``>= 1``; each is started by a :meth:`submit`
        that finds every started thread busy.
    name
        The prefix of the threads' names.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # Started threads waiting for work that no submit has claimed yet.
        self._idle = 0
        self._shut = False

    @property
    def threads(self) -> int:
        """How many threads were started."""
        with self._lock:
            return len(self._threads)

    def submit(self, fn: Callable[[], object]) -> None:
        """Queue ``fn`` to run on a pool thread, starting one if every
        started thread is busy and the pool is not full.

        Raises
        ------
        RuntimeError
            After :meth:`shutdown`.
        """
        with self._lock:
            if self._shut:
                raise RuntimeError("the pool is shut down")
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        self._work.put(fn)

    def shutdown(self) -> None:
        """Let each thread exit once it has run what it was given; do not
        wait for them. Idempotent."""
        with self._lock:
            if self._shut:
                return
            self._shut = True
            count = len(self._threads)
        for _ in range(count):
            self._work.put(None)

    def _serve(self) -> None:
        while (fn := self._work.get()) is not None:
            try:
                fn()
            except BaseException:
                log.exception("uncaught error in a worker thread")
            with self._lock:
                self._idle += 1
