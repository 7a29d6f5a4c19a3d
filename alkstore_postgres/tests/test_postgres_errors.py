"""Errors: every driver error is an EngineError with the psycopg error as
``__cause__``; enqueue_tx refuses unusable connections before any statement
(docs/contract.md §2 "Errors", §3 "Transactional enqueue")."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from postgres_server import drop_schema, fresh_schema_name
from psycopg import sql
from psycopg.pq import TransactionStatus

import alkstore
from alkstore import QueueOpts
from alkstore.errors import EngineError, StoreClosedError, ValidationError
from alkstore_contract_tests import ManualClock
from alkstore_postgres import PostgresStore

pytestmark = pytest.mark.postgres


def test_driver_errors_are_wrapped(
    postgres_url: str, schema: str, open_pg: Callable[..., PostgresStore], clock: ManualClock
) -> None:
    store = open_pg()
    q = store.queue("jobs", QueueOpts(visibility_timeout_s=60))
    q.enqueue_many([1, 2])
    handles = q.claim_batch("w", 2)
    drop_schema(postgres_url, schema)  # the tables vanish under the open store
    operations: list[Callable[[], Any]] = [
        lambda: q.enqueue(1),
        lambda: q.enqueue_many([1, 2]),
        lambda: q.claim_one("w"),
        lambda: q.claim_batch("w", 3),
        lambda: q.ack_batch([1, 2]),
        lambda: q.cancel(1),
        lambda: q.get_job(1),
        q.sweep_expired,
        q.stats,
        handles[0].ack,
        lambda: handles[0].retry("e"),
        lambda: handles[0].retry("e", delay=0),
        handles[0].fail,
        handles[0].heartbeat,
        store.migrate,  # recreates the schema: not an error
    ]
    for operation in operations[:-1]:
        with pytest.raises(EngineError) as caught:
            operation()
        assert isinstance(caught.value.__cause__, psycopg.errors.UndefinedTable)
        assert caught.value.permanent  # no retry brings the tables back
    operations[-1]()
    assert q.stats() == (0, 0, 0, 0)


def test_a_missing_privilege_is_permanent(
    postgres_url: str, schema: str, store: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    role = fresh_schema_name()
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        # Enough to open the store, not to write a job.
        admin.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {s} TO {r}; GRANT SELECT ON {s}.meta TO {r}").format(
                s=sql.Identifier(schema), r=sql.Identifier(role)
            )
        )
        parts = urlsplit(postgres_url)
        url = parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}").geturl()
        with (
            alkstore.open(url, schema=schema, migrate=False) as limited,
            pytest.raises(EngineError) as caught,
        ):
            limited.queue("jobs").enqueue(1)
        assert isinstance(caught.value.__cause__, psycopg.errors.InsufficientPrivilege)
        assert caught.value.permanent
    finally:
        admin.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=sql.Identifier(role)))


def test_a_read_only_transaction_is_not_permanent(
    postgres_url: str, store: PostgresStore, open_pg: Callable[..., PostgresStore]
) -> None:
    """A failover passes through read-only: the worker should retry."""
    sep = "&" if urlsplit(postgres_url).query else "?"
    read_only = open_pg(f"{postgres_url}{sep}options=-c%20default_transaction_read_only%3Don")
    with pytest.raises(EngineError) as caught:
        read_only.queue("jobs").enqueue(1)
    assert isinstance(caught.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
    assert not caught.value.permanent


def test_an_unreachable_server_fails_at_open() -> None:
    start = time.monotonic()
    with pytest.raises(EngineError) as caught:
        alkstore.open("postgresql://postgres@127.0.0.1:1/test", pool_timeout_s=5)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    assert time.monotonic() - start < 10


def test_a_failing_listener_connection_is_an_engine_error(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse() -> Any:
        raise EngineError("no listener for you")

    monkeypatch.setattr(store._listener, "_connect", refuse)
    with pytest.raises(EngineError, match="no listener"):
        store.listen("jobs")


def test_unstorable_worker_ids_are_refused_before_io(store: PostgresStore) -> None:
    q = store.queue("jobs")
    q.enqueue(1)
    for worker in ("a\x00b", "lone\ud800"):
        with pytest.raises(ValidationError, match="worker_id"):
            q.claim_one(worker)
    assert q.stats() == (1, 0, 0, 0)


def test_huge_ids_are_unknown(store: PostgresStore) -> None:
    q = store.queue("jobs")
    for job_id in (2**63, -(2**63) - 1, 10**30):
        assert q.get_job(job_id) is None
        assert not q.cancel(job_id)
        assert q.ack_batch([job_id]) == 0


@pytest.mark.parametrize("commit", [True, False])
def test_enqueue_tx_on_a_non_autocommit_connection_begins_the_callers_transaction(
    postgres_url: str, store: PostgresStore, commit: bool
) -> None:
    """psycopg outside autocommit begins a transaction before a connection's
    first statement: the enqueue may be that statement, and the caller's
    commit or rollback decides."""
    q = store.queue("tx")
    with psycopg.connect(postgres_url) as conn:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        job_id = q.enqueue_tx(conn, {"order": 1})
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert q.get_job(job_id) is None  # not committed yet
        conn.commit() if commit else conn.rollback()
    assert (q.get_job(job_id) is not None) == commit
    assert q.stats().pending == (1 if commit else 0)


def test_enqueue_tx_refuses_unusable_connections(postgres_url: str, store: PostgresStore) -> None:
    q = store.queue("tx")
    other = sqlite3.connect(":memory:")
    try:
        with pytest.raises(ValidationError, match=r"psycopg\.Connection"):
            q.enqueue_tx(other, 1)
    finally:
        other.close()
    with pytest.raises(ValidationError, match=r"psycopg\.Connection"):
        q.enqueue_tx(None, 1)
    with psycopg.connect(postgres_url, autocommit=True) as idle:
        with pytest.raises(ValidationError, match="not inside a transaction"):
            q.enqueue_tx(idle, 1)
        idle.execute("BEGIN")
        with pytest.raises(psycopg.errors.DivisionByZero):
            idle.execute("SELECT 1 / 0")
        with pytest.raises(ValidationError, match="failed transaction"):
            q.enqueue_tx(idle, 1)
        idle.execute("ROLLBACK")
    closed = psycopg.connect(postgres_url)
    closed.close()
    with pytest.raises(ValidationError, match="closed or broken"):
        q.enqueue_tx(closed, 1)
    assert q.stats() == (0, 0, 0, 0)


def test_enqueue_tx_refuses_a_connection_to_another_database(
    open_pg: Callable[..., PostgresStore], other_database_url: str
) -> None:
    store = open_pg()
    # The same schema there: the insert itself would succeed.
    twin = open_pg(other_database_url)
    with psycopg.connect(other_database_url) as app:
        app.execute("SELECT 1")  # the caller's transaction is open
        with pytest.raises(
            ValidationError,
            match=r"needs a connection to the store's database .*; this one is on 'db_",
        ):
            store.queue("tx").enqueue_tx(app, 1)
        # Refused with reads only: the caller's transaction goes on.
        assert app.info.transaction_status == TransactionStatus.INTRANS
        assert app.execute("SELECT 2").fetchone() == (2,)
        app.commit()
    assert store.queue("tx").stats() == (0, 0, 0, 0)
    assert twin.queue("tx").stats() == (0, 0, 0, 0)


def test_a_refused_payload_never_aborts_the_callers_transaction(
    postgres_url: str, store: PostgresStore
) -> None:
    q = store.queue("tx")
    with psycopg.connect(postgres_url) as app:
        app.execute("CREATE TEMP TABLE orders (id int)")
        app.commit()
        app.execute("INSERT INTO orders VALUES (42)")
        for payload in (float("nan"), {"s": "\ud800"}, {1: "int key"}, object()):
            with pytest.raises(ValidationError):
                q.enqueue_tx(app, payload)
        job_id = q.enqueue_tx(app, {"s": "a\x00b"})
        assert app.execute("SELECT 1").fetchone() == (1,)
        app.commit()
        assert app.execute("SELECT id FROM orders").fetchall() == [(42,)]
    handle = q.claim_one("w")
    assert handle is not None
    assert (handle.id, handle.payload) == (job_id, {"s": "a\x00b"})


def test_enqueue_tx_keeps_the_callers_row_factory(postgres_url: str, store: PostgresStore) -> None:
    q = store.queue("tx")
    with psycopg.connect(postgres_url, row_factory=psycopg.rows.dict_row) as app:
        with app.transaction():
            job_id = q.enqueue_tx(app, 1)
        assert isinstance(job_id, int)
        assert app.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def test_enqueue_tx_through_client_side_cursors(postgres_url: str, store: PostgresStore) -> None:
    """A caller whose connection makes client-side cursors (Django's
    default for psycopg 3) enqueues too: the engine's statements run on
    cursors of its own, unique keys included, and the caller's factory is
    left as it was."""
    q = store.queue("tx")
    with psycopg.connect(postgres_url, cursor_factory=psycopg.ClientCursor) as app:
        with app.transaction():
            job_id = q.enqueue_tx(app, {"n": 1})
            assert q.enqueue_tx(app, {"n": 2}, unique_key="k") == q.enqueue_tx(
                app, {"n": 3}, unique_key="k"
            )
        assert app.cursor_factory is psycopg.ClientCursor
        assert isinstance(app.cursor(), psycopg.ClientCursor)
    job = q.get_job(job_id)
    assert job is not None
    assert job.payload == {"n": 1}
    assert q.stats().pending == 2


def test_closed_store(store: PostgresStore) -> None:
    q = store.queue("jobs")
    q.enqueue(1)
    handle = q.claim_one("w")
    assert handle is not None
    store.close()
    for operation in (lambda: q.enqueue(1), lambda: q.claim_one("w"), handle.ack, q.stats):
        with pytest.raises(StoreClosedError):
            operation()
    store.close()


def test_pooled_connections_killed_by_the_server_are_replaced(
    store: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    q = store.queue("jobs")
    q.enqueue(1)
    with store._db.connection() as conn:
        pid = conn.info.backend_pid
    admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 10
    while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # The idle connection is dead; the next operation takes a fresh one.
    assert q.enqueue(2) > 0
    assert q.stats() == (2, 0, 0, 0)
