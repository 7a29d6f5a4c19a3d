"""Prometheus metrics (alkstore.contrib.prometheus; docs/operations.md
"Metrics and telemetry"): a real worker on a real SQLite file, real HTTP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry

from alkstore import App, Fail, Retry, StoreClosedError
from alkstore.contrib.prometheus import StoreCollector, instrument, serve
from alkstore_contract_tests import ManualClock

WAIT_S = 30.0


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    with App(f"sqlite:///{tmp_path / 'prometheus.db'}") as made:
        yield made


def _burst(app: App) -> object:
    return app.worker(handle_signals=False, sweep_interval_s=None, tick_interval_s=None).run(
        burst=True
    )


def test_a_workers_jobs_are_counted_and_timed(app: App) -> None:
    @app.task(queue="q", name="fine")
    def fine() -> None:
        pass

    @app.task(queue="q", name="flaky", max_attempts=2)
    def flaky() -> None:
        raise Retry("not yet", delay=0)

    @app.task(queue="q", name="broken")
    def broken() -> None:
        raise Fail("no")

    registry = CollectorRegistry()
    observer = instrument(app, registry)
    assert instrument(app, registry) is observer  # once per registry
    fine.enqueue_many([[], []])
    flaky.enqueue()
    broken.enqueue()
    _burst(app)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("alkstore_jobs_enqueued_total", queue="q", task="fine") == 2
    assert sample("alkstore_jobs_enqueued_total", queue="q", task="flaky") == 1
    assert sample("alkstore_jobs_completed_total", queue="q", task="fine") == 2
    assert sample("alkstore_jobs_retried_total", queue="q", task="flaky") == 1
    assert sample("alkstore_jobs_dead_total", queue="q", task="flaky") == 1
    assert sample("alkstore_jobs_dead_total", queue="q", task="broken") == 1
    assert sample("alkstore_jobs_completed_total", queue="q", task="broken") == 0
    run_time = "alkstore_job_run_time_seconds_count"
    assert sample(run_time, queue="q", task="fine", outcome="succeeded") == 2
    assert sample(run_time, queue="q", task="flaky", outcome="retried") == 1
    assert sample(run_time, queue="q", task="flaky", outcome="dead") == 1
    latency = "alkstore_job_queue_latency_seconds_count"
    assert sample(latency, queue="q", task="fine") == 2
    assert sample(latency, queue="q", task="flaky") == 2
    # The buckets reach an hour: latencies of minutes are told apart.
    assert (
        sample("alkstore_job_queue_latency_seconds_bucket", queue="q", task="fine", le="3600.0")
        == 2
    )


def test_the_queue_latency_is_measured_from_when_the_job_was_due(tmp_path: Path) -> None:
    due = datetime(2020, 1, 1, tzinfo=UTC)
    with App(f"sqlite:///{tmp_path / 'clock.db'}", clock=ManualClock(due)) as app:

        @app.task(queue="q", name="t")
        def t() -> None:
            pass

        registry = CollectorRegistry()
        instrument(app, registry)
        t.enqueue()
        before = time.time()
        _burst(app)
        after = time.time()
    total = registry.get_sample_value(
        "alkstore_job_queue_latency_seconds_sum", {"queue": "q", "task": "t"}
    )
    assert total is not None
    assert before - due.timestamp() <= total <= after - due.timestamp()


def test_the_store_collector_gives_each_queues_counts(app: App) -> None:
    @app.task(queue="mail", name="send")
    def send() -> None:
        raise Fail("no")

    @app.task(queue="later", name="later")
    def later() -> None:
        pass

    registry = CollectorRegistry()
    registry.register(StoreCollector(app.store))
    send.enqueue()
    _burst(app)  # dead
    send.enqueue()
    send.enqueue()
    later.options(delay=3600).enqueue()
    app.queue("later").pause()

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("alkstore_queue_jobs", queue="mail", state="pending") == 2
    assert sample("alkstore_queue_jobs", queue="mail", state="dead") == 1
    assert sample("alkstore_queue_jobs", queue="mail", state="processing") == 0
    assert sample("alkstore_queue_jobs", queue="mail", state="scheduled") == 0
    assert sample("alkstore_queue_jobs", queue="later", state="scheduled") == 1
    assert sample("alkstore_queue_paused", queue="later") == 1
    assert sample("alkstore_queue_paused", queue="mail") == 0

    only = CollectorRegistry()
    only.register(StoreCollector(app.store, ["mail"]))
    assert only.get_sample_value("alkstore_queue_jobs", {"queue": "mail", "state": "dead"}) == 1
    assert only.get_sample_value("alkstore_queue_paused", {"queue": "later"}) is None


def test_registering_the_store_collector_reads_no_store(tmp_path: Path) -> None:
    with App(f"sqlite:///{tmp_path / 'closed.db'}") as app:
        store = app.store
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))  # describe(): no read of the closed store
    with pytest.raises(StoreClosedError):
        registry.get_sample_value("alkstore_queue_jobs", {"queue": "q", "state": "pending"})


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=WAIT_S) as response:
        return str(response.read().decode())


def test_serve_answers_over_http(app: App) -> None:
    app.queue("mail").enqueue({"task": "x"})
    registry = CollectorRegistry()
    registry.register(StoreCollector(app.store))
    server = serve(0, registry=registry)
    try:
        text = _get(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert 'alkstore_queue_jobs{queue="mail",state="pending"} 1.0' in text
    assert "# TYPE alkstore_queue_paused gauge" in text


JOBS = """
import alkstore

app = alkstore.App()

@app.task(queue="mail", name="send")
def send(to):
    pass
"""


def test_the_worker_command_serves_its_metrics(tmp_path: Path) -> None:
    """``alkstore worker --metrics-port 0`` serves /metrics over HTTP while
    it runs; a job it ran is counted there."""
    (tmp_path / "jobs.py").write_text(JOBS)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    environ["ALKSTORE_URL"] = url
    with App(url) as app:
        app.queue("mail").enqueue({"task": "send", "args": ["ada"]})
    worker = subprocess.Popen(
        [sys.executable, "-m", "alkstore", "worker", "jobs:app", "--metrics-port", "0"],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        port = None
        for line in worker.stderr:
            found = re.search(r"serving metrics at http://127\.0\.0\.1:(\d+)/metrics", line)
            if found:
                port = int(found.group(1))
                break
        assert port, "the worker did not say where it serves its metrics"
        wanted = 'alkstore_jobs_completed_total{queue="mail",task="send"} 1.0'
        deadline = time.monotonic() + WAIT_S
        while wanted not in (text := _get(f"http://127.0.0.1:{port}/metrics")):
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
        assert (
            'alkstore_job_run_time_seconds_count{outcome="succeeded",queue="mail",task="send"} 1.0'
            in text
        )
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=WAIT_S)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    with pytest.raises(urllib.error.URLError, match="refused"):  # stopped with the worker
        _get(f"http://127.0.0.1:{port}/metrics")


def test_the_worker_command_refuses_a_port_in_use(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    server = serve(0, registry=CollectorRegistry())
    try:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "alkstore",
                "--url",
                f"sqlite:///{tmp_path / 'jobs.db'}",
                "worker",
                "jobs:app",
                "--burst",
                "--metrics-port",
                str(server.server_port),
            ],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 1, result.stderr
    assert f"--metrics-port: cannot serve on 127.0.0.1:{server.server_port}" in result.stderr
