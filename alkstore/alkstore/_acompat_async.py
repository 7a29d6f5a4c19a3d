"""asyncio primitives, each paired with the thread primitive of
:mod:`alkstore._acompat` whose name is this one's without the ``a`` (or
``A``): the names the async sources of the modules ``tools/async_to_sync.py``
generates write (docs/async.md). See :mod:`alkstore._acompat` for the
pairs and the one spelling each has.

The async side of a pair is for the tasks of one event loop: nothing here
is thread-safe unless it says so. Hand-written, never generated: the two
sides differ by nature. Imported only by async modules (it imports
asyncio); engines reach it through :mod:`alkstore.engine_async`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias, TypeVar

from alkstore._off_loop import on_thread

__all__ = [
    "ACondition",
    "AEvent",
    "ALock",
    "ASpawned",
    "ajoin",
    "aoff_loop",
    "asleep",
    "aspawn",
    "await_event",
    "is_async",
]

T = TypeVar("T")

ALock = asyncio.Lock
AEvent = asyncio.Event
asleep = asyncio.sleep

#: What :func:`aspawn` starts: a task of the running loop.
ASpawned: TypeAlias = asyncio.Task[None]


def is_async() -> bool:
    """``True``: the escape hatch of the async sources. The conversion
    replaces ``if is_async(): A else: B`` by ``B`` (and a bare
    ``if is_async(): A`` by nothing) in the sync module, so this is only
    ever called on the async side, and has no thread twin."""
    return True


class ACondition(asyncio.Condition):
    """:class:`asyncio.Condition` whose :meth:`wait_for` takes
    :meth:`threading.Condition.wait_for`'s timeout."""

    async def wait_for(self, predicate: Callable[[], T], timeout: float | None = None) -> T:
        """Wait, the lock held (as :meth:`asyncio.Condition.wait_for`),
        until ``predicate()`` is true or ``timeout`` seconds passed
        (``None``: no limit); return the predicate's last value. The lock is
        held again on return, after a timeout too."""
        if timeout is None:
            return await super().wait_for(predicate)
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                return await super().wait_for(predicate)
        except TimeoutError:
            return predicate()


async def await_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set, at most ``timeout_s`` seconds; return
    whether it is set (at once when it already is, whatever the timeout)."""
    if event.is_set():
        return True
    if timeout_s <= 0:
        return False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()


# Tasks started by aspawn, referenced until they end: the loop itself keeps
# only a weak reference to a task.
_tasks: set[ASpawned] = set()


def aspawn(
    fn: Callable[..., Coroutine[Any, Any, None]], args: tuple[Any, ...] = (), *, name: str
) -> ASpawned:
    """Run ``fn(*args)`` as a new task of the running loop, named ``name``.

    Raises
    ------
    RuntimeError
        If no event loop is running in this thread.
    """
    task = asyncio.get_running_loop().create_task(fn(*args), name=name)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


async def ajoin(spawned: ASpawned, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for ``spawned`` to end; return
    whether it did. A task still running is left running, as a thread
    would be (cancel it under ``if is_async():``)."""
    done, _ = await asyncio.wait({spawned}, timeout=timeout_s)
    return bool(done)


async def aoff_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a thread (:func:`alkstore._off_loop.on_thread`), the
    loop waiting unblocked: for work that is short but may touch files on
    its first use (a module's import, a time zone's data), which must not
    hold the loop. Its twin :func:`~alkstore._acompat.off_loop` calls
    ``fn`` in place."""
    return await on_thread(functools.partial(fn, *args), "alkstore-off-loop")
