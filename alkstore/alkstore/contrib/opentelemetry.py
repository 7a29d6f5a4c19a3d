"""OpenTelemetry for alkstore: a span per job run, linked to the span that
enqueued it, and the queue's metrics (docs/operations.md "Metrics and
telemetry").

Install with ``pip install 'alkstore[opentelemetry]'`` (``opentelemetry-api``
only: the application brings the SDK and its exporters), then::

    from alkstore.contrib.opentelemetry import instrument

    instrument(app)  # the global tracer and meter providers

in the processes that enqueue and in those that run workers (the module that
defines the app is a good place: both import it).

Tracing. Each task enqueue (``task.enqueue``, ``enqueue_many``,
``enqueue_tx`` and the async twins) runs in a ``PRODUCER`` span named
``send <task>``; its context is carried in the job's payload under
``"trace"`` (the global propagator's carrier: W3C ``traceparent`` and
``tracestate`` by default). Each run of a job is a ``CONSUMER`` span named
``process <task>``, the root of a trace of its own, with a link to the
enqueuing span when the payload carries one; it is the current span while
the handler runs, so the spans the handler makes are its children. An
exception the handler raises is recorded on it (``record_exception``) and
sets its status to ``ERROR``, as does a ``dead`` outcome. Attributes:

=============================== =========================================
``messaging.system``            ``"alkstore"``
``messaging.operation.type``    ``"send"`` (enqueue), ``"process"`` (run)
``messaging.destination.name``  the queue
``alkstore.task``               the task's name
``messaging.batch.message_count`` jobs enqueued together (``enqueue_many``)
``messaging.message.id``        the job's id, a ``str`` (run)
``alkstore.job.id``             the job's id, an ``int`` (run)
``alkstore.job.attempt``        its attempt, 1 for the first (run)
``alkstore.job.outcome``        ``succeeded``, ``retried``, ``dead``,
                                ``lost``, ``cancelled`` or ``unknown`` (run)
=============================== =========================================

Metrics (attributes ``messaging.destination.name`` and ``alkstore.task``,
and ``alkstore.job.outcome`` on the run time):

- ``alkstore.jobs.enqueued`` (counter, ``{job}``): jobs enqueued by tasks;
- ``alkstore.jobs.completed``, ``alkstore.jobs.retried``,
  ``alkstore.jobs.dead`` (counters, ``{job}``): runs whose outcome was
  ``succeeded``, ``retried``, ``dead``;
  (the four are observable counters: counted by the observer, reported at
  each collection, which costs a job far less than an SDK ``add()``);
- ``alkstore.job.run_time`` (histogram, ``s``): the handler's run time;
- ``alkstore.job.queue_latency`` (histogram, ``s``): from when the job was
  due (the later of its ``enqueued_at`` and ``run_at``) to the start of its
  run, on the worker's clock.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, propagate, trace
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "alkstore.contrib.opentelemetry needs the OpenTelemetry API: "
        "pip install 'alkstore[opentelemetry]'"
    ) from exc

from alkstore.errors import ValidationError
from alkstore.runtime.observe import COUNTED_OUTCOMES, DURATION_BUCKETS_S, JobStart, Observer

if TYPE_CHECKING:
    from alkstore.runtime.app import App

__all__ = ["OpenTelemetryObserver", "instrument", "uninstrument"]

#: The instrumentation scope's name (tracer and meter).
SCOPE = "alkstore"
SYSTEM = "alkstore"


class _Run:
    """One job run's span, the token detaching it, its metric attributes,
    and whether the handler raised."""

    __slots__ = ("attributes", "raised", "span", "token")

    def __init__(self, span: trace.Span, token: object, attributes: dict[str, str]) -> None:
        self.span = span
        self.token = token
        self.attributes = attributes
        self.raised = False


class OpenTelemetryObserver(Observer):
    """The :class:`~alkstore.runtime.observe.Observer` :func:`instrument`
    adds: spans from ``tracer_provider`` and metrics from
    ``meter_provider`` (each ``None``: the global one, as set by the SDK's
    ``trace.set_tracer_provider`` / ``metrics.set_meter_provider``)."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        from alkstore import __version__

        self._tracer = trace.get_tracer(SCOPE, __version__, tracer_provider)
        meter = metrics.get_meter(SCOPE, __version__, meter_provider)
        # The counters add up here and are observed at each collection: an
        # SDK counter's add() costs several microseconds, a job's whole
        # run not many more (bench/bench_telemetry.py).
        self._counts: dict[tuple[str, str, str], int] = {}  # (counter, queue, task)
        self._counts_lock = threading.Lock()
        for counted, description in [
            ("enqueued", "Jobs enqueued by tasks"),
            *((c, f"Job runs whose outcome was {o}") for o, c in COUNTED_OUTCOMES.items()),
        ]:
            meter.create_observable_counter(
                f"alkstore.jobs.{counted}",
                [functools.partial(self._observe, counted)],
                "{job}",
                description,
            )
        self._run_time = meter.create_histogram(
            "alkstore.job.run_time",
            "s",
            "The handler's run time of each job run",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._queue_latency = meter.create_histogram(
            "alkstore.job.queue_latency",
            "s",
            "Seconds from when a job was due to the start of its run",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )

    @contextlib.contextmanager
    def enqueuing(self, queue: str, task: str, count: int) -> Iterator[Mapping[str, str] | None]:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": queue,
            "alkstore.task": task,
        }
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        with self._tracer.start_as_current_span(
            f"send {task}", kind=trace.SpanKind.PRODUCER, attributes=attributes
        ):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield carrier
        self._count("enqueued", queue, task, count)

    def _count(self, counter: str, queue: str, task: str, count: int = 1) -> None:
        key = (counter, queue, task)
        with self._counts_lock:
            self._counts[key] = self._counts.get(key, 0) + count

    def _observe(
        self, counter: str, _options: metrics.CallbackOptions
    ) -> list[metrics.Observation]:
        with self._counts_lock:
            counts = [(key, n) for key, n in self._counts.items() if key[0] == counter]
        return [
            metrics.Observation(n, {"messaging.destination.name": queue, "alkstore.task": task})
            for (_, queue, task), n in counts
        ]

    def job_started(self, start: JobStart) -> _Run:
        job = start.job
        links: list[trace.Link] = []
        if start.trace is not None:
            carried = trace.get_current_span(propagate.extract(start.trace)).get_span_context()
            if carried.is_valid:
                links.append(trace.Link(carried))
        attributes = {"messaging.destination.name": job.queue, "alkstore.task": start.task}
        # Before the span is current: no exemplar ties each measurement to it.
        self._queue_latency.record(start.queue_latency_s, attributes)
        span = self._tracer.start_span(
            f"process {start.task}",
            # A root: the run is linked to its enqueue, not a child of it
            # (nor of whatever is current on the worker's thread).
            context=otel_context.Context(),
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.message.id": str(job.id),
                "alkstore.job.id": job.id,
                "alkstore.job.attempt": start.attempt,
                **attributes,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        return _Run(span, token, attributes)

    def job_ran(self, token: Any, error: BaseException | None) -> None:
        run: _Run = token
        otel_context.detach(run.token)  # type: ignore[arg-type]
        if error is not None:
            run.raised = True
            run.span.record_exception(error)
            first_line = f"{type(error).__name__}: {error}".split("\n", 1)[0]
            run.span.set_status(trace.Status(trace.StatusCode.ERROR, first_line))

    def job_finished(self, token: Any, outcome: str, run_time_s: float) -> None:
        run: _Run = token
        span = run.span
        span.set_attribute("alkstore.job.outcome", outcome)
        if outcome == "dead" and not run.raised:  # else its error says more
            span.set_status(trace.Status(trace.StatusCode.ERROR, "dead"))
        span.end()
        counted = COUNTED_OUTCOMES.get(outcome)
        if counted is not None:
            attributes = run.attributes
            self._count(
                counted, attributes["messaging.destination.name"], attributes["alkstore.task"]
            )
        self._run_time.record(run_time_s, {**run.attributes, "alkstore.job.outcome": outcome})


def instrument(
    app: App,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> OpenTelemetryObserver:
    """Trace and measure ``app``'s task enqueues and the jobs its workers run
    (the module's docstring lists the spans, attributes and metrics).

    Parameters
    ----------
    app
        The app; its workers already running see it from their next job.
    tracer_provider, meter_provider
        Where spans and metrics go; ``None``: the global providers.

    Returns
    -------
    OpenTelemetryObserver
        The observer added (:meth:`App.add_observer`); give it to
        :func:`uninstrument` to stop.

    Raises
    ------
    ValidationError
        If ``app`` is already instrumented with OpenTelemetry.
    """
    if any(isinstance(o, OpenTelemetryObserver) for o in app.observers):
        raise ValidationError(
            "this app is already instrumented with OpenTelemetry (uninstrument(app) first)"
        )
    observer = OpenTelemetryObserver(tracer_provider, meter_provider)
    app.add_observer(observer)
    return observer


def uninstrument(app: App) -> bool:
    """Stop tracing and measuring ``app`` (runs already started still end
    their spans); return whether it was instrumented."""
    removed = False
    for observer in app.observers:
        if isinstance(observer, OpenTelemetryObserver):
            removed = app.remove_observer(observer) or removed
    return removed
