"""Fixtures of the dashboard's tests: per engine (SQLite on a temporary
file; PostgreSQL on a fresh schema of ``ALKSTORE_TEST_POSTGRES_URL``, which
skips without it, or fails under ``ALKSTORE_REQUIRE_POSTGRES=1``), one store
with real jobs run by a real worker on a thread, and two live dashboards
on it, served by uvicorn: one read-only, one with actions.

The store holds, in queue ``mail`` (served by the worker): completed
``send`` jobs (results kept), a ``boom`` job of the hostile payload that
died, a scheduled job whose payload is the hostile one; in ``victims`` (no
worker): dead jobs for the action tests to requeue and purge; a schedule.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dashhelpers import (
    HOSTILE,
    TOKEN,
    URL_ENV,
    WAIT_S,
    drop_schema,
    fresh_schema,
    serve,
    skip_or_fail,
    wait_until,
)

import alkstore
from alkstore import App, QueueOpts, Store
from alkstore.dashboard import create_app


@dataclass
class Live:
    """One engine's store, its worker and its two dashboards."""

    engine: str
    store: Store
    app: App
    url: str  # the dashboard with actions
    readonly_url: str
    hostile_dead_id: int
    hostile_scheduled_id: int
    completed_ids: list[int]
    store_url: str  # what --url names (PostgreSQL: without the schema)
    store_options: dict[str, Any]  # what alkstore.open needs beside it (schema=)
    #: Each ``hold`` job runs until its gate opens.
    gates: dict[str, threading.Event] = field(default_factory=dict)

    def dead_victims(self, n: int) -> list[int]:
        """``n`` fresh dead jobs of ``victims`` (claimed and failed, with
        any other job due there: a requeued one is retried later)."""
        victims = self.store.queue("victims", QueueOpts(max_attempts=1))
        ids = victims.enqueue_many([{"victim": i} for i in range(n)])
        while handles := victims.claim_batch("test-killer", 100):
            for handle in handles:
                handle.fail("killed for the test")
        assert all(victims.get_job(i).state == "dead" for i in ids)  # type: ignore[union-attr]
        return ids


@contextlib.contextmanager
def _store(engine: str, tmp: Path) -> Iterator[tuple[Store, str, dict[str, Any]]]:
    if engine == "sqlite":
        url = f"sqlite:///{tmp / 'dash.db'}"
        with alkstore.open(url) as store:
            yield store, url, {}
        return
    server = os.environ.get(URL_ENV)
    if not server:
        skip_or_fail(f"PostgreSQL: set {URL_ENV} to run the dashboard on it")
    assert server is not None
    schema = fresh_schema()
    try:
        with alkstore.open(server, schema=schema) as store:
            yield store, server, {"schema": schema}
    finally:
        drop_schema(server, schema)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Live]:
    engine: str = request.param
    with contextlib.ExitStack() as stack:
        store, store_url, store_options = stack.enter_context(
            _store(engine, tmp_path_factory.mktemp(f"dash-{engine}"))
        )
        app = stack.enter_context(App(store=store))

        @app.task(queue="mail", name="send", max_attempts=1, keep_completed_s=3600)
        def send(to: str) -> dict[str, Any]:
            return {"sent_to": to}

        @app.task(queue="mail", name="boom", max_attempts=1, keep_completed_s=3600)
        def boom(**kwargs: Any) -> None:
            raise RuntimeError(f"refused {kwargs.get('x')} {kwargs.get('y')}")

        gates: dict[str, threading.Event] = {}

        @app.task(queue="mail", name="hold", max_attempts=1, keep_completed_s=3600)
        def hold(gate: str) -> None:
            gates.setdefault(gate, threading.Event()).wait(WAIT_S)

        completed = [send.enqueue(f"user{i}@example.com") for i in range(12)]
        completed.append(send.enqueue(HOSTILE["y"]))
        hostile_dead = boom.enqueue(**HOSTILE)
        hostile_scheduled = store.queue("mail").enqueue(HOSTILE, delay=3600)
        store.schedule(
            "nightly-report",
            "0 3 * * *",
            "mail",
            {"task": "send", "args": ["ops@example.com"], "note": HOSTILE["x"]},
        )

        worker = app.worker(
            ["mail"],
            concurrency=2,
            poll_interval_s=0.05,
            registry_interval_s=0.5,  # reports its record and throughput often
            handle_signals=False,
        )
        errors: list[BaseException] = []

        def run() -> None:
            try:
                worker.run()
            except BaseException as exc:  # reported at teardown
                errors.append(exc)

        thread = threading.Thread(target=run, name="dashboard-test-worker", daemon=True)
        thread.start()

        def stop_worker() -> None:
            worker.stop()
            thread.join(WAIT_S)
            assert not errors, errors

        stack.callback(stop_worker)
        mail = store.queue("mail")
        wait_until(
            lambda: mail.completed_count() == len(completed) and mail.stats().dead == 1,
            "the worker to run the mail jobs",
        )
        live = Live(
            engine=engine,
            store=store,
            app=app,
            url=stack.enter_context(
                serve(create_app(store, actions=True, token=TOKEN, refresh_s=0.5))
            ),
            readonly_url=stack.enter_context(serve(create_app(store, refresh_s=0))),
            hostile_dead_id=hostile_dead,
            hostile_scheduled_id=hostile_scheduled,
            completed_ids=completed,
            store_url=store_url,
            store_options=store_options,
            gates=gates,
        )
        live.dead_victims(3)
        yield live
