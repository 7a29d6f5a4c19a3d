"""SIGTERM/SIGINT handling for a running worker (docs/tasks-and-workers.md
"Stopping").

The first signal asks for a warm shutdown (stop claiming, let running jobs
finish within the grace period); a second one ends the grace period at once,
as Celery's warm and cold shutdowns do. Handlers can only be installed from
the main thread (``signal.signal`` raises elsewhere), so a worker run from
another thread leaves signals to the application and is stopped with
``Worker.stop()``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["STOP_SIGNALS", "stop_signals"]

#: The signals that stop a worker.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_signals(on_signal: Callable[[int], None], *, install: bool = True) -> Iterator[bool]:
    """Route SIGTERM and SIGINT to ``on_signal(signum)`` while inside.

    ``on_signal`` runs in the main thread between bytecodes, possibly while
    the main thread holds a lock, so it must only set flags or take
    re-entrant locks. The previous handlers are restored on exit.

    Parameters
    ----------
    on_signal
        Called with the signal number, once per signal received.
    install
        ``False`` installs nothing (the caller opted out).

    Yields
    ------
    bool
        Whether handlers were installed: only when ``install`` and this is
        the main thread of the main interpreter.
    """
    if not install or threading.current_thread() is not threading.main_thread():
        yield False
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        on_signal(signum)

    previous: dict[signal.Signals, Any] = {}
    try:
        for stop_signal in STOP_SIGNALS:
            previous[stop_signal] = signal.signal(stop_signal, handler)
    except ValueError:  # not the main interpreter
        for stop_signal, old in previous.items():
            signal.signal(stop_signal, old)
        yield False
        return
    try:
        yield True
    finally:
        for stop_signal, old in previous.items():
            # None: the old handler was not installed from Python.
            signal.signal(stop_signal, old if old is not None else signal.SIG_DFL)
