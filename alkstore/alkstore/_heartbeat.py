"""Automatic heartbeats for a worker's running jobs (docs/tasks-and-workers.md
"Heartbeats").

Each running job is heartbeaten every third of its own visibility timeout
(the row's stamp, ``JobHandle.visibility_timeout_s``), so two beats can be
late or fail before its claim lapses (SPEC §3: a claim lapses at
``now >= claim_deadline``; ``heartbeat()`` resets it to ``now +`` the row's
visibility timeout). This is the lease renewal of SQS's
``ChangeMessageVisibility`` and River's job heartbeats, done for the handler
so that it need not know about claims.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from alkstore._handle import JobHandle
from alkstore.errors import StoreClosedError

__all__ = ["HEARTBEAT_FRACTION", "Beat", "Heartbeater"]

log = logging.getLogger("alkstore.worker")

#: A job is heartbeaten every this fraction of its visibility timeout.
HEARTBEAT_FRACTION = 1 / 3
#: After a heartbeat raised (say, the database is briefly unreachable), the
#: next try comes this much sooner than a regular beat, at most.
_RETRY_AFTER_ERROR_S = 1.0


class Beat:
    """One running job's heartbeat schedule.

    Attributes
    ----------
    handle
        The job's claim.
    interval_s
        Seconds between beats: the job's visibility timeout times
        :data:`HEARTBEAT_FRACTION`.
    next_at
        When the next beat is due, on the heartbeater's monotonic clock.
    lost
        Set when a heartbeat was refused while the job still ran: its claim
        lapsed or was cancelled, and another worker may run it too.
    """

    __slots__ = ("done", "handle", "interval_s", "lost", "next_at")

    def __init__(self, handle: JobHandle, interval_s: float, next_at: float) -> None:
        self.handle = handle
        self.interval_s = interval_s
        self.next_at = next_at
        self.lost = False
        self.done = False


class Heartbeater:
    """Heartbeats registered jobs from one background thread.

    The schedule is kept on a monotonic clock, not the store's: it only
    decides *when* to send a beat; the store decides whether the claim is
    still valid.

    Parameters
    ----------
    name
        The thread's name.
    monotonic
        The clock for the schedule, seconds; injectable for tests.
    """

    def __init__(self, name: str, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._name = name
        self._monotonic = monotonic
        self._beats: set[Beat] = set()
        self._cond = threading.Condition(threading.Lock())
        self._stopping = False
        self._thread: threading.Thread | None = None
        # When the waiting thread will wake by itself (monotonic seconds; inf
        # while it is awake or idle): a job added with a later first beat
        # needs no wake-up, which spares a thread switch per job under load.
        self._wake_at = math.inf
        self._changed = False

    def add(self, handle: JobHandle) -> Beat:
        """Start heartbeating ``handle``; the first beat is due one interval
        after now."""
        interval = handle.visibility_timeout_s * HEARTBEAT_FRACTION
        beat = Beat(handle, interval, self._monotonic() + interval)
        with self._cond:
            self._beats.add(beat)
            if beat.next_at < self._wake_at:
                self._changed = True
                self._cond.notify()
        return beat

    def remove(self, beat: Beat) -> None:
        """Stop heartbeating: the job's outcome is being recorded."""
        beat.done = True
        with self._cond:
            self._beats.discard(beat)

    def beat_due(self) -> float:
        """Heartbeat every job whose beat is due; return the seconds until
        the next one is (``inf`` when no job is running).

        Raises
        ------
        StoreClosedError
            If the store was closed.
        """
        now = self._monotonic()
        with self._cond:
            due = [beat for beat in self._beats if beat.next_at <= now and not beat.lost]
        for beat in due:
            try:
                took = beat.handle.heartbeat()
            except StoreClosedError:
                raise
            except Exception:
                log.warning(
                    "heartbeat of job %s of %r failed; trying again",
                    beat.handle.id,
                    beat.handle.queue,
                    exc_info=True,
                )
                beat.next_at = now + min(beat.interval_s, _RETRY_AFTER_ERROR_S)
                continue
            if took:
                beat.next_at = now + beat.interval_s
            elif not beat.done:
                beat.lost = True
                log.warning(
                    "job %s of %r lost its claim while running (it lapsed or was "
                    "cancelled); another worker may run it again",
                    beat.handle.id,
                    beat.handle.queue,
                )
        with self._cond:
            pending = [beat.next_at for beat in self._beats if not beat.lost]
        return max(0.0, min(pending) - self._monotonic()) if pending else math.inf

    def start(self) -> None:
        """Start the background thread."""
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sending beats (running jobs then lapse) and wait up to
        ``timeout_s`` seconds for the thread to end."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        # stop() sets _stopping and notifies: the next pass sees it.
        while True:
            try:
                wait_s = self.beat_due()
            except StoreClosedError:
                return
            except Exception:
                # A bug must not end the thread: every running job's claim
                # would lapse while its handler ran on.
                log.exception("the heartbeat thread failed; trying again")
                wait_s = _RETRY_AFTER_ERROR_S
            with self._cond:
                if self._stopping:
                    return
                if self._changed:  # a job came in since beat_due() looked
                    self._changed = False
                    continue
                self._wake_at = self._monotonic() + wait_s
                self._cond.wait(None if math.isinf(wait_s) else wait_s)
                self._wake_at = math.inf
                self._changed = False
