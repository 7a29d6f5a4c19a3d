"""Prometheus metrics for alkstore (docs/operations.md "Metrics and telemetry").

Install with ``pip install 'alkstore[prometheus]'`` (``prometheus_client``).

- :func:`instrument` (app) counts the app's task enqueues and the jobs its
  workers run, the figures :mod:`alkstore.contrib.opentelemetry` measures,
  into a registry (the default one unless given):

  ================================= ========= ==========================
  ``alkstore_jobs_enqueued_total``  counter   ``queue``, ``task``
  ``alkstore_jobs_completed_total`` counter   ``queue``, ``task``
  ``alkstore_jobs_retried_total``   counter   ``queue``, ``task``
  ``alkstore_jobs_dead_total``      counter   ``queue``, ``task``
  ``alkstore_job_run_time_seconds`` histogram ``queue``, ``task``, ``outcome``
  ``alkstore_job_queue_latency_seconds`` histogram ``queue``, ``task``
  ================================= ========= ==========================

  ``completed``, ``retried`` and ``dead`` count runs whose outcome was
  ``succeeded``, ``retried`` and ``dead``; the run time is the handler's,
  labelled with any outcome (``lost``, ``cancelled`` and ``unknown`` too);
  the queue latency runs from when the job was due (the later of its
  ``enqueued_at`` and ``run_at``) to the start of its run, on the worker's
  clock.
- :class:`StoreCollector` (store) reads each queue's counts at each scrape:
  ``alkstore_queue_jobs{queue, state}`` (gauge; ``state`` one of
  ``pending``, ``scheduled``, ``processing``, ``dead``: ``Queue.stats()``)
  and ``alkstore_queue_paused{queue}`` (gauge, 1 or 0).
- :func:`serve` starts prometheus_client's own HTTP server on a thread:
  ``alkstore worker --metrics-port P`` serves a worker's metrics with it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.exposition import start_http_server
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "alkstore.contrib.prometheus needs prometheus_client: pip install 'alkstore[prometheus]'"
    ) from exc

from alkstore.contract.job import QueueStats
from alkstore.runtime.observe import COUNTED_OUTCOMES, DURATION_BUCKETS_S, JobStart, Observer

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from alkstore.contract.queue import Queue
    from alkstore.contract.store import Store
    from alkstore.runtime.app import App

__all__ = ["PrometheusObserver", "StoreCollector", "instrument", "serve"]

#: The states of ``Queue.stats()``, as ``alkstore_queue_jobs``' ``state`` label.
STATES: tuple[str, ...] = QueueStats._fields


class _Metrics(NamedTuple):
    enqueued: Counter
    counted: dict[str, Counter]  # by outcome
    run_time: Histogram
    queue_latency: Histogram


class _Series(NamedTuple):
    """The children of one (queue, task)."""

    queue_latency: Histogram
    counted: dict[str, Counter]  # by outcome
    run_time: dict[str, Histogram]  # by outcome, made as they come
    labels: tuple[str, str]


# One set of metrics per registry: a registry refuses a name twice, and
# every observer on it counts into the same series.
_metrics: weakref.WeakKeyDictionary[CollectorRegistry, _Metrics] = weakref.WeakKeyDictionary()
_metrics_lock = threading.Lock()


def _metrics_of(registry: CollectorRegistry) -> _Metrics:
    with _metrics_lock:
        made = _metrics.get(registry)
        if made is None:
            labels = ("queue", "task")
            made = _Metrics(
                Counter(
                    "alkstore_jobs_enqueued", "Jobs enqueued by tasks", labels, registry=registry
                ),
                {
                    outcome: Counter(
                        f"alkstore_jobs_{counted}",
                        f"Job runs whose outcome was {outcome}",
                        labels,
                        registry=registry,
                    )
                    for outcome, counted in COUNTED_OUTCOMES.items()
                },
                Histogram(
                    "alkstore_job_run_time_seconds",
                    "The handler's run time of each job run",
                    (*labels, "outcome"),
                    registry=registry,
                    buckets=DURATION_BUCKETS_S,
                ),
                Histogram(
                    "alkstore_job_queue_latency_seconds",
                    "Seconds from when a job was due to the start of its run",
                    labels,
                    registry=registry,
                    buckets=DURATION_BUCKETS_S,
                ),
            )
            _metrics[registry] = made
        return made


class PrometheusObserver(Observer):
    """The :class:`~alkstore.runtime.observe.Observer` :func:`instrument`
    adds: counts into ``registry``'s alkstore metrics (made on first use,
    shared by every observer on that registry)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self._metrics = _metrics_of(registry)
        # Each (queue, task)'s children, looked up once: labels() costs
        # more than the observation itself.
        self._series: dict[tuple[str, str], _Series] = {}

    def _series_of(self, queue: str, task: str) -> _Series:
        series = self._series.get((queue, task))
        if series is None:  # two threads may both make it: labels() returns the same children
            m = self._metrics
            series = _Series(
                m.queue_latency.labels(queue, task),
                {outcome: counter.labels(queue, task) for outcome, counter in m.counted.items()},
                {},
                (queue, task),
            )
            self._series[queue, task] = series
        return series

    @contextlib.contextmanager
    def enqueuing(self, queue: str, task: str, count: int) -> Iterator[Mapping[str, str] | None]:
        yield None
        self._metrics.enqueued.labels(queue, task).inc(count)

    def job_started(self, start: JobStart) -> _Series:
        series = self._series_of(start.job.queue, start.task)
        series.queue_latency.observe(start.queue_latency_s)
        return series

    def job_finished(self, token: Any, outcome: str, run_time_s: float) -> None:
        series: _Series = token
        counter = series.counted.get(outcome)
        if counter is not None:
            counter.inc()
        run_time = series.run_time.get(outcome)
        if run_time is None:
            run_time = self._metrics.run_time.labels(*series.labels, outcome)
            series.run_time[outcome] = run_time
        run_time.observe(run_time_s)


