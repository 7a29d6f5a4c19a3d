"""asyncio primitives paired with the thread ones of
:mod:`alkstore.runtime._acompat`, for the async sources of the runtime
modules ``tools/async_to_sync.py`` generates (psycopg_pool's
``_acompat.py``). Imported only by async modules: it imports asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from alkstore.logic.callbacks import call_async, call_sync, handler_kind

__all__ = [
    "ACondition",
    "AEvent",
    "ALock",
    "ASpawned",
    "acaller",
    "agather",
    "aspawn",
    "asleep",
    "await_event",
]

AEvent = asyncio.Event
ALock = asyncio.Lock
ASpawned = asyncio.Task[object]
asleep = asyncio.sleep


class ACondition(asyncio.Condition):
    """:class:`asyncio.Condition` with :meth:`wait_timeout`."""

    async def wait_timeout(self, timeout_s: float | None) -> bool:
        """Wait for a notification, at most ``timeout_s`` seconds (``None``:
        no limit); ``False`` on timeout. The lock is held again on return,
        as after :meth:`wait`."""
        try:
            await asyncio.wait_for(self.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


async def await_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set, at most ``timeout_s`` seconds; return
    whether it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
    return event.is_set()


def aspawn(target: Callable[[], Coroutine[Any, Any, object]], name: str) -> asyncio.Task[object]:
    """Run ``target()`` as a task of the running loop, named ``name``."""
    return asyncio.get_running_loop().create_task(target(), name=name)


async def agather(task: asyncio.Task[object], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` seconds for ``task`` to end; cancel it if it
    has not (unlike a thread, a task can be stopped), and wait for that."""
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def acaller(
    func: Callable[..., Any], what: str
) -> AsyncIterator[Callable[..., Awaitable[object]]]:
    """Yield an async callable that calls ``func`` and returns once its body
    ran and returned: an async ``func`` is awaited on the running loop; a
    sync one runs on a thread (``asyncio.to_thread``), so it never blocks
    the loop, and a result that is an awaitable or a generator is refused
    (``NotRunError``).

    Raises
    ------
    ValidationError
        On entering, for a generator or async generator function
        (:func:`~alkstore.logic.callbacks.handler_kind`).
    """
    if handler_kind(func, what) == "async":

        async def awaited(*args: Any) -> object:
            return await call_async(func, what, args, {})

        yield awaited
        return

    async def on_thread(*args: Any) -> object:
        return await asyncio.to_thread(call_sync, func, what, args, {})

    yield on_thread
