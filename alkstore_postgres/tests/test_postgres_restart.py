"""Server restarts (issue 13, item 2): ``pg_ctl restart -m fast`` and ``-m
immediate`` (a crash: the server replays its WAL) in the middle of a drain,
with real worker processes and a scheduler running, against a throwaway
cluster of the test's own.

What must hold (docs/deployment.md "Restarts and failover"):

* nothing is lost: every job enqueued (committed) before the restart runs,
  and the queue ends empty with no dead letter;
* a job that ran twice is one whose first run's outcome its worker could
  not record (it logs the run ``lost``, or ``unknown`` when one ack batch
  held both runs), because the claim lapsed;
* workers run jobs again within :data:`RECOVERY_BOUND_S` of the server
  accepting connections again: the pool tries the server about once a
  second however long it was away;
* each worker's LISTEN connection heals: with a re-poll interval longer
  than the test, a job enqueued afterwards runs only if its wake arrives;
* the scheduler fires each boundary at most once across the restart, and
  fires again after it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from postgres_server import Cluster, fresh_schema_name, throwaway_cluster
from postgres_workers import (
    QUEUE,
    AppProcess,
    counts_of,
    not_recorded,
    runs_of,
    write_app,
)

import alkstore
from alkstore import QueueOpts
from alkstore.errors import EngineError

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

#: The bound this test holds the engine to: seconds from the server
#: accepting connections again until workers run jobs again.
RECOVERY_BOUND_S = 5.0
#: How long a test waits for anything else, seconds.
WAIT_S = 20.0
#: The workers' and the test store's bound on one call, seconds.
QUERY_TIMEOUT_S = 2.0
#: The drain's visibility timeout: query_timeout_s + 1 < 2/3 of it.
VISIBILITY_TIMEOUT_S = 5.0
#: Longer than the test: a job enqueued when every worker is idle runs
#: within the test only if its wake reached a worker.
POLL_INTERVAL_S = 120.0
JOBS = 300
WORKERS = 2
CONCURRENCY = 4


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll ``predicate`` until it returns something true (an ``EngineError``
    counts as not yet: the server may be down); return that, or fail after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(EngineError, psycopg.OperationalError):
            found = predicate()
            if found:
                return found
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)


def boundaries(url: str, schema: str) -> list[Any]:
    """The ``run_at`` of every job the schedule fired, in order."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            psycopg.sql.SQL(
                "SELECT run_at FROM {}.jobs WHERE queue = 'beats' ORDER BY run_at"
            ).format(psycopg.sql.Identifier(schema))
        ).fetchall()
    return [row[0] for row in rows]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with contextlib.ExitStack() as stack:
        yield throwaway_cluster(stack)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_mid_drain_loses_nothing_and_workers_resume(
    cluster: Cluster, tmp_path: Path, mode: str
) -> None:
    url, schema = cluster.url(), fresh_schema_name()
    env = write_app(
        tmp_path,
        url=url,
        schema=schema,
        query_timeout_s=QUERY_TIMEOUT_S,
        visibility_timeout_s=VISIBILITY_TIMEOUT_S,
    )
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(
            alkstore.open(url, schema=schema, query_timeout_s=QUERY_TIMEOUT_S)
        )
        q = store.queue(QUEUE, QueueOpts(visibility_timeout_s=VISIBILITY_TIMEOUT_S))
        store.schedule("beat", "@every 1s", "beats", {"beat": True})
        # The workers tick the schedules too: three schedulers race.
        worker_args = ["worker", "jobs:app", "-q", QUEUE, "-c", str(CONCURRENCY)]
        worker_args += ["--poll-interval", str(POLL_INTERVAL_S)]
        processes = [
            stack.enter_context(AppProcess(tmp_path, env, *worker_args)) for _ in range(WORKERS)
        ]
        processes.append(
            stack.enter_context(AppProcess(tmp_path, env, "scheduler", "--app", "jobs:app"))
        )
        wait_until(lambda: len(boundaries(url, schema)) >= 2, "the schedule to fire")
        ids = q.enqueue_many([{"task": "work", "args": [i]} for i in range(JOBS)])
        wait_until(lambda: len(runs_of(tmp_path)) >= 40, "jobs to run before the restart")
        down = time.monotonic()
        ready = cluster.restart(mode)
        beats_before = len(boundaries(url, schema))
        # Back to work: an execution that started after the server was
        # ready was claimed after it (a claimed job starts at once).
        first = wait_until(
            lambda: [run for run in runs_of(tmp_path) if run.started > ready],
            "a job to run after the restart",
        )
        resumed_s = first[0].started - ready
        wait_until(lambda: set(counts_of(tmp_path)) == set(range(JOBS)), "every job to run")
        wait_until(lambda: q.stats() == (0, 0, 0, 0), "every job to be acked")
        # Every worker is idle now and re-polls only after POLL_INTERVAL_S:
        # these run only if their wakes reach a worker through a LISTEN
        # connection made after the restart.
        enqueued = time.monotonic()
        later = q.enqueue_many([{"task": "work", "args": [JOBS + i]} for i in range(4)])
        wait_until(
            lambda: set(counts_of(tmp_path)) == set(range(JOBS + 4)), "the wakes after the restart"
        )
        woken_s = max(run.started for run in runs_of(tmp_path) if run.i >= JOBS) - enqueued
        wait_until(
            lambda: len(boundaries(url, schema)) > beats_before + 1, "the schedule to fire again"
        )
        for process in processes:
            assert process.stop(WAIT_S) == 0, process.log
        logs = "".join(process.log for process in processes)
    fired = boundaries(url, schema)
    counts = counts_of(tmp_path)
    all_ids = ids + later
    twice = {all_ids[i] for i, n in counts.items() if n > 1}
    lost = not_recorded(logs)
    print(
        f"\n{mode} restart: ready again {ready - down:.3f} s after it began; workers ran "
        f"jobs again {resumed_s:.3f} s after the server was ready; a wake ran a job "
        f"{woken_s:.3f} s after its enqueue; {sum(counts.values())} runs of {len(all_ids)} jobs, "
        f"{len(twice)} twice ({len(lost)} logged lost); {len(fired)} boundaries fired"
    )
    assert resumed_s < RECOVERY_BOUND_S
    assert twice <= lost, (twice, lost)
    assert len(fired) == len(set(fired)), fired


