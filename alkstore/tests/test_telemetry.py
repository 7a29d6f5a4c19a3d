"""Observers and OpenTelemetry (alkstore.runtime.observe, alkstore.contrib.opentelemetry;
docs/operations.md "Metrics and telemetry"): real workers on real stores,
the real OpenTelemetry SDK with in-memory exporters."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from alkstore import App, Fail, Retry, ValidationError
from alkstore.contrib.opentelemetry import OpenTelemetryObserver, instrument, uninstrument
from alkstore.runtime.observe import JobStart, Observer, payload_trace
from alkstore.runtime.task import parse_task_payload
from alkstore_contract_tests import ManualClock

PG_ENV = "ALKSTORE_TEST_POSTGRES_URL"


@dataclass
class Telemetry:
    """An SDK tracer provider and meter provider, read in memory."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.finished() if s.name.startswith(prefix)]

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name`` (empty when none was recorded)."""
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found.extend(metric.data.data_points)
        return found

    def value(self, name: str, **attributes: str) -> float:
        """The summed value (counters) or count (histograms) of ``name``'s
        points whose attributes include ``attributes``."""
        total = 0.0
        for point in self.points(name):
            if all(point.attributes.get(k) == v for k, v in attributes.items()):
                total += point.count if hasattr(point, "count") else point.value
        return total


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Telemetry(spans, reader, tracer_provider, meter_provider)
    tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    with App(f"sqlite:///{tmp_path / 'telemetry.db'}") as made:
        yield made


def _instrument(app: App, telemetry: Telemetry) -> OpenTelemetryObserver:
    return instrument(
        app, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )


def _burst(app: App, **options: Any) -> Any:
    options.setdefault("handle_signals", False)
    return app.worker(sweep_interval_s=None, tick_interval_s=None, **options).run(burst=True)


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# -- spans ---------------------------------------------------------------------------


def _check_linked_run(app: App, telemetry: Telemetry) -> None:
    """One job enqueued inside a span and run by a burst worker: the
    enqueue's PRODUCER span is a child of the caller's, the run's CONSUMER
    span a root linked to it, the handler's span a child of the run's."""
    tracer = telemetry.tracer_provider.get_tracer("test")

    @app.task(queue="mail", name="send")
    def send(to: str) -> None:
        with tracer.start_as_current_span("inside"):
            pass

    _instrument(app, telemetry)
    with tracer.start_as_current_span("request") as request:
        job_id = send.enqueue("ada@example.com")
    stored = app.queue("mail").get_job(job_id)
    assert stored is not None
    sent = telemetry.named("send ")
    assert [s.name for s in sent] == ["send send"]
    producer = sent[0]
    assert producer.kind is trace.SpanKind.PRODUCER
    assert producer.parent is not None
    assert producer.parent.span_id == request.get_span_context().span_id
    assert _attrs(producer) == {
        "messaging.system": "alkstore",
        "messaging.operation.type": "send",
        "messaging.destination.name": "mail",
        "alkstore.task": "send",
    }
    # The W3C context of the producer span travels in the payload.
    carried = payload_trace(stored.payload)
    assert carried is not None
    ctx = producer.get_span_context()
    assert (
        carried["traceparent"]
        == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    )
    assert parse_task_payload(stored.payload) == ("send", ["ada@example.com"], {})

    assert _burst(app).succeeded == 1
    (run,) = telemetry.named("process ")
    assert run.name == "process send"
    assert run.kind is trace.SpanKind.CONSUMER
    assert run.parent is None  # a root, linked to the enqueue
    assert run.context.trace_id != ctx.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in run.links] == [
        (ctx.trace_id, ctx.span_id)
    ]
    assert _attrs(run) == {
        "messaging.system": "alkstore",
        "messaging.operation.type": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job_id),
        "alkstore.task": "send",
        "alkstore.job.id": job_id,
        "alkstore.job.attempt": 1,
        "alkstore.job.outcome": "succeeded",
    }
    assert run.status.status_code is trace.StatusCode.UNSET
    (inside,) = telemetry.named("inside")
    assert inside.parent is not None
    assert inside.parent.span_id == run.context.span_id
    assert telemetry.value("alkstore.jobs.enqueued", **{"alkstore.task": "send"}) == 1
    assert telemetry.value("alkstore.jobs.completed", **{"messaging.destination.name": "mail"}) == 1


def test_a_job_run_is_a_span_linked_to_the_span_that_enqueued_it(
    app: App, telemetry: Telemetry
) -> None:
    _check_linked_run(app, telemetry)


@pytest.mark.postgres
def test_a_job_run_is_linked_to_its_enqueue_on_postgresql(telemetry: Telemetry) -> None:
    url = os.environ.get(PG_ENV)
    if not url:
        if os.environ.get("ALKSTORE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{PG_ENV} is not set (ALKSTORE_REQUIRE_POSTGRES=1)")
        pytest.skip(f"{PG_ENV} is not set")
    import psycopg
    from psycopg import sql

    schema = f"telemetry_{os.getpid()}_{time.monotonic_ns()}"
    try:
        with App(url, schema=schema) as app:
            _check_linked_run(app, telemetry)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_outcomes_are_span_attributes_and_counted(app: App, telemetry: Telemetry) -> None:
    """Completed, retried (then dead at its last attempt) and failed jobs:
    their outcome, attempt and error on their spans; each counter."""

    @app.task(queue="q", name="fine")
    def fine() -> int:
        return 1

    @app.task(queue="q", name="flaky", max_attempts=2)
    def flaky() -> None:
        raise Retry("not yet", delay=0)

    @app.task(queue="q", name="broken")
    def broken() -> None:
        raise Fail("gave up")

    _instrument(app, telemetry)
    fine.enqueue()
    flaky_id = flaky.enqueue()
    broken.enqueue()
    counts = _burst(app)
    assert (counts.succeeded, counts.retried, counts.dead) == (1, 1, 2)

    runs = {
        (_attrs(s)["alkstore.task"], _attrs(s)["alkstore.job.attempt"]): s
        for s in telemetry.named("process ")
    }
    assert sorted(runs) == [("broken", 1), ("fine", 1), ("flaky", 1), ("flaky", 2)]
    outcomes = {key: _attrs(span)["alkstore.job.outcome"] for key, span in runs.items()}
    assert outcomes == {
        ("broken", 1): "dead",
        ("fine", 1): "succeeded",
        ("flaky", 1): "retried",
        ("flaky", 2): "dead",
    }
    assert _attrs(runs["flaky", 2])["alkstore.job.id"] == flaky_id
    for key in [("broken", 1), ("flaky", 1), ("flaky", 2)]:
        span = runs[key]
        assert span.status.status_code is trace.StatusCode.ERROR
        (event,) = span.events
        assert event.name == "exception"
        expected = "Fail" if key[0] == "broken" else "Retry"
        assert (event.attributes or {})["exception.type"] == f"alkstore.runtime.outcome.{expected}"
    assert runs["broken", 1].status.description == "Fail: gave up"
    assert runs["fine", 1].status.status_code is trace.StatusCode.UNSET
    assert not runs["fine", 1].events

    assert telemetry.value("alkstore.jobs.enqueued") == 3
    assert telemetry.value("alkstore.jobs.completed") == 1
    assert telemetry.value("alkstore.jobs.retried") == 1
    assert telemetry.value("alkstore.jobs.dead") == 2
    assert telemetry.value("alkstore.jobs.dead", **{"alkstore.task": "flaky"}) == 1
    assert telemetry.value("alkstore.job.run_time") == 4
    assert telemetry.value("alkstore.job.run_time", **{"alkstore.job.outcome": "dead"}) == 2
    assert telemetry.value("alkstore.job.queue_latency") == 4


def test_a_payload_naming_no_task_is_a_dead_span(app: App, telemetry: Telemetry) -> None:
    @app.task(queue="q", name="known")
    def known() -> None:
        pass

    _instrument(app, telemetry)
    app.queue("q").enqueue({"task": "nobody"})
    assert _burst(app).dead == 1
    (run,) = telemetry.named("process ")
    assert run.name == "process nobody"
    assert _attrs(run)["alkstore.job.outcome"] == "dead"
    assert run.status.status_code is trace.StatusCode.ERROR
    assert telemetry.value("alkstore.jobs.dead", **{"alkstore.task": "nobody"}) == 1


def test_queue_latency_runs_from_when_the_job_was_due(tmp_path: Path, telemetry: Telemetry) -> None:
    """The store's clock stands at a known past instant: the job was due
    then, so its latency is the worker's clock's now less that instant."""
    due = datetime(2020, 1, 1, tzinfo=UTC)
    with App(f"sqlite:///{tmp_path / 'clock.db'}", clock=ManualClock(due)) as app:

        @app.task(queue="q", name="t")
        def t() -> None:
            pass

        _instrument(app, telemetry)
        t.enqueue()
        before = time.time()
        _burst(app)
        after = time.time()
    (point,) = telemetry.points("alkstore.job.queue_latency")
    assert point.count == 1
    assert before - due.timestamp() <= point.sum <= after - due.timestamp()
    assert dict(point.attributes) == {"messaging.destination.name": "q", "alkstore.task": "t"}


def test_enqueue_many_is_one_span_every_job_links_to(app: App, telemetry: Telemetry) -> None:
    @app.task(queue="q", name="each")
    def each(n: int) -> None:
        pass

    _instrument(app, telemetry)
    each.enqueue_many([[1], [2], [3]])
    (producer,) = telemetry.named("send ")
    assert _attrs(producer)["messaging.batch.message_count"] == 3
    assert _burst(app).succeeded == 3
    runs = telemetry.named("process ")
    assert len(runs) == 3
    for run in runs:
        assert [link.context.span_id for link in run.links] == [producer.context.span_id]
    assert telemetry.value("alkstore.jobs.enqueued", **{"alkstore.task": "each"}) == 3


def test_a_failed_enqueue_is_an_error_span_and_not_counted(app: App, telemetry: Telemetry) -> None:
    @app.task(queue="q", name="t")
    def t(x: object) -> None:
        pass

    _instrument(app, telemetry)
    with pytest.raises(ValidationError):
        t.enqueue(float("nan"))  # not strict JSON: the codec refuses it
    (producer,) = telemetry.named("send ")
    assert producer.status.status_code is trace.StatusCode.ERROR
    assert telemetry.value("alkstore.jobs.enqueued") == 0


def test_unique_keys_ignore_the_carried_context(app: App, telemetry: Telemetry) -> None:
    @app.task(queue="q", name="once", unique_key=True)
    def once(n: int) -> None:
        pass

    _instrument(app, telemetry)
    tracer = telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("a"):
        first = once.enqueue(1)
    with tracer.start_as_current_span("b"):
        second = once.enqueue(1)
    assert first == second
    job = app.queue("q").get_job(first)
    assert job is not None
    assert job.unique_key == once.unique_key_of([1], {})


def test_async_jobs_run_in_their_span_under_run_and_run_async(
    app: App, telemetry: Telemetry
) -> None:
    tracer = telemetry.tracer_provider.get_tracer("test")

    @app.task(queue="q", name="coro")
    async def coro(n: int) -> None:
        await asyncio.sleep(0)
        with tracer.start_as_current_span(f"inside {n}"):
            await asyncio.sleep(0)

    _instrument(app, telemetry)
    coro.enqueue(1)
    assert _burst(app, concurrency=4).succeeded == 1  # run(): the worker's own loop

    async def main() -> None:
        await coro.aenqueue(2)
        worker = app.worker(concurrency=4, sweep_interval_s=None, tick_interval_s=None)
        assert (await worker.run_async(burst=True)).succeeded == 1
        await app.aclose()

    asyncio.run(main())
    runs = {_attrs(s)["alkstore.job.id"]: s for s in telemetry.named("process ")}
    assert len(runs) == 2
    producers = {s.context.span_id for s in telemetry.named("send ")}
    for n in (1, 2):
        (inside,) = telemetry.named(f"inside {n}")
        assert inside.parent is not None
        run = next(s for s in runs.values() if s.context.span_id == inside.parent.span_id)
        assert _attrs(run)["alkstore.job.outcome"] == "succeeded"
        (link,) = run.links
        assert link.context.span_id in producers
    assert telemetry.value("alkstore.jobs.completed", **{"alkstore.task": "coro"}) == 2


# -- the observer hook ----------------------------------------------------------------


class _Raising(Observer):
    def enqueuing(self, queue: str, task: str, count: int) -> AbstractContextManager[None]:
        raise RuntimeError("observer bug")

    def job_started(self, start: JobStart) -> object:
        raise RuntimeError("observer bug")


class _Recording(Observer):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def enqueuing(self, queue: str, task: str, count: int) -> AbstractContextManager[Any]:
        self.events.append(("enqueuing", queue, task, count))
        return nullcontext({"k": "v"})

    def job_started(self, start: JobStart) -> object:
        self.events.append(("started", start.task, start.attempt, dict(start.trace or {})))
        return "token"

    def job_ran(self, token: Any, error: BaseException | None) -> None:
        self.events.append(("ran", token, type(error).__name__ if error else None))

    def job_finished(self, token: Any, outcome: str, run_time_s: float) -> None:
        self.events.append(("finished", token, outcome))


def test_a_raising_observer_breaks_neither_enqueues_nor_jobs(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(queue="q", name="t")
    def t() -> None:
        pass

    recording = _Recording()
    app.add_observer(_Raising())
    app.add_observer(recording)
    job_id = t.enqueue()
    job = app.queue("q").get_job(job_id)
    assert job is not None
    assert job.payload["trace"] == {"k": "v"}
    assert _burst(app).succeeded == 1
    assert recording.events == [
        ("enqueuing", "q", "t", 1),
        ("started", "t", 1, {"k": "v"}),
        ("ran", "token", None),
        ("finished", "token", "succeeded"),
    ]
    assert "raised in enqueuing; ignored" in caplog.text
    assert "raised in job_started; ignored" in caplog.text


class _FailsLeaving(Observer):
    """Raises when the enqueue it wraps ends; or, with ``swallow``, says it
    handled the enqueue's exception (a context manager returning True)."""

    def __init__(self, swallow: bool = False) -> None:
        self.swallow = swallow

    def enqueuing(
        self, queue: str, task: str, count: int
    ) -> AbstractContextManager[dict[str, str] | None]:
        observer = self

        class Leaving:
            def __enter__(self) -> None:
                return None

            def __exit__(self, *exc: object) -> bool:
                if observer.swallow:
                    return True
                raise RuntimeError("exporter down")

        return Leaving()


