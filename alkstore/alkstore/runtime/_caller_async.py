"""How async runtime code calls an application's callable that may be
sync (an outbox relay's ``send``): :func:`acaller`, the asyncio twin of
:func:`alkstore.runtime._caller.caller`, for the runtime's async sources
``tools/async_to_sync.py`` converts. The generic thread/task pairs are
:mod:`alkstore._acompat_async`'s. Imported only by async modules: it
imports asyncio.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from alkstore.logic.callbacks import call_async, call_sync, handler_kind

__all__ = ["acaller"]


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