class _ConnectFailures(logging.Handler):
    """Counts the pool's failed connection attempts (psycopg_pool logs each
    one at WARNING as ``error connecting in 'NAME': ...``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("error connecting in "):
            self.count += 1


@pytest.fixture
def connect_failures() -> Iterator[_ConnectFailures]:
    handler = _ConnectFailures()
    logger = logging.getLogger("psycopg.pool")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_the_pool_tries_the_server_every_second_however_long_it_was_down(
    cluster: Cluster, connect_failures: _ConnectFailures
) -> None:
    # psycopg_pool's own reconnection doubles its pause after each failed
    # try (1, 2, 4, 8 ... s): a server back after an outage of 7 s would be
    # tried again 8 s later, and the operations waiting for a connection
    # would wait that long. The engine tries every second instead, for as
    # long as an operation waits. One connection: one sequence of tries.
    store = alkstore.open(
        cluster.url(),
        schema=fresh_schema_name(),
        query_timeout_s=2,
        pool_min_size=1,
        pool_max_size=1,
    )
    try:
        q = store.queue("jobs")
        q.enqueue(1)
        cluster.stop("fast")
        outcome: list[object] = []
        done = threading.Event()

        def stats() -> None:
            try:
                outcome.append(q.stats())
            except BaseException as error:
                outcome.append(error)
            finally:
                done.set()

        threading.Thread(target=stats, daemon=True).start()
        # Four failed tries: psycopg_pool's pause would be 8 s now.
        wait_until(lambda: connect_failures.count >= 4, "four failed connection attempts")
        down_s = time.monotonic()
        ready = cluster.start()
        assert done.wait(WAIT_S), "the operation still waits for a connection"
        back_s = time.monotonic() - ready
        print(
            f"\nafter {connect_failures.count} failed connection attempts the server was "
            f"started ({ready - down_s:.3f} s); the waiting operation got a connection "
            f"{back_s:.3f} s after it was ready"
        )
        assert outcome == [(1, 0, 0, 0)]
        # About a second between tries (psycopg_pool's next one: 8 s).
        assert back_s < 2.5
    finally:
        store.close()
