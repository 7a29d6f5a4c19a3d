"""Telemetry benchmark: what OpenTelemetry and Prometheus cost the worker's drain rate.

Run from the repository root after installing requirements-dev.txt::

    python bench/bench_telemetry.py                   # both engines, about 70 seconds on 2 cores
    python bench/bench_telemetry.py --engine sqlite   # or postgres, or both (default)
    python bench/bench_telemetry.py --jobs 4000       # fewer jobs per side, for a try

The issue's target: "the telemetry costs under 10% of the worker's drain
rate when enabled and nothing when the extra is not installed". Four sides
drain the same jobs through the real worker, in one process, on one store:

* ``none``: the app has no observer (what every app has without the
  extras): the worker's hook is one ``is None`` test per job;
* ``otel``: ``alkstore.contrib.opentelemetry``'s observer with the real
  SDK: a ``TracerProvider`` (every span sampled) whose
  ``BatchSpanProcessor`` hands the spans to an exporter that counts and
  discards them, and a ``MeterProvider`` with an ``InMemoryMetricReader``
  (every instrument aggregated, read once at the end). Its jobs are
  enqueued inside a span, so each payload carries a ``traceparent`` and
  each run extracts it into a link;
* ``otel 10%``: the same with ``TraceIdRatioBased(0.1)``: one job span in
  ten recorded, every metric still measured;
* ``prometheus``: ``alkstore.contrib.prometheus``'s observer (counters and
  histograms of prometheus_client in a registry of its own).

Scenarios: no-op jobs (the task returns at once: the worst case, every
microsecond of telemetry weighs against the worker's own cost per job) at
concurrency 1 and 8, and jobs that sleep ``--work-ms`` (1 ms, standing for
a job's I/O) at the same concurrencies. Each turn, every side (in an order
rotating each turn) enqueues ``--block`` jobs (2,000; for the busy jobs a
quarter of ``--work-jobs``) with ``task.enqueue_many`` under its own
observers (untimed; PostgreSQL: then ``VACUUM ANALYZE`` of the jobs table,
untimed), then times one burst run of ``app.worker(concurrency=C)`` from
``run`` to its return (every job acked), until each side drained
``--jobs`` (20,000; busy jobs ``--work-jobs``, 2,000). A side's rate is its
jobs over the summed time of its runs, so a slow spell of the disk reaches
all sides alike. The target is the ratio, side over ``none``, >= 0.9. Each
run must report every job succeeded, the ``otel`` exporter must have
received one ``process`` span per job (``otel 10%``: some, fewer than half)
and the ``prometheus`` completed counter must equal its jobs: a side that
measured nothing fails the bench.

"Without the extra" is shown, not timed: a fresh interpreter's ``import
alkstore`` (and the worker and the command) loads no ``opentelemetry`` or
``prometheus_client`` module, and the per-job cost of the unused hook (the
attribute read and the test, timed with ``timeit``) is printed beside the
time a job takes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import timeit
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Row, Table
from bench_postgres import Server, add_url_option, sql
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from prometheus_client import CollectorRegistry

import alkstore
from alkstore.contrib import opentelemetry as alk_otel
from alkstore.contrib import prometheus as alk_prom

SIDES = ("none", "otel", "otel 10%", "prometheus")
#: The sides with telemetry, each compared with "none".
ON = SIDES[1:]
QUEUE = "bench"
TASK = "noop"
#: The issue's target: with telemetry on, at least this share of the rate without.
TARGET = 0.9


class Discarding(SpanExporter):
    """Counts the spans handed to it and drops them."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self.count += sum(1 for span in spans if span.name.startswith("process "))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def rotated(turn: int) -> tuple[str, ...]:
    k = turn % len(SIDES)
    return SIDES[k:] + SIDES[:k]


