"""How sync runtime code calls an application's callable that may be
async (an outbox relay's ``send``): :func:`caller`, the thread twin of
:func:`alkstore.runtime._caller_async.acaller`, which the sync modules
``tools/async_to_sync.py`` generates from the runtime's async sources use;
and :func:`coroutines_on`, which binds a thread's async callables to a
running event loop (the worker's, for its relay threads).

An async callable given to sync code runs on an event loop: the one the
calling thread is bound to, else one :func:`caller` owns. The generic
thread/task pairs are :mod:`alkstore._acompat`'s.

No asyncio import at module level: ``import alkstore`` imports this module
(docs/async.md).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from alkstore.errors import ValidationError
from alkstore.logic.callbacks import call_async, call_sync, handler_kind

if TYPE_CHECKING:
    import asyncio

__all__ = ["caller", "coroutines_on"]

#: The event loop the async callables of this thread's sync code run on
#: (set by a worker for its relay threads); ``None``: a loop of their own.
_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "alkstore_loop", default=None
)


@contextlib.contextmanager
def coroutines_on(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """While inside, :func:`caller` runs this thread's async callables on
    ``loop`` (running on another thread), one
    ``asyncio.run_coroutine_threadsafe`` each."""
    token = _LOOP.set(loop)
    try:
        yield
    finally:
        _LOOP.reset(token)


@contextlib.contextmanager
def caller(func: Callable[..., Any], what: str) -> Iterator[Callable[..., object]]:
    """Yield a sync callable that calls ``func`` and returns once its body
    ran and returned (docs/outbox.md, :mod:`alkstore.logic.callbacks`).

    A sync ``func`` is called here, and a result that is an awaitable or a
    generator is refused (``NotRunError``). An async ``func`` is awaited on
    an event loop: the one this thread is bound to (:func:`coroutines_on`),
    else one this context owns, on this thread, closed on leaving.

    Raises
    ------
    ValidationError
        On entering: for a generator or async generator function
        (:func:`~alkstore.logic.callbacks.handler_kind`), or for an async
        ``func`` given to sync code that runs inside an event loop, which
        it would block (use the async class: ``AsyncOutbox``).
    """
    if handler_kind(func, what) == "sync":
        yield lambda *args: call_sync(func, what, args, {})
        return
    import asyncio

    loop = _LOOP.get()
    if loop is not None:

        def on_loop(*args: Any) -> object:
            return asyncio.run_coroutine_threadsafe(call_async(func, what, args, {}), loop).result()

        yield on_loop
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise ValidationError(
            f"{what} is a coroutine function and this sync call runs inside an event loop, "
            "which it would block; use the async class (AsyncOutbox) there"
        )
    with asyncio.Runner() as runner:
        yield lambda *args: runner.run(call_async(func, what, args, {}))
