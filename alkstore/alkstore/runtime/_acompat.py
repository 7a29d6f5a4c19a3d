"""Thread primitives paired with the asyncio ones of
:mod:`alkstore.runtime._acompat_async`, for the runtime modules generated
from async sources by ``tools/async_to_sync.py`` (psycopg_pool's
``_acompat.py``): the async source writes ``AEvent``, ``aspawn``,
``asleep`` ...; the generated sync module imports the names here instead.

No asyncio import at module level: ``import alkstore`` imports this module
(docs/async.md). An async callable given to sync code (an outbox relay's
``send``) runs on an event loop: the worker's when the calling thread is
bound to one (:func:`coroutines_on`), else one :func:`caller` owns.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from alkstore.errors import ValidationError
from alkstore.logic.callbacks import call_async, call_sync, handler_kind

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "Condition",
    "Event",
    "Lock",
    "Spawned",
    "caller",
    "coroutines_on",
    "gather",
    "sleep",
    "spawn",
    "wait_event",
]

Event = threading.Event
Lock = threading.Lock
Spawned = threading.Thread
sleep = time.sleep

#: The event loop the async callables of this thread's sync code run on
#: (set by a worker for its relay threads); ``None``: a loop of their own.
_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "alkstore_loop", default=None
)


class Condition(threading.Condition):
    """:class:`threading.Condition` with :meth:`wait_timeout`, the name its
    asyncio twin waits with."""

    def wait_timeout(self, timeout_s: float | None) -> bool:
        """Wait for a notification, at most ``timeout_s`` seconds (``None``:
        no limit); ``False`` on timeout."""
        return self.wait(timeout_s)


def wait_event(event: threading.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set, at most ``timeout_s`` seconds; return
    whether it is set."""
    return event.wait(timeout_s)


def spawn(target: Callable[[], object], name: str) -> threading.Thread:
    """Run ``target`` on a new daemon thread named ``name``."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def gather(thread: threading.Thread, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` seconds for ``thread`` to end."""
    thread.join(timeout_s)


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
