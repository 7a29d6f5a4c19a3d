"""How the core's async API leaves the event loop: :func:`on_thread`.

Imported by ``import alkstore`` (the registry, the app), so it imports no
asyncio: the coroutine does, once a loop runs it (asyncio is then already
imported).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["on_thread"]

T = TypeVar("T")


async def on_thread(call: Callable[[], T], name: str) -> T:
    """``call()`` on a thread of its own named ``name``, awaited without
    holding the event loop; return what it returns, raise what it raises.
    If the awaiting task is cancelled, ``call`` runs on and its result is
    dropped, as with ``asyncio.to_thread``. The thread is not a daemon, as
    ``to_thread``'s are not: an opening or a close under way finishes
    before the process exits.

    Not ``asyncio.to_thread``: the first ``to_thread`` of a process
    creates the loop's default executor, whose module
    (``concurrent.futures.thread``) is imported then, on the loop: a file
    read on the loop's thread at the async API's first use (docs/async.md
    "The contract, with ``await``"). The registry and the app leave the
    loop this way (finding an engine, the thread adapter's first import,
    opening and closing the app's stores)."""
    import asyncio  # a loop runs this coroutine: already imported

    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: object) -> None:  # on the loop
        if not done.done():  # else cancelled meanwhile: dropped
            setter(value)

    def run() -> None:
        setter: Callable[[Any], None]
        value: object
        try:
            value, setter = call(), done.set_result
        except BaseException as error:
            value, setter = error, done.set_exception
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(settle, setter, value)

    threading.Thread(target=run, name=name).start()
    return await done
