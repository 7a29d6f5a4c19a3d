"""Thread primitives, each paired with the asyncio primitive of
:mod:`alkstore._acompat_async` whose name is this one's with an ``a`` (or
``A``) in front: ``Lock``/``ALock``, ``Event``/``AEvent``,
``Condition``/``ACondition``, ``Spawned``/``ASpawned``, ``spawn``/``aspawn``,
``join``/``ajoin``, ``sleep``/``asleep``, ``wait_event``/``await_event``.

Sync modules generated from async sources by ``tools/async_to_sync.py``
(docs/async.md) import these: the async source writes the asyncio name
and imports it from the ``_async`` module, and the conversion renames both
(psycopg_pool's ``_acompat.py`` pairs its primitives the same way). Each
pair has one signature and one spelling, so a source reads the same on
both sides:

- a timed wait on a condition is ``cond.wait_for(predicate, timeout)``,
  :meth:`threading.Condition.wait_for` itself here, the override of
  :class:`~alkstore._acompat_async.ACondition` on the asyncio side;
- a timed wait on an event is ``wait_event(event, timeout_s)``, a function
  rather than a method so that it takes a plain :class:`threading.Event`
  (or :class:`asyncio.Event`) an application passes in (a ``stop`` event);
- ``spawn(fn, args, name=...)`` starts a daemon thread, ``join`` waits for
  it with a bound and says whether it ended. A thread cannot be cancelled:
  code that cancels a task that outlived its bound does so under the
  async sources' escape hatch, ``if is_async():``, whose body the
  conversion drops (:func:`~alkstore._acompat_async.is_async` has no twin
  here).

The runtime imports this module directly; engines reach the same objects
through :mod:`alkstore.engine` (and :mod:`alkstore.engine_async`), the
engine-author API (docs/engine-authors.md "Native async primitives").
Helpers of one domain stay beside their users and build on these: the
runtime's :mod:`alkstore.runtime._caller`, the PostgreSQL engine's
``alkstore_postgres._acompat``.

No asyncio import: ``import alkstore`` imports this module, and stays free
of asyncio (docs/async.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

__all__ = [
    "Condition",
    "Event",
    "Lock",
    "Spawned",
    "join",
    "off_loop",
    "sleep",
    "spawn",
    "wait_event",
]

T = TypeVar("T")

Lock = threading.Lock
Event = threading.Event
Condition = threading.Condition
sleep = time.sleep

#: What :func:`spawn` starts: a daemon thread. (Not ``Worker``, psycopg_pool's
#: name: that is the job worker, :class:`alkstore.Worker`.)
Spawned: TypeAlias = threading.Thread


def wait_event(event: threading.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set, at most ``timeout_s`` seconds; return
    whether it is set (at once when it already is, whatever the timeout)."""
    return event.wait(timeout_s)


def spawn(fn: Callable[..., object], args: tuple[Any, ...] = (), *, name: str) -> Spawned:
    """Run ``fn(*args)`` on a new daemon thread named ``name``."""
    thread = threading.Thread(target=fn, args=args, name=name, daemon=True)
    thread.start()
    return thread


def join(spawned: Spawned, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for ``spawned`` to end; return
    whether it did."""
    spawned.join(timeout_s)
    return not spawned.is_alive()


def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, here: the twin of :func:`~alkstore._acompat_async.aoff_loop`,
    which runs it on a thread so as not to hold an event loop (a first use
    that imports a module or reads a file, such as a time zone's)."""
    return fn(*args)
