"""The :class:`Worker`: claims jobs and runs their tasks (docs/tasks-and-workers.md).

Built only on the public contract (``Store.listen``, ``Queue.claim_batch``,
``Queue.sweep_expired``, ``JobHandle.ack/retry/fail/heartbeat``), so it runs on
any engine that passes the contract suite.

One run is these threads, and for async tasks one event loop:

- the claim loop's thread (the caller's for :meth:`Worker.run`, one of the
  worker's own for :meth:`Worker.run_async`): it claims up to its free slots
  with ``claim_batch``, then waits for a wake, a free slot or the re-poll
  interval;
- one listener thread per queue turns ``Subscription.wait`` wakes into a flag
  the loop waits on (a subscription waits on one queue; the loop on all);
- up to ``concurrency`` daemon threads, started as needed, run the sync
  handlers and record each retry or failure; a job whose handler returned is
  handed to the completer;
- async handlers run as coroutines on an event loop: a loop of the worker's
  own on a thread of its own (:mod:`alkstore.runtime.loop`, started at the
  first async job) for ``run()``, the caller's running loop for
  ``run_async()``. The claim loop hands each claimed batch of them to the
  event loop in one ``call_soon_threadsafe``; the loop only runs the
  handlers, and hands each finished one to one outcome thread, which records
  its outcome exactly as a handler thread does (nothing that blocks runs on
  the event loop);
- one completer thread acks finished jobs in batches, one ``ack_many`` per
  queue per flush, and logs and counts their outcomes
  (:mod:`alkstore.runtime.completer`, decision W14);
- one heartbeat thread keeps the claims of running jobs, and of finished jobs
  waiting for their ack, alive (:mod:`alkstore.runtime.heartbeat`).

A job takes one of the ``concurrency`` slots whatever its kind, from its
claim until its outcome is recorded: a sync one also a thread, an async one
no thread.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import logging
import math
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from alkstore.contract.handle import MAX_ATTEMPTS_EXCEEDED, JobHandle
from alkstore.errors import EngineError, StoreClosedError, ValidationError
from alkstore.logic import validation as v
from alkstore.logic.callbacks import NotRunError, call_async, call_sync, handler_kind
from alkstore.logic.codec import encode_result
from alkstore.runtime._caller import coroutines_on
from alkstore.runtime.completer import Completer
from alkstore.runtime.context import JobContext
from alkstore.runtime.heartbeat import Heartbeater
from alkstore.runtime.lease import Lease, gone_while_held, write_while_held
from alkstore.runtime.outbox import Send
from alkstore.runtime.outcome import Fail, Retry, describe_exception, retry_or_bury
from alkstore.runtime.pool import DaemonPool
from alkstore.runtime.presence import DEFAULT_REGISTRY_INTERVAL_S, Presence
from alkstore.runtime.presence import registry_interval_s as check_registry_interval
from alkstore.runtime.scheduler import DEFAULT_TICK_INTERVAL_S, Scheduler
from alkstore.runtime.signals import EXIT_AFTER_S, stop_signals
from alkstore.runtime.sweeper import DEFAULT_SWEEP_INTERVAL_S, Sweeper
from alkstore.runtime.task import Task, TaskCall, parse_task_payload

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Future

    from alkstore.contract.queue import Queue
    from alkstore.contract.store import Store
    from alkstore.contract.subscription import Subscription
    from alkstore.runtime.app import App
    from alkstore.runtime.loop import LoopThread
    from alkstore.runtime.observe import JobWatch

__all__ = [
    "DEFAULT_GRACE_PERIOD_S",
    "DEFAULT_POLL_INTERVAL_S",
    "DEFAULT_PREFETCH",
    "DEFAULT_REGISTRY_INTERVAL_S",
    "DEFAULT_SWEEP_INTERVAL_S",
    "DEFAULT_TICK_INTERVAL_S",
    "Outcome",
    "Worker",
    "WorkerCounts",
    "describe_exception",
]

log = logging.getLogger("alkstore.worker")

#: Seconds between claim attempts when no wake arrives: the safety net for a
#: lost wake (docs/contract.md §3 "Wake"). A lost wake delays a job by at most this.
DEFAULT_POLL_INTERVAL_S = 1.0
#: Seconds running jobs get to finish after a stop before the worker exits
#: and leaves them to lapse (Kubernetes' default termination grace period).
DEFAULT_GRACE_PERIOD_S = 30.0
#: A listener thread returns from ``Subscription.wait`` at least this often
#: to notice that the worker is stopping.
_LISTEN_SLICE_S = 0.5
#: The longest one wait of the thread running :meth:`Worker.run` lasts. A
#: signal that arrives while the handler of the one before runs interrupts
#: no wait: it is handled once that thread runs Python code again, so every
#: wait of that thread ends this often (the second signal's deadline,
#: signals.EXIT_AFTER_S, is armed by its handler).
_SIGNAL_SLICE_S = 0.2
#: Seconds to wait before retrying after the database failed in the loop.
_ERROR_PAUSE_S = 1.0
#: The completer acks at most this many jobs in one ``ack_many`` ...
_ACK_BATCH = 100
#: ... and flushes at the latest this long after the first of them finished.
_ACK_DELAY_S = 0.005
#: Handler threads wait while this many finished jobs wait for their ack.
_ACK_BACKLOG = 1000
#: At exit, ``run()`` waits at most this long for the last acks to be flushed
#: (after a second signal, :data:`_ACK_ABORT_TIMEOUT_S`).
_ACK_CLOSE_TIMEOUT_S = 60.0
_ACK_ABORT_TIMEOUT_S = 1.0

#: A ``--burst`` worker whose claims failed this many rounds in a row (one
#: round every :data:`_ERROR_PAUSE_S`) stops with the last error.
_BURST_FAILED_ROUNDS = 3
#: After the grace period, coroutines still running are cancelled and get
#: this long to end before the worker moves on.
_CANCEL_WAIT_S = 1.0
#: How long ``run()`` waits for its own event loop's thread to end.
_LOOP_STOP_TIMEOUT_S = 5.0
#: The default bound on prefetched jobs (claimed ahead of the free slots):
#: 0 (no prefetch) drains no-op jobs at 0.6x huey's consumer at concurrency
#: 1 on SQLite, a claim commit per job; 100 amortises it over many, and
#: was faster than 256 at concurrency 16 on PostgreSQL (docs/tasks-and-
#: workers.md, W19).
DEFAULT_PREFETCH = 100
#: The prefetch window, seconds: a worker claims ahead as many jobs as it
#: finished in the last window (up to its ``prefetch``), and gives back
#: (``JobHandle.release``) a prefetched job it has held this long without
#: a free slot to start it on: no worker holds a job others are idle on for
#: longer than this.
PREFETCH_WINDOW_S = 1.0
#: A claim of up to this many asks for exactly what it wants; above, for a
#: power of two (:meth:`Worker._room`).
_CLAIM_SIZES_FREE = 16
#: Async jobs started per step of the event loop: a step creates their
#: tasks, about 10 µs each (about 100 µs under asyncio's debug mode, which
#: records where each was created), so a step stays far below a
#: millisecond, and under 1 ms in debug mode. The worker's other threads
#: (building the jobs it claims ahead) take the GIL meanwhile: steps of 16
#: were seen at 5-6 ms in debug mode with prefetch, and steps of 8 at 5-7 ms
#: on a host loaded by other work; 4 keeps a step's share of the GIL waits
#: small, for a loop step's overhead (a few µs) per 4 jobs.
_BEGIN_STEP = 4

#: How a job ended, as logged and counted.
Outcome = Literal["succeeded", "retried", "dead", "lost", "cancelled"]


class _Finished(NamedTuple):
    """A job whose handler returned, waiting in the completer for its ack."""

    handle: JobHandle
    task_name: str
    duration_s: float
    lease: Lease
    #: What the handler returned, kept as the job's result when its queue
    #: keeps completed jobs (checked by the codec before it got here).
    result: object = None
    #: The app's observers' view of the job (None: the app had none).
    watch: JobWatch | None = None


class _Resolved(NamedTuple):
    """What a job's payload names: its task and call, or why it has none
    (``error``: a malformed payload or an unknown task, dead at once)."""

    task_name: str
    task: Task[Any, Any] | None
    call: TaskCall | None
    error: str | None


class _Held(NamedTuple):
    """A claimed job waiting for a free slot (prefetched)."""

    token: int
    handle: JobHandle
    lease: Lease
    claimed: float  # monotonic


class _Coroutine(NamedTuple):
    """A claimed job of an async task, on its way to the event loop."""

    token: int
    handle: JobHandle
    lease: Lease


@dataclass
class _Chore:
    """Periodic work of the claim loop: a sweep or a scheduler tick."""

    name: str
    interval_s: float
    run: Callable[[], object]
    next_at: float = 0.0  # monotonic; 0 runs it at once


class WorkerCounts(NamedTuple):
    """How the jobs a worker ran ended.

    Attributes
    ----------
    succeeded
        The handler returned and the job was acked (counted when the
        completer's batch ack took effect, W14).
    retried
        The handler raised and the job went back to pending (backoff or
        ``Retry(delay=...)``).
    dead
        The job was dead-lettered: ``Fail``, an unknown task or a malformed
        payload, or a retry at its ``max_attempts``.
    lost
        The outcome could not be recorded because the claim was no longer
        this worker's (it lapsed and may have been reclaimed) or the store
        failed past the claim's lapse; the job runs again elsewhere or
        already did. A prefetched job whose claim was lost before it
        started counts here too, and is not run on that claim.
    cancelled
        The job was cancelled (``Queue.cancel``) while its handler ran, so
        its outcome was not recorded (nothing is left to record it on).
    relayed
        Messages the worker's outbox relays delivered (not jobs: not in
        :attr:`total`).
    """

    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0
    cancelled: int = 0
    relayed: int = 0

    @property
    def total(self) -> int:
        """Every job whose handler finished."""
        return self.succeeded + self.retried + self.dead + self.lost + self.cancelled


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"[-255:]


def _every(chore: str, interval_s: float | None) -> str:
    return f"no {chore}" if interval_s is None else f"{chore} every {interval_s:g} s"


def _loop_running() -> bool:
    """Whether an asyncio event loop runs in this thread (none can unless
    asyncio was imported: the check imports nothing)."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Worker:
    """Runs an :class:`App`'s tasks from its queues (docs/tasks-and-workers.md).

    Make one with :meth:`App.worker`. :meth:`run` blocks until :meth:`stop`
    (from any thread) or SIGTERM/SIGINT; ``run(burst=True)`` returns once no
    job is ready and none is running, as RQ's burst mode does. In async
    code, ``await`` :meth:`run_async` runs the same worker inside the
    running event loop (a web server's lifespan).

    While running, the worker claims with ``claim_batch`` up to its free
    slots plus its prefetch, queue by queue in the order given (earlier
    queues first, as RQ orders them); when nothing is ready it waits for a
    wake from ``Store.listen`` and re-polls every ``poll_interval_s``
    regardless. Prefetched jobs (claimed ahead of a free slot) are
    heartbeaten while they wait and start as slots free, in claim order; a
    worker claims ahead only as many as it finished in the last
    :data:`PREFETCH_WINDOW_S`, gives back (``JobHandle.release``) any it
    has held that long, and gives back all of them at once when it stops:
    each is due again at once for any worker, its attempt not counted
    (docs/tasks-and-workers.md "Prefetch"). A prefetched job whose claim
    was lost while it waited is never started (counted ``lost``). Each
    job of a sync task runs on a thread of the pool; each job of an async
    task (``async def``) runs as a coroutine on the worker's event loop
    (:meth:`run`: a loop of the worker's own; :meth:`run_async`: the
    caller's). Every job is heartbeaten every third of its visibility
    timeout, and its outcome recorded off the event loop, by the same rules
    (docs/contract.md §3 "Claim identity and handle validity"):

    - the handler returns: acked by the completer thread, in a batch with
      the other jobs that finished within a few milliseconds (one
      ``Queue.ack_many`` per queue; the job stays claimed and heartbeaten
      until then);
    - it raises :class:`Fail`: ``fail(message)``, dead at once;
    - it raises :class:`Retry`: ``retry(message, delay)``;
    - it raises anything else: ``retry(error)`` with the queue's backoff,
      ``error`` being :func:`describe_exception`'s text;
    - the payload is not a task payload, or names a task the app does not
      have: ``fail(...)`` with a message saying so.

    A retry at the job's ``max_attempts`` dead-letters it, with
    ``last_error`` ``"max attempts exceeded; last error: <error>"``
    (:func:`~alkstore.runtime.outcome.retry_or_bury`). Each
    outcome is one record on the ``alkstore.worker`` logger with the extra
    fields ``queue``, ``job_id``, ``task``, ``attempt``, ``duration_s`` and
    ``outcome``, and is reported to the app's observers
    (:meth:`App.add_observer`; docs/operations.md "Metrics and telemetry").

    Stopping (:meth:`stop`, or the first SIGTERM/SIGINT when :meth:`run` is
    called from the main thread, or cancelling the task awaiting
    :meth:`run_async`): claim nothing more, let running jobs finish within
    ``grace_period_s``, ack the finished jobs still waiting for their
    batch, then return. A second signal (or cancellation) ends the grace
    period at once. Jobs still running then stop being heartbeaten: their
    claims lapse and another worker reclaims them, so nothing is lost
    (at-least-once). Their coroutines are cancelled, and the jobs handed to
    the event loop but not started yet are not started; their threads,
    which cannot be interrupted, run on.

    Parameters
    ----------
    app
        The app whose tasks run.
    queues
        Queue names in priority order (a single ``str`` is one queue);
        ``None`` for every queue of the app's tasks.
    concurrency
        How many jobs run at once, ``1 .. 1024``: each sync task's job on a
        thread of its own, each async task's job as a coroutine, which takes
        a slot but no thread.
    prefetch
        How many claimed jobs may wait for a slot beyond the running ones,
        ``0 .. 10000`` (default :data:`DEFAULT_PREFETCH`; ``0``: claim only
        for free slots). It bounds the claims held ahead; the window rule
        above decides how many of them a worker takes.
    poll_interval_s
        Seconds between claim attempts when no wake arrives, ``> 0``
        (default 1).
    grace_period_s
        Seconds running jobs get to finish after a stop, ``>= 0``
        (default 30).
    sweep_interval_s
        Seconds between sweeps of the whole store, ``> 0`` (default 60);
        ``None`` never sweeps. A :class:`Sweeper` runs ``sweep_expired`` on
        every queue of the store, with the dead-letter retention of this
        app's queues; across all workers on one database it runs once per
        interval, never twice at once (docs/operations.md).
    tick_interval_s
        Seconds between :meth:`Scheduler.tick` calls, ``> 0`` (default 1),
        so the store's schedules fire while any worker runs; ``None`` never
        ticks (run ``alkstore scheduler`` instead; docs/schedules.md).
    registry_interval_s
        Seconds between refreshes of the worker's record in the workers
        registry, ``> 0`` and at most 8 hours (default 10), each with the jobs it runs and the
        per-queue counts of jobs ended since the last (docs/contract.md §11,
        ``Store.workers()``, ``alkstore workers``); the record drops off
        three intervals after the last refresh if the worker dies without
        removing it. ``None`` keeps the worker out of the registry.
    relays
        Whether to run the app's outbox relays (``App.relay``), each on its
        own thread, until the worker stops (docs/outbox.md); an async
        ``send`` is awaited on the worker's event loop.
    worker_id
        Recorded on claimed rows; default ``host:pid:random``.
    handle_signals
        Whether to install SIGTERM/SIGINT handlers while running (only
        ever from the main thread). ``None`` (default): :meth:`run` does,
        :meth:`run_async` does not (the application, or its server, owns
        the process's signals there). ``True``: both do; ``False``: neither.

    Raises
    ------
    ValidationError
        For an option outside its rule, a bad queue name, a queue that is an
        outbox of the app (``App.relay``), or no queue.
    """

    def __init__(
        self,
        app: App,
        queues: Iterable[str] | str | None = None,
        concurrency: int = 1,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        grace_period_s: float = DEFAULT_GRACE_PERIOD_S,
        sweep_interval_s: float | None = DEFAULT_SWEEP_INTERVAL_S,
        tick_interval_s: float | None = DEFAULT_TICK_INTERVAL_S,
        registry_interval_s: float | None = DEFAULT_REGISTRY_INTERVAL_S,
        relays: bool = True,
        worker_id: str | None = None,
        handle_signals: bool | None = None,
    ) -> None:
        if queues is None:
            names = app.queue_names
        elif isinstance(queues, str):
            names = [queues]
        else:
            names = list(queues)
        names = list(dict.fromkeys(v.queue_name(name) for name in names))
        outboxes = [name for name in names if name in app.relays]
        if outboxes:  # their messages are not task calls: all would die as malformed
            raise ValidationError(
                f"queue {outboxes[0]!r} is an outbox with a relay; the worker runs its "
                "relay (relays=True) and cannot claim its messages as tasks"
            )
        if not names and not (relays is True and app.relays):
            raise ValidationError(
                "no queue to work: register a task on the app, or name queues "
                "(queues=[...], or --queue on the command)"
            )
        self._app = app
        self._queue_names = names
        self._concurrency = v.int_in_range(concurrency, "concurrency", 1, 1024)
        self._prefetch = v.int_in_range(prefetch, "prefetch", 0, 10_000)
        self._poll_interval_s = v.duration_s(poll_interval_s, "poll_interval_s", positive=True)
        self._grace_period_s = v.duration_s(grace_period_s, "grace_period_s")
        self._sweep_interval_s = (
            None
            if sweep_interval_s is None
            else v.duration_s(sweep_interval_s, "sweep_interval_s", positive=True)
        )
        self._tick_interval_s = (
            None
            if tick_interval_s is None
            else v.duration_s(tick_interval_s, "tick_interval_s", positive=True)
        )
        self._registry_interval_s = check_registry_interval(registry_interval_s)
        # The worker's record and throughput reports, made when a run starts.
        self._presence: Presence | None = None
        if not isinstance(relays, bool):
            raise ValidationError("relays must be a bool")
        self._relays = relays
        self._worker_id = v.worker_id(_default_worker_id() if worker_id is None else worker_id)
        if handle_signals is not None and not isinstance(handle_signals, bool):
            raise ValidationError("handle_signals must be a bool or None")
        self._handle_signals = handle_signals
        self._relay_stop = threading.Event()
        # Set by the second signal: writes on held jobs stop being retried.
        self._abort = threading.Event()
        # The permanent error that stops the run; run() raises it at the end.
        self._fatal: BaseException | None = None

        # One re-entrant lock for the loop's state: the signal handler runs in
        # the main thread, possibly while that thread holds it.
        self._cond = threading.Condition(threading.RLock())
        self._started = False
        self._stopping = False
        self._aborting = False
        self._woken = False
        self._running: dict[int, JobHandle] = {}
        # Prefetched jobs, in claim order, and when recent jobs finished
        # (monotonic; the last PREFETCH_WINDOW_S of them).
        self._held: collections.deque[_Held] = collections.deque()
        self._finished_at: collections.deque[float] = collections.deque()
        self._pool: DaemonPool | None = None
        self._store: Store | None = None
        self._tokens = itertools.count()
        self._counts: dict[str, int] = dict.fromkeys(WorkerCounts._fields, 0)
        self._tasks: dict[str, Task[Any, Any]] = {}
        self._heartbeater = Heartbeater(
            f"alkstore-heartbeat-{self._worker_id}", on_permanent=self._give_up
        )
        self._queues_by_name: dict[str, Queue] = {}
        # Async tasks: whether the app has any (re-read with its tasks), the
        # event loop their coroutines run on (None until the first needs it,
        # or run_async's), the loop thread run() owns, and the one thread
        # that records their outcomes off the loop.
        self._has_async = False
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: LoopThread | None = None
        self._outcomes = DaemonPool(1, f"alkstore-outcomes-{self._worker_id}")
        self._outcomes_started = False
        self._loop_lock = threading.Lock()  # starts the loop and the outcome thread once
        # The async jobs handed to the event loop and not started yet: the
        # claim thread appends, the loop takes them to start them and, at
        # the end of the grace period, the control thread takes those left
        # (a deque's append and popleft are atomic: the loop takes no lock).
        self._handed: collections.deque[_Coroutine] = collections.deque()
        # On the event loop only: each running coroutine's task by its token,
        # and the tokens the worker cancelled (left to lapse, not recorded).
        self._coroutines: dict[int, asyncio.Task[None]] = {}
        self._abandoned: set[int] = set()
        self._completer: Completer[_Finished] = Completer(
            self._flush_acks,
            f"alkstore-completer-{self._worker_id}",
            max_batch=_ACK_BATCH,
            max_delay_s=_ACK_DELAY_S,
            max_backlog=_ACK_BACKLOG,
        )

    def __repr__(self) -> str:
        return (
            f"<Worker {self._worker_id!r} queues={self._queue_names} "
            f"concurrency={self._concurrency} prefetch={self._prefetch}>"
        )

    # -- state ---------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        """The id recorded on the rows this worker claims."""
        return self._worker_id

    @property
    def queues(self) -> list[str]:
        """The queue names worked, in priority order."""
        return list(self._queue_names)

    @property
    def concurrency(self) -> int:
        """How many jobs run at once."""
        return self._concurrency

    @property
    def prefetch(self) -> int:
        """How many claimed jobs may wait for a slot."""
        return self._prefetch

    @property
    def counts(self) -> WorkerCounts:
        """The outcomes so far (a snapshot)."""
        with self._cond:
            return WorkerCounts(**self._counts)

    @property
    def running(self) -> int:
        """How many jobs are running now."""
        with self._cond:
            return len(self._running)

    # -- control -------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to stop: claim nothing more, let running jobs
        finish within the grace period, then return. Safe from any thread,
        before or during :meth:`run`; idempotent."""
        self._relay_stop.set()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _stop_requested(self) -> bool:
        return self._stopping

    def _on_signal(self, signum: int) -> bool:
        """The first stop signal stops; the next ends the grace period, and
        returns ``True``: run() must return now, or the process ends
        (:func:`~alkstore.runtime.signals.stop_signals`)."""
        name = signal.Signals(signum).name
        with self._cond:
            # The flags first: another signal may come while this one logs,
            # and its handler then runs inside this one.
            aborting = self._stopping
            self._stopping = True
            self._aborting = self._aborting or aborting
            if aborting:
                self._abort.set()  # writes on held jobs stop being retried
            self._cond.notify_all()
        if not aborting:
            log.info(
                "%s received: stopping; running jobs have %.0f s to finish "
                "(send it again to stop now)",
                name,
                self._grace_period_s,
            )
        else:
            log.warning(
                "%s received again: leaving running jobs to lapse; the process ends "
                "in %g s if the worker has not stopped by then",
                name,
                EXIT_AFTER_S,
            )
        return aborting

    def _end_grace(self, reason: str) -> None:
        """End the grace period now (after a stop): running jobs are left to
        lapse, as after a second signal."""
        with self._cond:
            self._stopping = True
            self._aborting = True
            self._abort.set()
            self._cond.notify_all()
        self._relay_stop.set()
        log.warning("%s: worker %s leaves its running jobs to lapse", reason, self._worker_id)

    def _give_up(self, error: BaseException) -> None:
        """Stop because of ``error``, which retrying cannot mend (a permanent
        :class:`~alkstore.errors.EngineError`): claim nothing more, let
        running jobs finish within the grace period; :meth:`run` then raises
        it. The first such error wins."""
        self._relay_stop.set()
        with self._cond:
            first = self._fatal is None
            if first:
                self._fatal = error
            self._stopping = True
            self._cond.notify_all()
        if first:
            log.error(
                "worker %s stops: %s; running jobs have %.0f s to finish",
                self._worker_id,
                error,
                self._grace_period_s,
            )

    def run(self, burst: bool = False) -> WorkerCounts:
        """Work until stopped (or, with ``burst``, until no job is ready).

        The claim loop runs on this thread. Async tasks run on an event
        loop of the worker's own, on a thread of its own, started at the
        first async job (or relay with an async ``send``) and stopped before
        this returns; the app's native async store, when a task opened it
        there (``await task.aenqueue()``), is closed on it first
        (:meth:`App.aclose` without the sync store, which stays open).

        Parameters
        ----------
        burst
            Return once a claim finds no ready job on any queue and no job
            is running (RQ's ``--burst``). Jobs retried with a delay are not
            ready, so they are left for later.

        Returns
        -------
        WorkerCounts
            How the jobs it ran ended.

        Raises
        ------
        RuntimeError
            If this worker already ran (a worker runs once), or if an event
            loop runs in this thread: the run would block it for its whole
            length (as ``asyncio.run`` refuses); ``await`` :meth:`run_async`
            there.
        StoreClosedError
            If the app's store is closed while the worker runs.
        EngineError
            After stopping on a permanent one (``EngineError.permanent``: the
            database file is read-only or was replaced, a privilege is
            missing), or, with ``burst``, once claims failed
            ``_BURST_FAILED_ROUNDS`` rounds in a row: retrying cannot help,
            so the run ends (the command exits non-zero) instead of retrying
            forever. Running jobs get the grace period first.
        UnknownEngineError, SchemaVersionError, EngineError, ValidationError
            If the app's store cannot be opened.
        """
        if _loop_running():
            raise RuntimeError(
                "Worker.run() cannot be called from a running event loop, which it would "
                "block until the worker stops; use `await worker.run_async()` there"
            )
        self._begin_run()
        return self._run(burst, install_signals=self._handle_signals is not False)

    async def run_async(self, burst: bool = False) -> WorkerCounts:
        """:meth:`run` inside the running event loop, for async
        applications (a FastAPI lifespan, docs/tasks-and-workers.md).

        Async tasks run as coroutines on the caller's loop; everything else
        (claims, heartbeats, acks and every outcome's write, sweeps,
        schedule ticks, relays, sync tasks) runs on the worker's threads, so
        the loop only runs handlers and is never blocked by the worker.
        Signal handlers are installed only with ``handle_signals=True``.

        Cancelling the task that awaits this stops the worker as
        :meth:`stop` does (claim nothing more, running jobs get the grace
        period, finished ones are acked), waits for that, then re-raises
        the ``CancelledError``; a second cancellation meanwhile ends the
        grace period at once, as a second signal does.

        Parameters
        ----------
        burst
            As :meth:`run`.

        Returns
        -------
        WorkerCounts
            How the jobs it ran ended.

        Raises
        ------
        asyncio.CancelledError
            After stopping, when the awaiting task was cancelled.
        RuntimeError, StoreClosedError, EngineError, UnknownEngineError, SchemaVersionError
            As :meth:`run`.
        """
        import asyncio
        from concurrent.futures import Future

        loop = asyncio.get_running_loop()
        self._begin_run()
        self._event_loop = loop
        done: Future[WorkerCounts] = Future()

        def control() -> None:
            try:
                done.set_result(self._run(burst, install_signals=False))
            except BaseException as error:
                done.set_exception(error)

        cancelled: asyncio.CancelledError | None = None
        # From the loop's thread (the main thread, usually): signal handlers
        # can only be installed there.
        with stop_signals(self._on_signal, install=self._handle_signals is True):
            thread = threading.Thread(
                target=control, name=f"alkstore-worker-{self._worker_id}", daemon=True
            )
            thread.start()
            finished = asyncio.wrap_future(done)
            while not finished.done():
                try:
                    # Shielded: the run stops as it should, not at the await.
                    await asyncio.shield(finished)
                except asyncio.CancelledError as error:
                    if cancelled is not None and not finished.done():
                        self._end_grace("a second cancellation")
                    elif cancelled is None and not finished.done():
                        log.info(
                            "worker %s cancelled: stopping; running jobs have %.0f s to finish",
                            self._worker_id,
                            self._grace_period_s,
                        )
                        self.stop()
                    cancelled = error
                except BaseException:
                    break  # the run raised: re-raised below (unless cancelled)
        if cancelled is not None:
            finished.exception()  # retrieved: the cancellation wins
            raise cancelled
        return finished.result()

    def _begin_run(self) -> None:
        with self._cond:
            if self._started:
                raise RuntimeError("a Worker runs once; make another with app.worker()")
            self._started = True

    def _run(self, burst: bool, *, install_signals: bool) -> WorkerCounts:
        """A run's whole life on this thread."""
        queues = [self._app.queue(name) for name in self._queue_names]
        self._queues_by_name = {queue.name: queue for queue in queues}
        # The store this run claims from (App.close forgets its own: asking
        # the app again after that would open another).
        self._store = self._app.store
        self._refresh_tasks()
        subscriptions: list[Subscription] = []
        try:
            for name in [] if burst else self._queue_names:
                subscriptions.append(self._app.store.listen(name))
        except BaseException:
            for sub in subscriptions:  # do not leak the ones already opened
                sub.close()
            raise
        listeners = [
            threading.Thread(
                target=self._listen, args=(sub,), name=f"alkstore-listen-{sub.queue_name}"
            )
            for sub in subscriptions
        ]
        relays = [
            threading.Thread(target=self._relay, args=(name, send), name=f"alkstore-relay-{name}")
            for name, send in (self._app.relays.items() if self._relays and not burst else ())
        ]
        pool = self._pool = DaemonPool(self._concurrency, f"alkstore-job-{self._worker_id}")
        log.info(
            "worker %s started: queues %s, concurrency %d, prefetch %d%s, %s, %s%s",
            self._worker_id,
            ", ".join(self._queue_names) or "none",
            self._concurrency,
            self._prefetch,
            f", relays {', '.join(self._app.relays)}" if relays else "",
            _every("sweep", self._sweep_interval_s),
            _every("schedule tick", self._tick_interval_s),
            ", burst" if burst else "",
        )
        self._heartbeater.start()
        self._completer.start()
        # The whole run, its cleanup included, inside the signal handlers: if
        # run() has not returned 3 s after a second signal, that signal ends
        # the process (signals.EXIT_AFTER_S).
        with stop_signals(self._on_signal, install=install_signals):
            try:
                if relays and any(
                    handler_kind(send, "a relay's send") == "async"
                    for send in self._app.relays.values()
                ):
                    self._ensure_event_loop()
                for thread in listeners + relays:
                    thread.daemon = True
                    thread.start()
                try:
                    self._loop(queues, burst)
                finally:
                    self._release_held(self._take_held())
                    self._drain()
                    self._close_completer()
            finally:
                self._close_completer()  # idempotent; here if the block above raised
                self._heartbeater.stop()
                pool.shutdown()
                self.stop()
                self._relay_stop.set()
                for thread in listeners + relays:
                    thread.join(_LISTEN_SLICE_S * 4)
                for sub in subscriptions:
                    sub.close()
                self._outcomes.shutdown()
                self._stop_own_loop()
                if self._presence is not None:
                    self._presence.leave()
        counts = self.counts
        log.info(
            "worker %s stopped: %d succeeded, %d retried, %d dead, %d lost, %d cancelled%s",
            self._worker_id,
            counts.succeeded,
            counts.retried,
            counts.dead,
            counts.lost,
            counts.cancelled,
            f"; relays delivered {counts.relayed} message(s)" if relays else "",
        )
        if self._fatal is not None:
            raise self._fatal
        return counts

    # -- the claim loop ------------------------------------------------------

    def _loop(self, queues: list[Queue], burst: bool) -> None:
        chores = self._chores()
        failed_rounds = 0
        while True:
            next_chore = self._run_due(chores)
            self._release_held(self._take_stale())
            with self._cond:
                if self._stopping:
                    return
                free = self._room()
                if free <= 0:  # every slot busy: wait for one, or the next chore
                    now = time.monotonic()
                    wait_s = min(self._poll_interval_s, min(next_chore, self._next_stale()) - now)
                    self._cond.wait(max(0.0, min(wait_s, _SIGNAL_SLICE_S)))
                    continue
                # Cleared before claiming, so a wake arriving during the claim
                # keeps the flag set and the next wait returns at once.
                self._woken = False
            claimed, error = self._claim_round(queues, free)
            failed = error is not None
            failed_rounds = failed_rounds + 1 if failed and not claimed else 0
            if burst and failed_rounds >= _BURST_FAILED_ROUNDS:
                gave_up = EngineError(
                    f"a burst worker's claims failed {failed_rounds} rounds in a row; "
                    f"last error: {error}"
                )
                gave_up.__cause__ = error
                self._give_up(gave_up)
            with self._cond:
                if self._stop_requested():  # stop() may have run meanwhile
                    return
                if claimed == free:
                    continue  # every slot filled: more may be ready
                if burst and not claimed and not failed and not self._running and not self._held:
                    return
                timeout = _ERROR_PAUSE_S if failed else self._poll_interval_s
                until = min(next_chore, self._next_stale()) - time.monotonic()
                timeout = min(timeout, max(0.0, until))
                self._cond.wait_for(lambda: self._woken or self._stopping, timeout)

    def _chores(self) -> list[_Chore]:
        """The periodic work the claim loop does between claims."""
        chores: list[_Chore] = []
        store = self._app.store
        if self._sweep_interval_s is not None:
            # Every queue the app declares, served here or not: the sweep's
            # turn is fleet-wide, so whichever worker takes it applies them.
            known = [*self._queue_names, *self._app.queue_names, *self._app.relays]
            opts = {name: self._app.queue_opts(name) for name in dict.fromkeys(known)}
            sweeper = Sweeper(
                store,
                interval_s=self._sweep_interval_s,
                retention={name: o.dead_letter_retention_s for name, o in opts.items()},
                keep_completed={name: o.keep_completed_s for name, o in opts.items()},
            )
            chores.append(_Chore("sweeping", self._sweep_interval_s, sweeper.run_once))
        if self._tick_interval_s is not None:
            chores.append(
                _Chore("the scheduler tick", self._tick_interval_s, Scheduler(store).tick)
            )
        if self._registry_interval_s is not None:
            self._presence = Presence(
                store,
                self._worker_id,
                self._queue_names,
                self._concurrency,
                interval_s=self._registry_interval_s,
                running=self._running_ids,
            )
            chores.append(
                _Chore("the workers registry", self._registry_interval_s, self._presence.refresh)
            )
        return chores

    def _running_ids(self) -> list[int]:
        """The ids of the jobs running now (for the workers registry)."""
        with self._cond:
            return sorted(handle.id for handle in self._running.values())

    def _run_due(self, chores: list[_Chore]) -> float:
        """Run the chores that are due; return when the next one is."""
        now = time.monotonic()
        for chore in chores:
            if now >= chore.next_at:
                try:
                    chore.run()
                except StoreClosedError:
                    raise
                except Exception as exc:
                    if _permanent(exc):
                        self._give_up(exc)
                    else:
                        log.exception(
                            "%s failed; trying again in %g s", chore.name, chore.interval_s
                        )
                now = time.monotonic()
                chore.next_at = now + chore.interval_s
        return min((chore.next_at for chore in chores), default=math.inf)

    def _claim_round(self, queues: list[Queue], free: int) -> tuple[int, Exception | None]:
        """Claim up to ``free`` jobs, queue by queue, and start as many as
        slots are free; return how many were claimed, and the last error a
        claim raised (``None`` when none did)."""
        claimed, failed = 0, None
        for queue in queues:
            want = free - claimed
            if want <= 0:
                break
            started = time.monotonic()
            try:
                handles = queue.claim_batch(self._worker_id, want)
            except StoreClosedError:
                raise
            except Exception as exc:
                failed = exc
                if _permanent(exc):
                    self._give_up(exc)
                    break
                log.exception("claiming from queue %r failed; retrying", queue.name)
                continue
            for handle in handles:
                self._hold(handle, started)
            self._start_ready()
            claimed += len(handles)
        return claimed, failed

    def _relay(self, name: str, send: Send) -> None:
        """Run one outbox relay until the worker stops (docs/outbox.md); an
        async ``send`` is awaited on the worker's event loop."""
        loop = self._event_loop
        try:
            with coroutines_on(loop) if loop is not None else contextlib.nullcontext():
                delivered = self._app.outbox(name).relay(
                    send,
                    worker_id=self._worker_id,
                    stop=self._relay_stop,
                    poll_interval_s=self._poll_interval_s,
                    takes_context=self._app._relay_takes_context(name),
                )
        except StoreClosedError:
            pass
        except Exception as exc:
            if _permanent(exc):
                self._give_up(exc)
            else:
                log.exception("the relay of outbox %r stopped", name)
        else:
            with self._cond:
                self._counts["relayed"] += delivered

    def _listen(self, subscription: Subscription) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
            try:
                woken = subscription.wait(min(self._poll_interval_s, _LISTEN_SLICE_S))
            except StoreClosedError:
                return
            except Exception as exc:
                if _permanent(exc):
                    self._give_up(exc)
                    return
                # docs/contract.md §3: a subscription re-establishes itself; the loop's
                # re-poll covers the gap meanwhile.
                log.warning(
                    "waiting for wakes of %r failed", subscription.queue_name, exc_info=True
                )
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, _ERROR_PAUSE_S)
                continue
            if woken:
                with self._cond:
                    self._woken = True
                    self._cond.notify_all()

    def _drain(self) -> None:
        """Wait up to the grace period for running jobs; report the rest."""
        # The relays stop claiming now too, not after the grace period: a
        # signal only sets _stopping (an Event's lock is not re-entrant).
        self._relay_stop.set()
        with self._cond:
            self._stopping = True
            deadline = time.monotonic() + self._grace_period_s
            while self._running and not self._aborting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, _SIGNAL_SLICE_S))
            left = sorted(handle.id for handle in self._running.values())
        if left:
            log.warning(
                "worker %s exits with %d job(s) still running (ids %s): they are no "
                "longer heartbeaten and will be reclaimed once their claims lapse",
                self._worker_id,
                len(left),
                ", ".join(map(str, left)),
            )
            self._cancel_coroutines()

    def _close_completer(self) -> None:
        """Flush the acks still held back; the heartbeats keep their claims
        alive meanwhile. Handlers that finish later (past the grace period)
        ack on their own."""
        started = time.monotonic()
        while True:
            with self._cond:
                timeout_s = _ACK_ABORT_TIMEOUT_S if self._aborting else _ACK_CLOSE_TIMEOUT_S
            remaining = started + timeout_s - time.monotonic()
            if self._completer.close(max(0.0, min(remaining, _SIGNAL_SLICE_S))):
                return
            if remaining <= _SIGNAL_SLICE_S:
                break
        if not self._completer.close(0):
            log.warning(
                "worker %s exits with the acks of %d finished job(s) still being "
                "flushed; a job whose ack does not take effect is reclaimed once "
                "its claim lapses",
                self._worker_id,
                self._completer.waiting,
            )

    # -- one job -------------------------------------------------------------
    #
    # Whatever goes wrong around a job (recording its outcome raised, the
    # store refused an argument, a bug in this module), its slot is freed and
    # the outcome counted: a leaked slot would leave ``running`` stuck above
    # zero, so ``run(burst=True)`` would never return and a stop would wait
    # out the whole grace period. A job whose outcome could not be recorded
    # is left claimed and unheartbeaten: its claim lapses and it is
    # reclaimed (``lost``), as for a worker that died.

    def _hold(self, handle: JobHandle, claimed: float) -> None:
        """Take a claimed job in: heartbeaten from now, waiting for a slot."""
        token = next(self._tokens)
        try:
            lease = self._heartbeater.add(handle, claimed)
        except Exception:
            log.exception(
                "could not start job %s of %r; its claim is left to lapse", handle.id, handle.queue
            )
            self._count("lost")
            return
        with self._cond:
            self._held.append(_Held(token, handle, lease, claimed))

    def _start_ready(self, here: bool = False) -> _Held | None:
        """Start held jobs, in claim order, while a slot is free (not once
        the worker stops, nor once the store is closed: those are
        released, or left to lapse). A job whose claim was lost
        while it waited is not started (``lost``): its lease saw a refused
        heartbeat, or its deadline has passed on the store's clock or the
        monotonic one (:meth:`Lease.holds`).

        With ``here`` (a handler thread whose job just finished), the first
        sync job is returned for that thread to run, not handed to another:
        a thread that finishes a job takes the next at once."""
        mine: _Held | None = None
        store = self._store
        while True:
            with self._cond:
                ready: list[_Held] = []
                # Not on a closed store either: no outcome could be recorded
                # (the claim loop notices it at its next claim, and stops).
                while (
                    self._held
                    and len(self._running) < self._concurrency
                    and not self._stopping
                    and not (store is not None and store.closed)
                ):
                    job = self._held.popleft()
                    self._running[job.token] = job.handle  # its slot, taken now
                    ready.append(job)
            if not ready:
                return mine
            now = time.monotonic()
            lost = [job for job in ready if not job.lease.holds(now)]
            gone = {job.token for job in lost}
            coroutines: list[_Coroutine] = []
            for job in ready:
                if job.token in gone:
                    continue
                if self._has_async and self._is_async_job(job.handle):
                    coroutines.append(_Coroutine(job.token, job.handle, job.lease))
                elif here and mine is None:
                    mine = job
                else:
                    self._submit(job)
            if coroutines:
                self._dispatch(coroutines)
            if not lost:
                return mine
            for job in lost:  # their slots free again: the loop fills them
                log.warning(
                    "prefetched job %s of %r lost its claim before it started; it is not "
                    "run here (it lapsed or was cancelled, and runs elsewhere if still due)",
                    job.handle.id,
                    job.handle.queue,
                )
                self._heartbeater.remove(job.lease)
                with self._cond:
                    self._running.pop(job.token, None)
                    self._counts["lost"] += 1

    def _submit(self, job: _Held) -> None:
        """Run a sync task's job on a pool thread."""
        token, handle, lease = job.token, job.handle, job.lease
        try:
            assert self._pool is not None
            self._pool.submit(lambda: self._execute(token, handle, lease))
        except Exception:
            log.exception(
                "could not start job %s of %r; its claim is left to lapse", handle.id, handle.queue
            )
            self._heartbeater.remove(lease)
            self._finish(token, "lost")

    def _room(self) -> int:
        """How many jobs to claim now (the caller holds the lock): the free
        slots, plus up to ``prefetch`` ahead, no more than the worker
        finished in the last :data:`PREFETCH_WINDOW_S`; one claim for both,
        so that a wake costs one round trip. With every slot busy it tops
        the prefetched jobs up only once half of them have started, so that
        each claim takes many jobs, not one per job finished. Above 16, a
        claim asks for a power of two (never fewer than the free slots): an
        engine that plans a claim per batch size plans few (the PostgreSQL
        engine prepares these)."""
        finished = self._finished_at
        horizon = time.monotonic() - PREFETCH_WINDOW_S
        while finished and finished[0] < horizon:
            finished.popleft()
        ahead = min(self._prefetch, len(finished))
        free = self._concurrency - len(self._running)
        held = len(self._held)
        if free <= 0 and held > ahead // 2:
            return 0
        want = free + ahead - held
        if want <= _CLAIM_SIZES_FREE:
            return want
        return max(free, 1 << (want.bit_length() - 1))

    def _take_held(self) -> list[_Held]:
        """Take every prefetched job (the worker stops: none will start)."""
        with self._cond:
            taken = list(self._held)
            self._held.clear()
        return taken

    def _take_stale(self) -> list[_Held]:
        """Take the prefetched jobs held for :data:`PREFETCH_WINDOW_S`
        without a slot: others may be idle. The rate that had them claimed
        is then forgotten: the worker claims ahead again only for jobs
        that finish from now on, not straight back the ones it gives up."""
        stale: list[_Held] = []
        with self._cond:
            horizon = time.monotonic() - PREFETCH_WINDOW_S
            while self._held and self._held[0].claimed <= horizon:
                stale.append(self._held.popleft())
            if stale:
                self._finished_at.clear()
        return stale

    def _next_stale(self) -> float:
        """When the oldest prefetched job falls due for release (monotonic;
        inf when none is held). The caller holds the lock."""
        return self._held[0].claimed + PREFETCH_WINDOW_S if self._held else math.inf

    def _release_held(self, jobs: list[_Held]) -> None:
        """Give prefetched jobs back (``JobHandle.release``): due again at
        once for any worker, their attempts not counted. After the first
        release that raises (the store closed, or failing), the rest are
        not tried, so a failing store costs one wait, not one per job: they
        are left to lapse and be reclaimed (at-least-once)."""
        if not jobs:
            return
        for job in jobs:
            self._heartbeater.remove(job.lease)
        released = 0
        for index, job in enumerate(jobs):
            try:
                released += job.handle.release()
            except Exception as exc:
                log.warning(
                    "could not release prefetched job %s of %r (%s); it and the %d "
                    "after it are reclaimed once their claims lapse",
                    job.handle.id,
                    job.handle.queue,
                    exc,
                    len(jobs) - index - 1,
                )
                break
        log.info(
            "worker %s released %d of %d prefetched job(s) it had not started",
            self._worker_id,
            released,
            len(jobs),
        )

    def _count(self, outcome: Outcome) -> None:
        with self._cond:
            self._counts[outcome] += 1

    def _finish(self, token: int, outcome: Outcome | None, here: bool = False) -> _Held | None:
        """Free a job's slot and count its outcome (``None``: handed to the
        completer, which counts it once its ack is known, or left to lapse
        uncounted); start the next held jobs (with ``here``, the first sync
        one is returned for the caller's thread to run).

        The claim loop is woken only when it may have work: no job held
        (a slot to claim for), few left (time to top them up), or a stop
        (the drain waits for the last job): not once per job."""
        with self._cond:
            self._running.pop(token, None)
            if outcome is not None:
                self._counts[outcome] += 1
            self._finished_at.append(time.monotonic())
            held = len(self._held)
            if self._stopping or held <= self._prefetch // 2:
                self._woken = True
                self._cond.notify_all()
        return self._start_ready(here) if held else None

    def _execute(self, token: int, handle: JobHandle, lease: Lease) -> None:
        """Sync tasks' jobs, on a pool thread: run one, record its outcome,
        then the next held one, while there is one."""
        job: _Held | None = _Held(token, handle, lease, 0.0)
        while job is not None:
            current = job
            job = self._settle(
                current.token,
                current.handle,
                current.lease,
                functools.partial(self._run_job, current.handle, current.lease),
                here=True,
            )

    def _settle(
        self,
        token: int,
        handle: JobHandle,
        lease: Lease,
        record: Callable[[], Outcome | None],
        here: bool = False,
    ) -> _Held | None:
        """Call ``record`` (which records the job's outcome and returns it),
        then free the job's slot and count the outcome, whatever happens;
        return the job this thread runs next (with ``here``: :meth:`_finish`)."""
        outcome: Outcome | None = "lost"
        try:
            outcome = record()
        except BaseException:
            log.exception(
                "running job %s of %r failed inside the worker; its claim is left to lapse",
                handle.id,
                handle.queue,
            )
        finally:
            if outcome is not None:  # else the completer owns the lease now
                self._heartbeater.remove(lease)
            following = self._finish(token, outcome, here)
        return following

    def _refresh_tasks(self) -> None:
        tasks = dict(self._app.tasks)
        self._tasks = tasks
        self._has_async = any(task.is_async for task in tasks.values())

    def _is_async_job(self, handle: JobHandle) -> bool:
        """Whether the job's payload names an async task of the app."""
        payload = handle.payload
        name = payload.get("task") if isinstance(payload, dict) else None
        task = self._tasks.get(name) if isinstance(name, str) else None
        return task is not None and task.is_async

    def _resolve(self, handle: JobHandle) -> _Resolved:
        """The task and call a job's payload names, or why it has none
        (W6: dead at once, since no retry can fix it)."""
        try:
            call = parse_task_payload(handle.payload)
        except ValueError as exc:
            named = handle.payload.get("task") if isinstance(handle.payload, dict) else None
            # The arguments were malformed, not the name: logged under it.
            return _Resolved(named if isinstance(named, str) else "?", None, None, str(exc))
        task = self._tasks.get(call.name)
        if task is None:  # registered after the run started?
            self._refresh_tasks()
            task = self._tasks.get(call.name)
        if task is None:
            known = ", ".join(sorted(self._tasks)) or "none"
            return _Resolved(
                call.name,
                None,
                None,
                f"unknown task {call.name!r}: this worker's app has no task of that name "
                f"(its tasks: {known})",
            )
        return _Resolved(call.name, task, call, None)

    def _run_job(self, handle: JobHandle, lease: Lease) -> Outcome | None:
        """Run a sync task's handler and record its outcome; return it, or
        ``None`` when the job succeeded and was handed to the completer."""
        started = time.monotonic()
        resolved = self._resolve(handle)
        observing = self._app._observing
        watch = None if observing is None else observing.job_started(handle, resolved.task_name)
        raised: BaseException | None = None
        returned: object = None
        task, call = resolved.task, resolved.call
        if task is not None and call is not None:
            args = _arguments(task, call, lease)
            try:
                if task.is_async:  # registered after the claim round looked: awaited from here
                    returned = self._await_here(call_async(task.func, "task", args, call.kwargs))
                else:
                    returned = call_sync(task.func, "task", args, call.kwargs)
            except BaseException as exc:
                raised = exc
        duration_s = time.monotonic() - started
        if watch is not None:
            watch.ran(raised)
        return self._conclude(
            handle, lease, resolved, raised, duration_s, returned=returned, watch=watch
        )

    # -- async tasks (docs/tasks-and-workers.md "Async tasks") -----------------
    #
    # The claim thread hands each round's batch of async jobs to the event
    # loop with one call_soon_threadsafe; the loop runs each handler as a
    # task and hands what it did (returned, or the exception it raised) to
    # the outcome thread, which records it with _conclude exactly as a
    # handler thread does. The loop never takes the worker's locks, writes
    # to the store or logs an outcome.

    def _ensure_event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop coroutines run on: run_async's, else one of the
        worker's own, started now (on a thread other than the loop's)."""
        loop = self._event_loop
        if loop is not None and self._outcomes_started:
            return loop
        with self._loop_lock:
            if self._event_loop is None:
                from alkstore.runtime.loop import LoopThread

                self._loop_thread = LoopThread(f"alkstore-loop-{self._worker_id}")
                self._event_loop = self._loop_thread.start()
            if not self._outcomes_started:
                # Its thread starts here, not on the loop at the first outcome.
                self._outcomes.submit(_nothing)
                self._outcomes_started = True
            return self._event_loop

    def _stop_own_loop(self) -> None:
        """End the event loop :meth:`run` owns, if it started one: close
        what was opened on it for the app (:meth:`_close_on_own_loop`),
        then stop it. Each waits up to :data:`_LOOP_STOP_TIMEOUT_S`, or
        :data:`_ACK_ABORT_TIMEOUT_S` after a second signal (a coroutine
        that blocks the loop must not hold the exit up)."""
        loop_thread = self._loop_thread
        if loop_thread is None:
            return
        with self._cond:
            wait_s = _ACK_ABORT_TIMEOUT_S if self._aborting else _LOOP_STOP_TIMEOUT_S
        self._close_on_own_loop(wait_s)
        if not loop_thread.stop(wait_s):
            log.warning(
                "the event loop of worker %s did not stop within %g s (a coroutine "
                "blocks it); it is left running on its daemon thread",
                self._worker_id,
                wait_s,
            )

    def _close_on_own_loop(self, wait_s: float) -> None:
        """Before :meth:`run` ends the event loop of its own: close, on that
        loop, what was opened there on the app's behalf, the app's native
        async store (opened by a task's ``await task.aenqueue()``); its end
        would otherwise close it with a warning. The app's sync store is
        the caller's, left open. Waits up to ``wait_s`` seconds."""
        loop_thread = self._loop_thread
        if loop_thread is None:
            return
        import asyncio

        try:
            asyncio.run_coroutine_threadsafe(
                self._app._aclose_loops_store(), loop_thread.loop
            ).result(wait_s)
        except Exception:
            log.warning(
                "worker %s could not close the app's async store on its event loop, "
                "which closes it as it ends",
                self._worker_id,
                exc_info=True,
            )

    def _dispatch(self, jobs: list[_Coroutine]) -> None:
        """Hand claimed async jobs to the event loop: one thread hop."""
        try:
            loop = self._ensure_event_loop()
        except Exception:
            self._undispatched(jobs)
            return
        self._handed.extend(jobs)
        try:
            loop.call_soon_threadsafe(self._begin)
        except Exception:  # the loop has closed: nothing handed to it will start
            self._undispatched(self._take_handed())

    def _undispatched(self, jobs: list[_Coroutine]) -> None:
        """Async jobs the event loop could not be given: counted ``lost``,
        their claims left to lapse."""
        log.exception(
            "could not hand %d async job(s) to the event loop; their claims are left to lapse",
            len(jobs),
        )
        for job in jobs:
            self._heartbeater.remove(job.lease)
            self._finish(job.token, "lost")

    def _take_handed(self) -> list[_Coroutine]:
        """Take every job handed to the event loop and not started yet: the
        loop will not start them."""
        taken: list[_Coroutine] = []
        while True:
            try:
                taken.append(self._handed.popleft())
            except IndexError:
                return taken

    def _await_here(self, coroutine: Coroutine[Any, Any, object]) -> object:
        """Run ``coroutine`` on the event loop and wait for it on this
        thread; return what it returned."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self._ensure_event_loop()).result()

    def _begin(self) -> None:
        """On the event loop: start the coroutines of the jobs handed to it,
        each as a task, at most :data:`_BEGIN_STEP` per step of the loop, so
        that a large batch never holds the loop (the application's, under
        ``run_async``) for long. A job is taken from :attr:`_handed` and its
        task registered in one step, so that at the end of the grace period
        every job is either started, and cancelled, or still handed, and
        never started (:meth:`_cancel_coroutines`)."""
        import asyncio

        loop = asyncio.get_running_loop()
        for _ in range(_BEGIN_STEP):
            try:
                job = self._handed.popleft()
            except IndexError:
                return
            try:
                task = loop.create_task(
                    self._run_coroutine(job), name=f"alkstore-job-{job.handle.id}"
                )
            except BaseException as exc:  # the loop is closing: counted lost, left to lapse
                self._hand_off(self._failed(job, exc))
                continue
            self._coroutines[job.token] = task
        if self._handed:
            loop.call_soon(self._begin)

    async def _run_coroutine(self, job: _Coroutine) -> None:
        """On the event loop: run an async task's handler; hand what it did
        to the outcome thread."""
        import asyncio

        started = time.monotonic()
        raised: BaseException | None = None
        returned: object = None
        try:
            resolved = self._resolve(job.handle)
        except BaseException as exc:  # a bug here, not the handler's doing
            self._coroutines.pop(job.token, None)
            self._hand_off(self._failed(job, exc))
            return
        observing = self._app._observing
        watch = None if observing is None else observing.job_started(job.handle, resolved.task_name)
        try:
            if resolved.task is not None and resolved.call is not None:
                args = _arguments(resolved.task, resolved.call, job.lease)
                task_func = resolved.task.func
                returned = await call_async(task_func, "task", args, resolved.call.kwargs)
        except asyncio.CancelledError as exc:
            if job.token not in self._abandoned:  # not the worker's: an exception like any
                raised = exc
        except BaseException as exc:
            raised = exc
        duration_s = time.monotonic() - started
        self._coroutines.pop(job.token, None)
        if watch is not None:
            watch.ran(raised)
        if job.token in self._abandoned:
            # Cancelled at the end of the grace period: neither acked nor
            # retried, whatever it did then; its claim lapses (as a thread's).
            self._abandoned.discard(job.token)
            if watch is not None:
                watch.finished("lost", duration_s)
            self._hand_off(lambda: self._abandon(job))
            return
        self._hand_off(
            lambda: self._settle(
                job.token,
                job.handle,
                job.lease,
                lambda: self._conclude(
                    job.handle,
                    job.lease,
                    resolved,
                    raised,
                    duration_s,
                    returned=returned,
                    watch=watch,
                ),
            )
        )

    def _failed(self, job: _Coroutine, error: BaseException) -> Callable[[], object]:
        """The outcome thread's work for a job the worker itself failed to
        run (W13): logged, counted ``lost``, its claim left to lapse."""

        def fail() -> Outcome | None:
            raise error

        return lambda: self._settle(job.token, job.handle, job.lease, fail)

    def _hand_off(self, record: Callable[[], object]) -> None:
        """From the event loop to the outcome thread (a queue put: no wait)."""
        with contextlib.suppress(RuntimeError):  # the run is over: the claim lapses
            self._outcomes.submit(record)

    def _abandon(self, job: _Coroutine) -> None:
        """A job cancelled or never started at the end of the grace period:
        no longer heartbeaten, left to lapse, not counted."""
        self._heartbeater.remove(job.lease)
        self._finish(job.token, None)

    def _cancel_coroutines(self) -> None:
        """After the grace period, every async job still running is left to
        lapse: the jobs handed to the event loop and not started yet are
        never started; the coroutines of those started are cancelled (and
        awaited up to :data:`_CANCEL_WAIT_S`). Neither is counted, as a
        sync job left running is not."""
        loop = self._event_loop
        if loop is None:
            return
        import asyncio

        # First the unstarted ones, here: the loop starts no job it has not
        # taken yet, so the cancellation, scheduled after, finds every job
        # it took started.
        unstarted = self._take_handed()
        for job in unstarted:
            self._abandon(job)
        cancelled = 0
        try:
            future: Future[int] = asyncio.run_coroutine_threadsafe(self._cancel_all(), loop)
            cancelled = future.result(_CANCEL_WAIT_S)
        except TimeoutError:
            log.warning(
                "worker %s: the event loop did not run the cancellation of the coroutines "
                "still running within %g s (a coroutine holds it); they are cancelled once "
                "it does, and their jobs left to lapse",
                self._worker_id,
                _CANCEL_WAIT_S,
            )
        except Exception:
            log.warning("could not cancel the coroutines still running", exc_info=True)
        if cancelled or unstarted:
            log.warning(
                "worker %s cancelled %d coroutine(s) still running and did not start %d "
                "async job(s) handed to its event loop; their jobs are left to lapse",
                self._worker_id,
                cancelled,
                len(unstarted),
            )

    async def _cancel_all(self) -> int:
        """On the event loop: cancel every job coroutine; wait (bounded) for
        them to end; return how many were cancelled."""
        import asyncio

        tasks = dict(self._coroutines)
        for token, task in tasks.items():
            self._abandoned.add(token)
            task.cancel()
        if tasks:
            await asyncio.wait(tasks.values(), timeout=_CANCEL_WAIT_S * 0.8)
        return len(tasks)

    def _conclude(
        self,
        handle: JobHandle,
        lease: Lease,
        resolved: _Resolved,
        raised: BaseException | None,
        duration_s: float,
        *,
        returned: object = None,
        watch: JobWatch | None = None,
    ) -> Outcome | None:
        """Record a job's outcome (off the event loop): hand a success to
        the completer, write a retry or a failure; return the outcome, or
        ``None`` when the completer has it. ``returned`` is what the handler
        returned: the job's result when its queue keeps completed jobs."""
        task_name = resolved.task_name
        action: Literal["ack", "retry", "fail"] = "ack"
        error: str | None = None
        delay_s: float | None = None
        exc_info: BaseException | None = None
        if resolved.error is not None:
            action, error = "fail", resolved.error
        elif isinstance(raised, NotRunError):  # its body never ran: no retry runs it (case 012)
            action, error = "fail", str(raised)
        elif isinstance(raised, Fail):
            action, error = "fail", raised.message
        elif isinstance(raised, Retry):
            action, error, delay_s = "retry", raised.message, raised.delay_s
        elif raised is not None:
            action, error, exc_info = "retry", describe_exception(raised), raised
        result: object = None
        if action == "ack" and returned is not None and self._keeps_completed(handle.queue):
            try:
                encode_result(returned)
            except ValidationError as refused:
                action = "fail"
                error = (
                    f"task {task_name!r} returned a value its queue cannot keep as the "
                    f"job's result: {refused}"
                )
            else:
                result = returned
        finished = _Finished(handle, task_name, duration_s, lease, result, watch)
        if action == "ack" and self._completer.add(finished):
            return None  # still heartbeaten until the completer's flush
        # Heartbeaten until the outcome is written, which a passing fault
        # may hold up (case 015); a heartbeat refused from now on is the
        # write's doing, not a lost claim.
        lease.done = True
        writing = time.monotonic()
        try:
            took = write_while_held(
                lambda: self._write_outcome(handle, action, error, delay_s, result),
                [lease],
                f"recording the outcome of job {handle.id} of {handle.queue!r}",
                stop=self._abort,
            )
        except StoreClosedError:
            log.warning(
                "the store closed before the outcome of job %s of %r was recorded; "
                "its claim is left to lapse",
                handle.id,
                handle.queue,
            )
            took = False
        except Exception as exc:
            if _permanent(exc):
                self._give_up(exc)
            log.exception(
                "recording the outcome of job %s of %r failed; its claim is left to lapse",
                handle.id,
                handle.queue,
            )
            took = False
        else:
            if not took and (lease.cancelled or gone_while_held(lease, writing)):
                lease.cancelled = True
        finally:
            self._heartbeater.remove(lease)
        outcome: Outcome
        if not took:
            outcome = "cancelled" if lease.cancelled else "lost"
        elif action == "ack":
            outcome = "succeeded"
        elif action == "fail" or handle.attempts >= handle.max_attempts:
            outcome = "dead"
        else:
            outcome = "retried"
        try:
            self._record(
                handle=handle,
                task_name=task_name,
                outcome=outcome,
                action=action,
                error=error,
                duration_s=duration_s,
                exc_info=exc_info,
                watch=watch,
            )
        except Exception:
            log.exception("logging the outcome of job %s of %r failed", handle.id, handle.queue)
        return outcome

    def _keeps_completed(self, name: str) -> bool:
        """Whether the worker's handle on queue ``name`` keeps completed jobs
        (``QueueOpts.keep_completed_s``), so a handler's return value is kept."""
        queue = self._queues_by_name.get(name) or self._app.queue(name)
        return queue.opts.keep_completed_s is not None

    @staticmethod
    def _write_outcome(
        handle: JobHandle, action: str, error: str | None, delay_s: float | None, result: object
    ) -> bool:
        if action == "ack":
            return handle.ack(result)
        if action == "retry":
            return retry_or_bury(handle, error if error is not None else "retry requested", delay_s)
        return handle.fail(error)

    def _flush_acks(self, batch: list[_Finished]) -> None:
        """The completer's flush: one ``ack_many`` per queue, then each job's
        outcome logged and counted."""
        by_queue: dict[str, list[_Finished]] = {}
        for item in batch:
            by_queue.setdefault(item.handle.queue, []).append(item)
        for name, items in by_queue.items():
            try:
                self._ack_queue_batch(name, items)
            finally:
                for item in items:
                    self._heartbeater.remove(item.lease)

    def _ack_queue_batch(self, name: str, items: list[_Finished]) -> None:
        handles = [item.handle for item in items]
        leases = [item.lease for item in items]
        results: list[object] | None = [item.result for item in items]
        if not any(result is not None for result in results or ()):
            results = None
        for lease in leases:
            # A beat refused from now on is the ack's doing, not a lost claim.
            lease.done = True
        attempts = 0

        def ack(queue: Queue) -> list[bool]:
            nonlocal attempts
            attempts += 1
            return queue.ack_many(handles, results)

        writing = time.monotonic()
        acked: list[bool] | None
        try:
            queue = self._queues_by_name.get(name) or self._app.queue(name)
            acked = write_while_held(
                lambda: ack(queue),
                leases,
                f"acking {len(handles)} finished job(s) of {name!r}",
                stop=self._abort,
            )
        except StoreClosedError:
            log.warning(
                "the store closed before %d finished job(s) of %r were acked; "
                "their claims are left to lapse",
                len(handles),
                name,
            )
            queue, acked = None, None
        except Exception as exc:
            if _permanent(exc):
                self._give_up(exc)
            log.exception(
                "acking %d finished job(s) of %r failed; their claims are left to lapse",
                len(handles),
                name,
            )
            queue, acked = None, None
        log.debug(
            "acked %d of %d finished job(s) of %r in one ack_many",
            sum(acked or ()),
            len(handles),
            name,
            extra={"queue": name, "acked": sum(acked or ()), "batch": len(handles)},
        )
        outcomes = self._ack_outcomes(queue, items, acked, writing, uncertain=attempts > 1)
        with self._cond:
            for outcome in outcomes:
                key = outcome if outcome in ("succeeded", "cancelled") else "lost"
                self._counts[key] += 1
        for item, outcome in zip(items, outcomes, strict=True):
            try:
                self._record(
                    handle=item.handle,
                    task_name=item.task_name,
                    outcome=outcome,
                    action="ack",
                    error=None,
                    duration_s=item.duration_s,
                    exc_info=None,
                    watch=item.watch,
                )
            except Exception:
                log.exception("logging the outcome of job %s of %r failed", item.handle.id, name)

    @staticmethod
    def _ack_outcomes(
        queue: Queue | None,
        items: list[_Finished],
        acked: list[bool] | None,
        writing: float,
        *,
        uncertain: bool,
    ) -> list[str]:
        """Each job's logged outcome after the batch's ``ack_many``
        (docs/contract.md §3 "ack_many(handles)"), which says per claim
        whether its ack took effect.

        ``writing`` is the monotonic instant the ack began; ``uncertain``
        says that an earlier try of it failed, so it may have taken effect
        unseen."""
        if acked is None or queue is None:
            return ["lost"] * len(items)
        outcomes: list[str] = []
        for item, took in zip(items, acked, strict=True):
            if took:
                outcomes.append("succeeded")
            elif item.lease.cancelled:  # known from its refused heartbeat
                outcomes.append("cancelled")
            else:
                # Not acked: a job still in the store lost its claim (it
                # lapsed, and runs again or ran again). One gone was taken by
                # an earlier, failed-looking try of this ack, or removed while
                # the claim held (cancelled), or reclaimed, run and acked
                # elsewhere after the claim lapsed.
                try:
                    present = queue.get_job(item.handle.id) is not None
                except Exception:
                    outcomes.append("unknown")
                    continue
                if present:
                    outcomes.append("lost")
                elif uncertain:
                    outcomes.append("unknown")
                else:
                    outcomes.append("cancelled" if item.lease.held_at(writing) else "lost")
        return outcomes

    def _record(
        self,
        *,
        handle: JobHandle,
        task_name: str,
        outcome: str,
        action: str,
        error: object,
        duration_s: float,
        exc_info: BaseException | None,
        watch: JobWatch | None = None,
    ) -> None:
        if watch is not None:
            watch.finished(outcome, duration_s)
        presence = self._presence
        if presence is not None:
            presence.count(handle.queue, outcome)
        level = {"succeeded": logging.INFO, "cancelled": logging.INFO, "dead": logging.ERROR}.get(
            outcome, logging.WARNING
        )
        if not log.isEnabledFor(level):
            return
        extra: dict[str, Any] = {
            "queue": handle.queue,
            "job_id": handle.id,
            "task": task_name,
            "attempt": handle.attempts,
            "duration_s": duration_s,
            "outcome": outcome,
        }
        where = (
            f"job {handle.id} of {handle.queue!r} ({task_name}) {outcome}: "
            f"attempt {handle.attempts} of {handle.max_attempts}, {duration_s:.3f} s"
        )
        first_line = ("" if error is None else str(error)).split("\n", 1)[0]
        if outcome == "succeeded":
            log.info("%s", where, extra=extra)
        elif outcome == "cancelled":
            log.info(
                "%s; it was cancelled while it ran, so its outcome (%s) was not recorded",
                where,
                action,
                extra=extra,
            )
        elif outcome == "unknown":
            log.warning(
                "%s; the batch that acked it acked only some of its jobs, and this one "
                "is gone from the store: acked by it, or removed just before (cancelled, "
                "or reclaimed and acked elsewhere)",
                where,
                extra=extra,
            )
        elif outcome == "lost":
            log.warning(
                "%s; its outcome (%s) was not recorded: the claim was no longer this "
                "worker's (it lapsed and may have been reclaimed) or recording it failed",
                where,
                action,
                extra=extra,
            )
        elif outcome == "retried":
            log.warning("%s; %s", where, first_line, extra=extra, exc_info=exc_info)
        else:
            if action == "retry":
                first_line = f"{MAX_ATTEMPTS_EXCEEDED}; last error: {first_line}"
            log.error("%s; %s", where, first_line or "failed", extra=extra, exc_info=exc_info)


def _nothing() -> None:
    pass


def _arguments(task: Task[Any, Any], call: TaskCall, lease: Lease) -> list[Any]:
    """The positional arguments of a job's call: its payload's, after the
    job's :class:`JobContext` for a ``takes_context`` task."""
    return [JobContext(lease), *call.args] if task.takes_context else call.args


def _permanent(error: BaseException) -> bool:
    """Whether ``error`` says that retrying cannot help (docs/contract.md §2 "Errors")."""
    return isinstance(error, EngineError) and error.permanent
