"""The connection budget (issue 13, item 4; docs/deployment.md "Connection
budget"), on a throwaway cluster of the test's own with a small
``max_connections``, so that filling it up never starves the shared server:

* the default pool serves 64 threads of one store at once, a connection each
  (the old default of 10 made 54 of them queue);
* a store opened on a server with no connection slot left fails with an
  error that says so and what to change, and not a permanent one;
* an operation that gets no connection within ``pool_timeout_s`` says why:
  connecting failed (and how), or every connection was in use;
* a worker whose connections the server dropped while it was full retries
  until slots free up, then runs every job once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from postgres_server import Cluster, throwaway_cluster

import alkstore
from alkstore.errors import EngineError
from alkstore_postgres import DEFAULT_POOL_MAX_SIZE, open_store

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

#: The cluster's slots: room for the 64-thread test and its own connections.
MAX_CONNECTIONS = 72
WAIT_S = 20.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with contextlib.ExitStack() as stack:
        yield throwaway_cluster(
            stack,
            settings={
                "max_connections": str(MAX_CONNECTIONS),
                # The tests connect as a superuser: no slot is kept back.
                "superuser_reserved_connections": "0",
            },
        )


@pytest.fixture
def url(cluster: Cluster) -> str:
    return cluster.url()


@contextlib.contextmanager
def full_server(url: str) -> Iterator[list[psycopg.Connection[Any]]]:
    """Take every connection slot the server has left; give them back after."""
    hogs: list[psycopg.Connection[Any]] = []
    try:
        refused = ""
        while not refused:
            try:
                hogs.append(psycopg.connect(url, autocommit=True, connect_timeout=5))
            except psycopg.OperationalError as error:
                refused = str(error)
            assert len(hogs) <= MAX_CONNECTIONS, "the server took more than max_connections"
        # A refused connect carries libpq's message, not a SQLSTATE.
        assert "too many clients already" in refused
        yield hogs
    finally:
        for conn in hogs:
            conn.close()


def wait_until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {WAIT_S} s waiting for {what}"
        time.sleep(0.02)


def test_the_default_pool_gives_64_threads_a_connection_each(url: str) -> None:
    assert DEFAULT_POOL_MAX_SIZE >= 64
    with open_store(url, schema="budget") as store:
        barrier = threading.Barrier(64, timeout=WAIT_S)
        broken: list[BaseException] = []

        def hold() -> None:
            try:
                # The engine's own borrow: every thread holds its connection
                # until all 64 have one (a pool of 10 breaks the barrier).
                with store._db.connection() as conn:
                    conn.execute("SELECT 1")
                    barrier.wait()
            except BaseException as error:
                broken.append(error)

        threads = [threading.Thread(target=hold) for _ in range(64)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert broken == []


def test_opening_a_store_on_a_full_server_says_why(url: str) -> None:
    with open_store(url, schema="budget"):
        pass  # the schema exists: only the connect can fail below
    with full_server(url), pytest.raises(EngineError) as caught:
        open_store(url, schema="budget")
    message = str(caught.value)
    assert "too many clients" in message
    assert "max_connections" in message
    assert 'docs/deployment.md "Connection budget"' in message
    assert not caught.value.permanent  # a retry succeeds once slots free up


def test_an_operation_without_a_connection_in_time_says_connecting_failed(url: str) -> None:
    with open_store(url, schema="budget", pool_min_size=1, pool_timeout_s=1.5) as store:
        queue = store.queue("q")
        queue.enqueue({"n": 0})
        # Every connection the store has is held; the pool must open another,
        # and the server has no slot for it.
        with full_server(url), contextlib.ExitStack() as held:
            for _ in range(store._db._pool.get_stats()["pool_size"]):
                held.enter_context(store._db.connection())
            with pytest.raises(EngineError) as caught:
                queue.enqueue({"n": 1})
        message = str(caught.value)
        assert message.startswith("no connection within pool_timeout_s (1.5 s): connecting failed:")
        assert "too many clients" in message
        assert "max_connections" in message
        assert not caught.value.permanent
        # With slots free again, the store works on.
        assert queue.enqueue({"n": 2}) > 0
        assert queue.stats().pending == 2


def test_an_operation_without_a_connection_in_time_says_all_were_in_use(url: str) -> None:
    with open_store(url, schema="budget", pool_max_size=2, pool_timeout_s=0.5) as store:
        queue = store.queue("q")
        with store._db.connection(), store._db.connection(), pytest.raises(EngineError) as caught:
            queue.enqueue({"n": 1})
        assert str(caught.value) == (
            "no connection within pool_timeout_s (0.5 s): all 2 of the pool's"
            " connections (pool_max_size) were in use"
        )
        assert not caught.value.permanent


def test_a_worker_retries_while_it_gets_no_connection_then_runs_every_job_once(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The same refusal as a full server (SQLSTATE 53300), made at will: the
    # worker's role may open no connection while its limit is 0.
    admin = psycopg.connect(url, autocommit=True)
    admin.execute("CREATE ROLE budget_worker LOGIN CONNECTION LIMIT -1")
    admin.execute("GRANT CREATE ON DATABASE postgres TO budget_worker")
    caplog.set_level(logging.WARNING, logger="alkstore")
    jobs = 200
    app = alkstore.App(
        url.replace("postgres@", "budget_worker@", 1), schema="budget_worker", pool_timeout_s=1.0
    )
    ran: list[int] = []
    started: list[int] = []
    gate = threading.Event()

    @app.task
    def work(n: int) -> None:
        started.append(n)
        gate.wait(WAIT_S)  # the first jobs wait until the role is refused
        ran.append(n)

    work.enqueue_many([(n,) for n in range(jobs)])
    worker = app.worker(concurrency=4, poll_interval_s=0.2)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        wait_until(lambda: len(started) == 4, "the worker to start 4 jobs")
        admin.execute("ALTER ROLE budget_worker CONNECTION LIMIT 0")
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'budget_worker'"
        )
        gate.set()

        def refused() -> bool:
            return any(
                r.exc_info is not None and "no connection slot left" in str(r.exc_info[1])
                for r in caplog.records
            )

        wait_until(refused, "the worker to log that it got no connection, and why")
        admin.execute("ALTER ROLE budget_worker CONNECTION LIMIT -1")
        wait_until(lambda: len(ran) >= jobs, "every job to run")
        wait_until(lambda: app.queue("default").stats().processing == 0, "every ack")
        stats = app.queue("default").stats()
    finally:
        gate.set()
        worker.stop()
        runner.join(WAIT_S)
        app.close()
        admin.close()
    assert not runner.is_alive()
    assert sorted(ran) == list(range(jobs))
    assert stats.pending == 0
