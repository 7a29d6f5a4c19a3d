"""Server restarts (issue 13, item 2): ``pg_ctl restart -m fast`` and ``-m
immediate`` (a crash: the server replays its WAL) in the middle of a drain,
with real worker processes and a scheduler running, and a stop longer than
the visibility timeout, against a throwaway cluster of the test's own.

What must hold (docs/deployment.md "Restarts and failover"):

* nothing is lost: every job enqueued (committed) before the restart runs,
  and the queue ends empty with no dead letter;
* a job that ran twice is one whose first run's outcome its worker could
  not record (it logs the run ``lost``, or ``unknown`` when one ack batch
  held both runs), because the claim lapsed;
* workers run jobs again within :data:`RECOVERY_BOUND_S` of the server
  accepting connections again: the pool tries the server about once a
  second however long it was away, and an operation that waited for a
  connection is judged at the instant it runs;
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
    release,
    runs_of,
    started_of,
    write_app,
)

import alkstore
from alkstore import QueueOpts
from alkstore.errors import EngineError
from alkstore_contract_tests import ManualClock

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


def test_an_outage_longer_than_the_visibility_timeout_reruns_held_jobs_each_logged_lost(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The jobs' claims lapse while the server is down: their acks cannot
    # land, so they run again; each such job is one its worker logged lost.
    url, schema = cluster.url(), fresh_schema_name()
    visibility_timeout_s = 3.0
    env = write_app(
        tmp_path,
        url=url,
        schema=schema,
        query_timeout_s=1.0,
        visibility_timeout_s=visibility_timeout_s,
    )
    held = 4
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(alkstore.open(url, schema=schema, query_timeout_s=1.0))
        q = store.queue(QUEUE, QueueOpts(visibility_timeout_s=visibility_timeout_s))
        ids = q.enqueue_many([{"task": "hold", "args": [i]} for i in range(held)])
        args = ["worker", "jobs:app", "-q", QUEUE, "-c", str(held // 2)]
        workers = [stack.enter_context(AppProcess(tmp_path, env, *args)) for _ in range(2)]
        wait_until(lambda: set(started_of(tmp_path)) == set(range(held)), "every job to start")
        cluster.stop("fast")
        # The last heartbeat came before the stop, so every claim has lapsed
        # (on the server's clock, this host's) a visibility timeout later.
        stopped_at = time.time()
        wait_until(
            lambda: time.time() > stopped_at + visibility_timeout_s + 0.5,
            "the claims to lapse",
        )
        release(tmp_path)  # the first runs finish; their acks wait for the server
        cluster.start()
        wait_until(lambda: counts_of(tmp_path) == dict.fromkeys(range(held), 2), "the reruns")
        wait_until(lambda: q.stats() == (0, 0, 0, 0), "every job to be acked")
        for worker in workers:  # each logs every outcome before it exits
            assert worker.stop(WAIT_S) == 0, worker.log
        logs = "".join(worker.log for worker in workers)
    lost = not_recorded(logs)
    assert lost == set(ids), logs


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


def test_a_claim_and_an_ack_that_waited_out_an_outage_are_judged_when_they_run(
    cluster: Cluster,
) -> None:
    # An operation's instant is read once its connection is at hand: a claim
    # that waited for the server longer than its visibility timeout still
    # holds a whole one (read before the wait, its deadline was already past,
    # and another worker took the job at once), and an ack whose claim
    # lapsed while it waited is refused (it was accepted, judged at an
    # instant before the lapse).
    visibility_timeout_s = 2.0
    schema = fresh_schema_name()
    opts = QueueOpts(visibility_timeout_s=visibility_timeout_s)
    with contextlib.ExitStack() as stack:
        waiting = stack.enter_context(
            alkstore.open(cluster.url(), schema=schema, query_timeout_s=1, pool_max_size=2)
        )
        other = stack.enter_context(alkstore.open(cluster.url(), schema=schema))
        q = waiting.queue("jobs", opts)
        held_id = waiting.queue("held", opts).enqueue("held")
        held = waiting.queue("held", opts).claim_one("w")
        assert held is not None
        assert held.id == held_id
        claimed_id = q.enqueue("claimed")
        cluster.stop("fast")
        results: dict[str, object] = {}
        started: dict[str, threading.Event] = {}

        def run(name: str, call: Callable[[], object]) -> threading.Thread:
            started[name] = threading.Event()

            def target() -> None:
                started[name].set()
                try:
                    results[name] = call()
                except BaseException as error:
                    results[name] = error

            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            return thread

        threads = [run("claim", lambda: q.claim_one("w")), run("ack", held.ack)]
        assert all(event.wait(WAIT_S) for event in started.values())
        called_at = time.time()
        # Every claim made before the calls has lapsed on the server's clock
        # (this host's) once a visibility timeout has passed since them.
        wait_until(
            lambda: time.time() > called_at + visibility_timeout_s + 0.5,
            "the visibility timeout to pass",
        )
        cluster.start()
        for thread in threads:
            thread.join(WAIT_S)
        # The ack came after its claim had lapsed: refused, the job is left
        # for a reclaim.
        assert results["ack"] is False
        reclaimed = other.queue("held", opts).claim_one("other")
        assert reclaimed is not None
        assert reclaimed.id == held_id
        claimed = results["claim"]
        assert isinstance(claimed, alkstore.JobHandle), results
        assert claimed.id == claimed_id
        # The claim holds: nobody else can take the job, and it can beat.
        assert other.queue("jobs", opts).claim_one("other") is None
        assert claimed.heartbeat()


def test_a_pool_of_one_fires_schedules_after_a_restart(cluster: Cluster) -> None:
    """A schedule's firing runs on the one pooled connection it borrowed:
    after a restart changed the server's identity, nothing in it asks the
    pool for a second (a pool of one would wait out ``pool_timeout_s`` on
    every tick, and no schedule would fire again)."""
    clock = ManualClock()
    with alkstore.open(
        cluster.url(),
        schema=fresh_schema_name(),
        clock=clock,
        pool_max_size=1,
        pool_timeout_s=QUERY_TIMEOUT_S,
        query_timeout_s=QUERY_TIMEOUT_S,
    ) as store:
        store.schedule("beat", "@every 1s", "beats", {"beat": True})
        scheduler = alkstore.Scheduler(store)
        clock.advance(1)
        assert len(scheduler.tick()) == 1
        cluster.restart("fast")
        clock.advance(1)
        fired = wait_until(scheduler.tick, "a tick after the restart to fire the schedule")
        assert len(fired) == 1
        assert [h.payload for h in store.queue("beats").claim_batch("w", 5)] == [
            {"beat": True},
            {"beat": True},
        ]
