"""Transactional enqueue through the application's own connection (docs/contract.md §3
"Transactional enqueue"; regression cases 007 and 010)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from alkstore import Queue, Store, ValidationError
from alkstore_contract_tests._clock import T0
from alkstore_contract_tests._fixtures import ContractFixtures, StoreFactory, at, claim_exactly, job
from alkstore_contract_tests.harness import StoreTarget
from alkstore_contract_tests.suite.wake import QUIET_S, WAKE_TIMEOUT_S

__all__ = ["App", "AppFixtures", "TransactionalEnqueueTests"]


class App:
    """The application's side: its connection and its own table."""

    def __init__(self, conn: Any, table: str) -> None:
        self.conn = conn
        self.table = table

    def execute(self, sql: str) -> Any:
        return self.conn.execute(sql.replace("orders", self.table))

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def orders(self) -> list[int]:
        return sorted(row[0] for row in self.execute("SELECT id FROM orders").fetchall())


class AppFixtures(ContractFixtures):
    """The ``app`` fixture: the application's own connection and table
    (harness capability ``app_connection``)."""

    @pytest.fixture
    def app(self, alkstore_target: StoreTarget, store: Store) -> Iterator[App]:
        """The application's own connection to the target (no transaction
        open), after the store migrated, and the application's own table
        ``orders (id INTEGER PRIMARY KEY)``, empty; the table's real name is
        unique to the test and it is dropped afterwards, in case the
        engine's targets share a database."""
        with self.app_connection(alkstore_target) as conn:
            app = App(conn, f"orders_{uuid.uuid4().hex[:12]}")
            self.begin(conn)
            app.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
            conn.commit()
            yield app
            conn.rollback()  # a no-op unless a failed test left one open
            self.begin(conn)
            app.execute("DROP TABLE orders")
            conn.commit()


class TransactionalEnqueueTests(AppFixtures):
    """``Queue.enqueue_tx`` inside the caller's transaction (needs the
    harness's ``app_connection``)."""

    @pytest.fixture
    def worker(self, open_store: StoreFactory) -> Queue:
        """Queue ``"jobs"`` on a second store of the same target: a worker
        elsewhere."""
        return open_store().queue("jobs")

    def test_commit_makes_the_job_visible_and_wakes(
        self, app: App, store: Store, queue: Queue, worker: Queue
    ) -> None:
        """Regression case 010, step 2."""
        with store.listen("jobs") as sub:
            self.begin(app.conn)
            app.execute("INSERT INTO orders (id) VALUES (43)")
            job_id = queue.enqueue_tx(app.conn, {"order": 43}, priority=2, delay=0)
            assert type(job_id) is int
            assert worker.claim_one("w") is None
            assert worker.get_job(job_id) is None
            assert worker.stats() == (0, 0, 0, 0)
            app.commit()
            assert sub.wait(WAKE_TIMEOUT_S) is True
        handle = claim_exactly(worker, job_id)
        assert (handle.payload, handle.payload_bytes, handle.priority) == (
            {"order": 43},
            b'{"order":43}',
            2,
        )
        assert (handle.enqueued_at, handle.run_at, handle.attempts) == (T0, T0, 1)
        assert app.orders() == [43]

    def test_rollback_leaves_no_job_and_no_wake(
        self, app: App, store: Store, queue: Queue, worker: Queue
    ) -> None:
        """Regression case 010, step 1."""
        with store.listen("jobs") as sub:
            self.begin(app.conn)
            app.execute("INSERT INTO orders (id) VALUES (42)")
            job_id = queue.enqueue_tx(app.conn, {"order": 42})
            assert worker.claim_one("w") is None
            app.rollback()
            assert sub.wait(QUIET_S) is False
        assert worker.claim_one("w") is None
        assert worker.get_job(job_id) is None
        assert queue.stats() == (0, 0, 0, 0)
        assert app.orders() == []

    def test_rollback_to_savepoint_drops_only_the_inner_job(
        self, app: App, queue: Queue, worker: Queue
    ) -> None:
        """Regression case 010, step 3."""
        self.begin(app.conn)
        app.execute("SAVEPOINT before_j1")
        j1 = queue.enqueue_tx(app.conn, "J1")
        app.execute("ROLLBACK TO SAVEPOINT before_j1")
        j2 = queue.enqueue_tx(app.conn, "J2")
        app.commit()
        assert queue.stats() == (1, 0, 0, 0)
        # a rolled-back id never existed, so an engine may hand it out again
        if j1 != j2:
            assert worker.get_job(j1) is None
        assert claim_exactly(worker, j2).payload == "J2"

    def test_conn_outside_a_transaction_is_refused(self, app: App, queue: Queue) -> None:
        with pytest.raises(ValidationError):
            queue.enqueue_tx(app.conn, "x")
        assert queue.stats() == (0, 0, 0, 0)
        # the connection is still usable
        self.begin(app.conn)
        app.execute("INSERT INTO orders (id) VALUES (1)")
        app.commit()
        assert app.orders() == [1]

    def test_not_a_connection_is_refused(self, queue: Queue) -> None:
        with pytest.raises(ValidationError):
            queue.enqueue_tx(object(), "x")
        with pytest.raises(ValidationError):
            queue.enqueue_tx(None, "x")
        assert queue.stats() == (0, 0, 0, 0)

    @pytest.mark.parametrize(
        ("payload", "options"),
        [
            (float("nan"), {}),
            ({"s": "\ud800"}, {}),
            ({1: "int key"}, {}),
            ("fine", {"delay": -1}),
            ("fine", {"delay": 10, "expires": 5}),
            ("fine", {"max_attempts": 0}),
        ],
        ids=["nan", "surrogate", "int-key", "negative-delay", "expires-first", "no-attempts"],
    )
    def test_refused_enqueue_does_not_abort_the_callers_transaction(
        self, app: App, queue: Queue, payload: object, options: dict[str, Any]
    ) -> None:
        """Regression case 007, transactional run."""
        self.begin(app.conn)
        app.execute("INSERT INTO orders (id) VALUES (7)")
        with pytest.raises(ValidationError):
            queue.enqueue_tx(app.conn, payload, **options)
        assert tuple(app.execute("SELECT 1").fetchone()) == (1,)
        job_id = queue.enqueue_tx(app.conn, {"s": "a\u0000b"})
        app.commit()
        assert app.orders() == [7]
        assert queue.stats() == (1, 0, 0, 0)
        assert claim_exactly(queue, job_id).payload == {"s": "a\u0000b"}

    def test_options_resolve_as_for_enqueue(self, app: App, queue: Queue) -> None:
        before = queue.enqueue("before")
        self.begin(app.conn)
        job_id = queue.enqueue_tx(app.conn, b"\x00raw", delay=10, expires=60, max_attempts=2)
        app.commit()
        assert job_id > before
        got = job(queue, job_id)
        assert (got.run_at, got.expires_at, got.enqueued_at) == (at(10), at(60), T0)
        assert (got.max_attempts, got.payload, got.content_type) == (
            2,
            b"\x00raw",
            "application/octet-stream",
        )
        assert queue.enqueue("after") > job_id