def instrument(app: App, registry: CollectorRegistry | None = None) -> PrometheusObserver:
    """Count ``app``'s task enqueues and the jobs its workers run into
    ``registry`` (``None``: prometheus_client's default ``REGISTRY``).

    Returns
    -------
    PrometheusObserver
        The observer added to the app (:meth:`App.add_observer`), or the
        one already there for that registry (instrumenting twice counts
        once).
    """
    registry = REGISTRY if registry is None else registry
    for observer in app.observers:
        if isinstance(observer, PrometheusObserver) and observer.registry is registry:
            return observer
    made = PrometheusObserver(registry)
    app.add_observer(made)
    return made


class StoreCollector:
    """A prometheus_client collector of per-queue gauges, read from
    ``store`` at each scrape: ``alkstore_queue_jobs{queue, state}`` (the
    counts of ``Queue.stats()``) and ``alkstore_queue_paused{queue}``
    (``Queue.is_paused()``, 1 or 0). Register it with
    ``registry.register(StoreCollector(store))``.

    Parameters
    ----------
    store
        The open store (its owner closes it; a scrape after that fails).
    queues
        The queues to report; ``None``: every queue the store has
        (``Store.queue_names()``, read at each scrape).
    always
        With ``queues=None``, queues reported beside the store's even while
        they hold no job (an app's), so their gauges read 0 rather than
        vanish when they drain.

    A scrape costs one ``stats()`` and one ``is_paused()`` per queue, each
    index-driven (docs/operations.md); when one raises
    (``StoreClosedError``, ``EngineError``), the scrape fails with it.
    """

    def __init__(
        self, store: Store, queues: Iterable[str] | None = None, *, always: Iterable[str] = ()
    ) -> None:
        self._store = store
        self._names = None if queues is None else list(queues)
        self._always = frozenset(always)
        self._queues: dict[str, Queue] = {}

    def describe(self) -> list[Metric]:
        """The families, without samples (so registering reads no store)."""
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        """The families with each queue's samples, read now."""
        jobs, paused = self._families()
        if self._names is None:
            names = sorted({*self._store.queue_names(), *self._always})
        else:
            names = self._names
        for name in names:
            queue = self._queues.get(name)
            if queue is None:
                queue = self._queues[name] = self._store.queue(name)
            stats = queue.stats()
            for state in STATES:
                jobs.add_metric([name, state], getattr(stats, state))
            paused.add_metric([name], 1.0 if queue.is_paused() else 0.0)
        yield jobs
        yield paused

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "alkstore_queue_jobs", "Jobs of each queue by state", labels=("queue", "state")
            ),
            GaugeMetricFamily(
                "alkstore_queue_paused",
                "Whether each queue is paused (1) or not (0)",
                labels=("queue",),
            ),
        )


def serve(
    port: int, host: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> WSGIServer:
    """Serve ``registry`` (``None``: the default one) at
    ``http://host:port/metrics`` on a daemon thread, with prometheus_client's
    own server; ``port`` 0 takes a free port (``server.server_port``).
    Stop it with ``server.shutdown()`` then ``server.server_close()``.

    Raises
    ------
    OSError
        When the address cannot be bound (in use, not this host's).
    """
    server, _thread = start_http_server(port, host, REGISTRY if registry is None else registry)
    return server