def test_an_observer_failing_after_the_enqueue_neither_fails_it_nor_hides_its_error(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """The job is stored: the caller gets its id, not the observer's error
    (a retry would enqueue it twice); and an observer cannot swallow the
    enqueue's own error."""

    @app.task(queue="q", name="t")
    def t(n: int) -> None:
        pass

    app.add_observer(_FailsLeaving())
    job_id = t.enqueue(1)
    assert app.queue("q").get_job(job_id) is not None
    assert "raised leaving enqueuing; ignored" in caplog.text
    app.add_observer(_FailsLeaving(swallow=True))
    with pytest.raises(ValidationError):
        t.enqueue(float("nan"))  # not JSON: the enqueue raises
    assert app.queue("q").stats().pending == 1


def test_observers_are_added_once_and_removed(app: App, telemetry: Telemetry) -> None:
    @app.task(queue="q", name="t")
    def t() -> None:
        pass

    assert app.observers == ()
    observer = _instrument(app, telemetry)
    assert app.observers == (observer,)
    with pytest.raises(ValidationError, match="already instrumented"):
        _instrument(app, telemetry)
    with pytest.raises(ValidationError, match="already added"):
        app.add_observer(observer)
    with pytest.raises(ValidationError, match=r"must be an alkstore\.runtime\.observe\.Observer"):
        app.add_observer(object())  # type: ignore[arg-type]
    assert uninstrument(app)
    assert not uninstrument(app)
    assert app.observers == ()
    job = app.queue("q").get_job(t.enqueue())
    assert job is not None
    assert job.payload == {"task": "t", "args": [], "kwargs": {}}  # nothing carried
    assert _burst(app).succeeded == 1
    assert telemetry.finished() == []


def test_the_payload_parser_ignores_the_carried_context() -> None:
    payload = {"task": "t", "args": [1], "kwargs": {}, "trace": {"traceparent": "x"}}
    assert parse_task_payload(payload) == ("t", [1], {})
    assert payload_trace(payload) == {"traceparent": "x"}
    for bad in (None, "x", {"traceparent": 1}, {}, [1]):
        assert payload_trace({"task": "t", "trace": bad}) is None
    assert payload_trace([1]) is None


def test_import_alkstore_imports_no_telemetry_library() -> None:
    code = (
        "import sys, alkstore, alkstore.runtime.worker, alkstore.cli\n"
        "found = [m for m in sys.modules if m.split('.')[0] in "
        "('opentelemetry', 'prometheus_client')]\n"
        "assert not found, found\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
