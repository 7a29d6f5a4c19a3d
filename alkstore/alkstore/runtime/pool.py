"""A fixed pool of daemon threads that run a worker's handlers.

``concurrent.futures.ThreadPoolExecutor`` joins its (non-daemon) threads at
interpreter exit, so a handler still running when a worker's grace period
ends would keep the process alive. A worker must instead be able to exit and
leave that job to lapse and be reclaimed (docs/tasks-and-workers.md
"Stopping"), hence daemon threads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["DaemonPool"]

log = logging.getLogger("alkstore.worker")


class DaemonPool:
    """Run submitted callables on ``size`` daemon threads, first in first
    out. A callable's exception is logged, never propagated.

    Parameters
    ----------
    size
        The number of threads, ``>= 1``; started on first submit.
    name
        The prefix of the threads' names.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[[], object]) -> None:
        """Queue ``fn`` to run on a pool thread.

        Raises
        ------
        RuntimeError
            After :meth:`shutdown`.
        """
        with self._lock:
            if self._shut:
                raise RuntimeError("the pool is shut down")
            if not self._threads:
                for index in range(self._size):
                    thread = threading.Thread(
                        target=self._serve, name=f"{self._name}-{index}", daemon=True
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
