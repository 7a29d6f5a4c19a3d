"""SIGTERM/SIGINT handling for a running worker (docs/tasks-and-workers.md
"Stopping").

The first signal asks for a warm shutdown (stop claiming, let running jobs
finish within the grace period); a second one ends the grace period at once,
as Celery's warm and cold shutdowns do. Handlers can only be installed from
the main thread (``signal.signal`` raises elsewhere), so a worker run from
another thread leaves signals to the application and is stopped with
``Worker.stop()``.

Python runs a handler in the main thread, between bytecodes; a thread
waiting in C code runs it only if that code checks for signals. psycopg
does (it polls its socket in slices of 0.1 s and checks between them), so
the handler runs while the main thread waits for a database that never
answers, but the main thread itself goes on waiting. So a signal that asks
to stop at once also arms a deadline: if the handled block (the worker's
run) has not been left :data:`EXIT_AFTER_S` seconds later, the process is
ended by that same signal, with the status a supervisor expects of it
(143 for SIGTERM, 130 for SIGINT, in a shell).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["EXIT_AFTER_S", "STOP_SIGNALS", "stop_signals"]

log = logging.getLogger("alkstore.worker")

#: The signals that stop a worker.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Seconds the handled block has, after a signal asking to stop at once, to
#: be left before that signal ends the process.
EXIT_AFTER_S = 3.0


@contextlib.contextmanager
def stop_signals(
    on_signal: Callable[[int], bool | None],
    *,
    install: bool = True,
    exit_after_s: float = EXIT_AFTER_S,
) -> Iterator[bool]:
    """Route SIGTERM and SIGINT to ``on_signal(signum)`` while inside.

    ``on_signal`` runs in the main thread between bytecodes, possibly while
    the main thread holds a lock, so it must only set flags or take
    re-entrant locks. It returns ``True`` when the signal asks to stop at
    once: the signal's default action is then restored (one more of it ends
    the process), and if the block is still running ``exit_after_s``
    seconds later, a timer thread ends the process with that signal (see
    the module docstring). The previous handlers are restored on exit.

    Parameters
    ----------
    on_signal
        Called with the signal number, once per signal received.
    install
        ``False`` installs nothing (the caller opted out).
    exit_after_s
        Seconds between a signal asking to stop at once and the end of the
        process, if the block is not left by then.

    Yields
    ------
    bool
        Whether handlers were installed: only when ``install`` and this is
        the main thread of the main interpreter.
    """
    if not install or threading.current_thread() is not threading.main_thread():
        yield False
        return

    # Held while ending the process, and to mark the block as left: a block
    # left in time is never ended, even by a timer that fires meanwhile.
    lock = threading.Lock()
    left = False
    timers: list[threading.Timer] = []

    def end_process(signum: int) -> None:
        with lock:
            if left:
                return
            log.critical(
                "still running %g s after %s asked to stop at once: ending the process",
                exit_after_s,
                signal.Signals(signum).name,
            )
            # The default action is in place since the handler ran, so this
            # ends the process as the signal does; _exit if it did not.
            os.kill(os.getpid(), signum)
            os._exit(128 + signum)

    def handler(signum: int, frame: FrameType | None) -> None:
        if on_signal(signum) and not timers:
            signal.signal(signum, signal.SIG_DFL)
            timer = threading.Timer(exit_after_s, end_process, args=(signum,))
            timer.daemon = True
            timers.append(timer)
            timer.start()

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
        with lock:
            left = True
        for timer in timers:
            timer.cancel()
        for stop_signal, old in previous.items():
            # None: the old handler was not installed from Python.
            signal.signal(stop_signal, old if old is not None else signal.SIG_DFL)
