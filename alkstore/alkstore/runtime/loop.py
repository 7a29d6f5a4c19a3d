"""An event loop on a daemon thread of its own: where a worker run with
``Worker.run()`` awaits its async tasks and its relays' async ``send``
(docs/tasks-and-workers.md "Async tasks").

Imported only when a worker first needs the loop, so ``import alkstore``
imports no asyncio (docs/async.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

__all__ = ["LoopThread"]

#: Seconds the loop's thread waits, once stopped, for the tasks it then
#: cancels to end.
_CANCEL_WAIT_S = 1.0
#: Seconds :meth:`LoopThread.start` waits for the loop to run.
_START_TIMEOUT_S = 10.0


class LoopThread:
    """An asyncio event loop running on a daemon thread named ``name``, so
    that a process can exit while a coroutine is stuck, as a worker's
    handler threads are daemon threads.

    Parameters
    ----------
    name
        The thread's name.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._running = threading.Event()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop (running once :meth:`start` returned)."""
        return self._loop

    def start(self) -> asyncio.AbstractEventLoop:
        """Start the thread and return the loop once it runs.

        Raises
        ------
        RuntimeError
            If the loop did not start within 10 s.
        """
        self._thread.start()
        if not self._running.wait(_START_TIMEOUT_S):
            raise RuntimeError(f"the event loop thread {self._name!r} did not start")
        return self._loop

    def stop(self, timeout_s: float) -> bool:
        """Stop the loop: the tasks still on it are cancelled and get
        :data:`_CANCEL_WAIT_S` seconds to end, then the loop closes. Wait up
        to ``timeout_s`` seconds for that; return whether the thread ended
        (a coroutine that blocks the loop keeps it, a daemon, running)."""
        with contextlib.suppress(RuntimeError):  # already closed
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _serve(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._running.set)
        try:
            loop.run_forever()
        finally:
            try:
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                if left:
                    loop.run_until_complete(asyncio.wait(left, timeout=_CANCEL_WAIT_S))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
