"""The wake latch across fork() (D15)."""

from __future__ import annotations

import os
import select
import signal
import threading

import pytest

from alkstore.engine import WakeLatch


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() is POSIX only")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_latch_locked_by_another_thread_at_fork_works_in_the_child() -> None:
    """A parent's thread inside ``set()`` or ``wait()`` holds the latch's lock
    for an instant; a fork at that instant must not leave the child's copy
    locked (a consumer thread waiting on a subscription makes it likely)."""
    latch = WakeLatch()
    latch.set()
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with latch._cond:
            locked.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(10)
    exited, holding = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's lines are not traced
        os.close(exited)
        code = 1
        try:
            kept = latch.wait(0)  # the wake set before the fork
            consumed = not latch.wait(0)
            latch.set()
            code = 0 if kept and consumed and latch.wait(0) else 2
        finally:
            os._exit(code)
    os.close(holding)
    release.set()
    holder.join()
    try:
        hung = not select.select([exited], [], [], 30)[0]
        if hung:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(exited)
        _, status = os.waitpid(pid, 0)
    assert not hung, "the child hung on the latch's inherited lock"
    assert os.waitstatus_to_exitcode(status) == 0
