"""Observers: how integrations see tasks being enqueued and jobs running
(docs/operations.md "Metrics and telemetry").

An :class:`Observer` is registered on an :class:`~alkstore.App` with
:meth:`App.add_observer`; :mod:`alkstore.contrib.opentelemetry` and
:mod:`alkstore.contrib.prometheus` are two. With none registered, the
enqueue paths of :class:`~alkstore.Task` and the :class:`~alkstore.Worker`
pay one ``is None`` test per call or job, and nothing here imports a
telemetry library.

The hooks, in order, for a task enqueued and one run of its job:

1. :meth:`Observer.enqueuing` wraps the enqueue (``enqueue``,
   ``enqueue_many``, ``enqueue_tx`` and their async twins); what it yields
   (a ``dict`` of ``str`` to ``str``, e.g. W3C ``traceparent`` and
   ``tracestate``) is carried in each payload under :data:`TRACE_KEY`;
2. :meth:`Observer.job_started`, on the thread (or in the coroutine) that
   runs the handler, right before it: gets a :class:`JobStart` (the job,
   its task, its attempt, its queue latency, the carried context) and
   returns a token, anything;
3. :meth:`Observer.job_ran`, on that same thread (or coroutine), right
   after the handler returned or raised, with what it raised;
4. :meth:`Observer.job_finished`, on any of the worker's threads, once the
   outcome is known (for a success, when the completer's batch ack took
   effect): the outcome as the worker logs it and the handler's run time.

The worker and the tasks call observers through :class:`Observers`, which
catches and logs whatever an observer raises: an observer cannot fail a job
or an enqueue. (An exception raised by the body of an enqueue is re-raised,
after each observer's ``enqueuing`` has seen it.)
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:
    from alkstore.contract.handle import JobHandle

__all__ = [
    "COUNTED_OUTCOMES",
    "DURATION_BUCKETS_S",
    "TRACE_KEY",
    "JobStart",
    "JobWatch",
    "Observer",
    "Observers",
    "payload_trace",
    "queue_latency_s",
]

log = logging.getLogger("alkstore.observe")

#: The key of a task payload (``{"task", "args", "kwargs"}``) under which
#: the context an observer carries from the enqueue to the job travels: a
#: JSON object of strings (for OpenTelemetry, the propagator's carrier:
#: ``traceparent``, ``tracestate``). Workers without observers ignore it.
TRACE_KEY: Final = "trace"

#: The bucket bounds, in seconds, of the run time and queue latency
#: histograms of :mod:`alkstore.contrib.opentelemetry` and
#: :mod:`alkstore.contrib.prometheus`: 5 ms to an hour.
DURATION_BUCKETS_S: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)

#: The outcomes :meth:`Observer.job_finished` counts as completed, retried
#: and dead (the others, ``lost``, ``cancelled`` and ``unknown``, only
#: reach the run time histograms).
COUNTED_OUTCOMES: Final = {"succeeded": "completed", "retried": "retried", "dead": "dead"}


def payload_trace(payload: object) -> dict[str, str] | None:
    """The context carried in a task payload under :data:`TRACE_KEY`:
    a ``dict`` of ``str`` to ``str``, or ``None`` when there is none or
    it is not one (a malformed one is ignored, never fatal to the job)."""
    if not isinstance(payload, dict):
        return None
    carried = payload.get(TRACE_KEY)
    if not isinstance(carried, dict) or not carried:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in carried.items()):
        return None
    return carried


def queue_latency_s(job: JobHandle, now: float) -> float:
    """Seconds the job waited to start: from when it was due, the later of
    its ``enqueued_at`` and ``run_at`` (a delayed or retried job waits from
    its ``run_at``), to ``now`` (a POSIX timestamp on the worker's clock);
    ``0.0`` when the worker's clock is behind the store's."""
    due = max(job.enqueued_at, job.run_at).timestamp()
    return max(0.0, now - due)


class JobStart(NamedTuple):
    """What :meth:`Observer.job_started` is told about a job about to run.

    Attributes
    ----------
    job
        The claimed job (``job.queue``, ``job.id``, ``job.payload`` ...).
    task
        The task name its payload gives (``"?"`` when the payload names
        none; the job is dead-lettered without running).
    attempt
        Its attempt, ``1`` for the first claim (``job.attempts``).
    queue_latency_s
        Seconds from when it was due to now (:func:`queue_latency_s`).
    trace
        The context carried from its enqueue (:func:`payload_trace`), or
        ``None``.
    """

    job: JobHandle
    task: str
    attempt: int
    queue_latency_s: float
    trace: Mapping[str, str] | None


class Observer:
    """Hooks called around enqueues and job runs; each does nothing here.

    Subclass it and override the hooks wanted; register the instance with
    :meth:`App.add_observer`. Hooks are called from many threads at once
    (the worker's handler threads, its completer, the enqueuing threads)
    and must be thread-safe; they run inline, so keep them fast. What a
    hook raises is logged on the ``alkstore.observe`` logger and ignored.
    """

    def enqueuing(
        self, queue: str, task: str, count: int
    ) -> contextlib.AbstractContextManager[Mapping[str, str] | None]:
        """A context manager around the enqueue of ``count`` jobs of
        ``task`` on ``queue`` (``count`` > 1 for ``enqueue_many``): it is
        entered before the store is called and exited after (with the
        exception, when the enqueue raised). What it yields, if not
        ``None`` or empty, is carried in every payload under
        :data:`TRACE_KEY` (merged with the other observers')."""
        return contextlib.nullcontext()

    def job_started(self, start: JobStart) -> Any:
        """A job's handler is about to run; return a token, passed to
        :meth:`job_ran` and :meth:`job_finished`."""
        return None

    def job_ran(self, token: Any, error: BaseException | None) -> None:
        """The handler returned (``error`` is ``None``) or raised ``error``;
        called on the thread, or in the coroutine, that called
        :meth:`job_started`. For a job whose payload names no task of the
        app (dead without running), ``error`` is ``None`` too."""

    def job_finished(self, token: Any, outcome: str, run_time_s: float) -> None:
        """The job's outcome is known: ``"succeeded"`` (acked),
        ``"retried"``, ``"dead"``, ``"lost"`` (the claim was no longer
        this worker's, or left to lapse), ``"cancelled"`` or ``"unknown"``
        (as the worker logs them, docs/tasks-and-workers.md);
        ``run_time_s`` is the handler's run time in seconds. Called once
        per :meth:`job_started`, from any of the worker's threads."""


class JobWatch:
    """One job's observation by every observer of its app (the worker's
    side of :class:`Observers`)."""

    __slots__ = ("_started",)

    def __init__(self, started: list[tuple[Observer, Any]]) -> None:
        # Each observer whose job_started returned, with its token.
        self._started = started

    def ran(self, error: BaseException | None) -> None:
        """After the handler, on its thread or in its coroutine."""
        for observer, token in self._started:
            try:
                observer.job_ran(token, error)
            except Exception:
                log.exception("observer %r raised in job_ran; ignored", observer)

    def finished(self, outcome: str, run_time_s: float) -> None:
        """Once the outcome is known."""
        for observer, token in self._started:
            try:
                observer.job_finished(token, outcome, run_time_s)
            except Exception:
                log.exception("observer %r raised in job_finished; ignored", observer)


class Observers:
    """The observers of an app, in registration order (immutable: the app
    makes a new one on each change, so readers need no lock)."""

    __slots__ = ("all",)

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.all: tuple[Observer, ...] = tuple(observers)

    @contextlib.contextmanager
    def enqueuing(self, queue: str, task: str, payloads: list[dict[str, Any]]) -> Iterator[None]:
        """Around the enqueue of ``payloads`` (task payloads, changed in
        place: each gets the carried context under :data:`TRACE_KEY`)."""
        entered: list[tuple[Observer, contextlib.AbstractContextManager[Any]]] = []
        carried: dict[str, str] = {}
        for observer in self.all:
            try:
                manager = observer.enqueuing(queue, task, len(payloads))
                got = manager.__enter__()
            except Exception:
                log.exception("observer %r raised in enqueuing; ignored", observer)
                continue
            entered.append((observer, manager))
            if got:
                carried.update(got)
        if carried:
            for payload in payloads:
                payload[TRACE_KEY] = carried
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            # Each sees the enqueue's end, in reverse order; none can change
            # it: what an exit raises is logged, and its return value (which
            # would swallow the enqueue's error) is ignored.
            for observer, manager in reversed(entered):
                try:
                    if error is None:
                        manager.__exit__(None, None, None)
                    else:
                        manager.__exit__(type(error), error, error.__traceback__)
                except Exception:
                    log.exception("observer %r raised leaving enqueuing; ignored", observer)

    def job_started(self, job: JobHandle, task: str) -> JobWatch:
        """Before a job's handler runs, on its thread or in its coroutine."""
        start = JobStart(
            job, task, job.attempts, queue_latency_s(job, time.time()), payload_trace(job.payload)
        )
        started: list[tuple[Observer, Any]] = []
        for observer in self.all:
            try:
                started.append((observer, observer.job_started(start)))
            except Exception:
                log.exception("observer %r raised in job_started; ignored", observer)
        return JobWatch(started)