def drain(url: str, n: int, block: int, concurrency: int, work_s: float) -> dict[str, Any]:
    """Each side drains ``block`` jobs per turn until each drained ``n``:
    jobs per second of each, and the spread of the turns' ratios. Each job
    sleeps ``work_s`` (0: returns at once)."""
    postgres = url.startswith("postgres")
    options = {"pool_min_size": concurrency + 3, "pool_max_size": concurrency + 3}
    app = alkstore.App(url, **(options if postgres else {}))

    @app.task(queue=QUEUE, name=TASK)
    def noop(i: int) -> None:
        if work_s:
            time.sleep(work_s)

    exporter = Discarding()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    sampled_exporter = Discarding()
    sampled_provider = TracerProvider(sampler=TraceIdRatioBased(0.1))
    sampled_provider.add_span_processor(BatchSpanProcessor(sampled_exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    registry = CollectorRegistry()
    observers: dict[str, list[Any]] = {
        "none": [],
        "otel": [alk_otel.OpenTelemetryObserver(tracer_provider, meter_provider)],
        "otel 10%": [alk_otel.OpenTelemetryObserver(sampled_provider, meter_provider)],
        "prometheus": [alk_prom.PrometheusObserver(registry)],
    }
    tracer = tracer_provider.get_tracer("bench")
    elapsed = dict.fromkeys(SIDES, 0.0)
    drained = dict.fromkeys(SIDES, 0)
    ratios: dict[str, list[float]] = {side: [] for side in ON}
    with app:
        noop.enqueue_many([[0]])  # the schema, the pool, the statements: warmed untimed
        app.worker(concurrency=concurrency, handle_signals=False).run(burst=True)
        for turn, start in enumerate(range(0, n, block)):
            k = min(block, n - start)
            took: dict[str, float] = {}
            for side in rotated(turn):
                for observer in observers[side]:
                    app.add_observer(observer)
                try:
                    with tracer.start_as_current_span("request"):
                        noop.enqueue_many([[i] for i in range(k)])
                    if postgres:
                        sql(url, "VACUUM ANALYZE alkstore.jobs")
                    worker = app.worker(
                        concurrency=concurrency,
                        handle_signals=False,
                        sweep_interval_s=None,
                        tick_interval_s=None,
                    )
                    begun = time.perf_counter()
                    counts = worker.run(burst=True)
                    took[side] = time.perf_counter() - begun
                finally:
                    for observer in observers[side]:
                        app.remove_observer(observer)
                if counts.succeeded != k or counts.total != k:
                    raise RuntimeError(f"{side}: {counts} for {k} jobs")
                elapsed[side] += took[side]
                drained[side] += k
            for side, turn_ratios in ratios.items():
                turn_ratios.append(took["none"] / took[side])
        # One read of the unused hook, as the worker makes it per job.
        hook_s = min(timeit.repeat("app._observing is None", globals={"app": app}, number=100_000))
    for provider in (tracer_provider, sampled_provider):
        provider.force_flush()
        provider.shutdown()
    meter_provider.shutdown()
    completed = registry.get_sample_value(
        "alkstore_jobs_completed_total", {"queue": QUEUE, "task": TASK}
    )
    if exporter.count != drained["otel"]:
        raise RuntimeError(f"otel: {exporter.count} process spans for {drained['otel']} jobs")
    if not 0 < sampled_exporter.count < drained["otel 10%"] / 2:
        raise RuntimeError(f"otel 10%: {sampled_exporter.count} spans of {drained['otel 10%']}")
    if completed != drained["prometheus"]:
        raise RuntimeError(f"prometheus: {completed} completed for {drained['prometheus']} jobs")
    return {
        "rates": {side: drained[side] / elapsed[side] for side in SIDES},
        "ratios": ratios,
        "hook_ns": hook_s / 100_000 * 1e9,
    }


def imports_without_extras() -> list[str]:
    """The telemetry modules a fresh ``import alkstore`` (with the worker and
    the command) loads: none, is the claim."""
    code = (
        "import sys, alkstore, alkstore.runtime.worker, alkstore.cli\n"
        "print(' '.join(m for m in sys.modules "
        "if m.split('.')[0] in ('opentelemetry', 'prometheus_client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return out.stdout.split()


def main() -> None:
    began = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=20_000, help="per side (20,000)")
    parser.add_argument("--block", type=int, default=2_000, help="per side and turn (2,000)")
    parser.add_argument(
        "--concurrency",
        type=int,
        action="append",
        help="the worker's concurrency for no-op jobs, repeatable (default: 1 and 8)",
    )
    parser.add_argument(
        "--work-ms", type=float, default=1.0, help="the busy jobs' sleep, ms (1; 0: no such row)"
    )
    parser.add_argument("--work-jobs", type=int, default=2_000, help="busy jobs per side (2,000)")
    add_url_option(parser, "a PostgreSQL server URL; a database is made on it and dropped")
    args = parser.parse_args()
    concurrencies = args.concurrency or [1, 8]
    if min(args.jobs, args.block, args.work_jobs, *concurrencies) < 1 or args.work_ms < 0:
        parser.error("--jobs, --block, --work-jobs and --concurrency must be >= 1")
    # (label, jobs, block, concurrency, work_s)
    scenarios = [
        (f"no-op jobs, concurrency {c}", args.jobs, args.block, c, 0.0) for c in concurrencies
    ]
    if args.work_ms:
        scenarios += [
            (
                f"{args.work_ms:g} ms jobs, concurrency {c}",
                args.work_jobs,
                min(args.block, args.work_jobs // 4 or 1),
                c,
                args.work_ms / 1000,
            )
            for c in concurrencies
        ]

    table = Table("", ["none", *(f"{side}/none" for side in ON)])
    about = [f"{os.cpu_count()} cores", f"Python {sys.version.split()[0]}"]
    notes: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="alkstore-bench-telemetry-"))
    server: Server | None = None
    engines: list[tuple[str, Any]] = []
    if args.engine in ("sqlite", "both"):
        about.append(f"SQLite {sqlite3.sqlite_version}")
        engines.append(("SQLite", lambda label: f"sqlite:///{workdir / f'{label}.db'}"))
    if args.engine in ("postgres", "both"):
        try:
            server = Server(args.url)
        except Exception as exc:
            notes.append(f"PostgreSQL: - (cannot use the server at --url: {exc})")
        else:
            pg = server
            about.append(f"PostgreSQL {pg.version.split()[0]} ({pg.settings})")
            engines.append(("PostgreSQL", lambda label: pg.create(f"telemetry_{label}")))
    try:
        for name, fresh in engines:
            for index, (label, jobs, block, c, work_s) in enumerate(scenarios):
                got = drain(fresh(f"s{index}"), jobs, block, c, work_s)
                rates = got["rates"]
                figures = {"none": rates["none"]}
                verdicts = []
                for side in ON:
                    ratio = rates[side] / rates["none"]
                    figures[f"{side}/none"] = ratio
                    verdicts.append(f"{side} {'yes' if ratio >= TARGET else 'NO'}")
                    spread = sorted(got["ratios"][side])
                    notes.append(
                        f"{name}, {label}: {side} {rates[side]:,.0f} jobs/s; {side}/none by "
                        f"turn: min {spread[0]:.2f}, median {spread[len(spread) // 2]:.2f}, "
                        f"max {spread[-1]:.2f}"
                    )
                table.add(
                    Row(
                        f"{name}: drain {jobs:,} {label}",
                        "jobs/s, ratio",
                        figures,
                        f">= {TARGET:.1f}",
                        ", ".join(verdicts),
                    )
                )
                if not work_s:
                    per_job_ns = 1e9 / rates["none"]
                    notes.append(
                        f"{name}, {label}: the unused hook costs {got['hook_ns']:.0f} ns per "
                        f"job (one attribute read and one `is None` test) of {per_job_ns:,.0f} "
                        f"ns a job takes without observers: {got['hook_ns'] / per_job_ns:.4%}"
                    )
    finally:
        if server is not None:
            server.drop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    loaded = imports_without_extras()
    table.title = (
        "The worker's drain rate with no observer beside OpenTelemetry (real SDK, every "
        "span sampled, or 10%) and Prometheus, taking turns in one process; " + ", ".join(about)
    )
    print(table.render())
    print()
    notes.insert(
        0,
        "Without the extras: `import alkstore, alkstore.runtime.worker, alkstore.cli` loads "
        + (
            "no opentelemetry or prometheus_client module (yes)"
            if not loaded
            else f"{', '.join(loaded)} (NO)"
        ),
    )
    for line in notes:
        print(textwrap.fill(line, 100, subsequent_indent="  "))
    print(f"\n(run took {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
