"""Vacuum and bloat (docs/decisions.md D28, docs/operations.md "Long
transactions"): the jobs table's autovacuum settings (schema version 5),
whose migration keeps every row, and the report of what holds the xmin
horizon (``PostgresStore.vacuum_report``), tested on a throwaway cluster
because it pins that horizon."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from postgres_server import throwaway_cluster
from psycopg import sql
from test_postgres_claim_cost import put, states
from test_postgres_schema import make_version, version

from alkstore_contract_tests import T0, ManualClock
from alkstore_postgres import SCHEMA_VERSION, PostgresStore, open_store
from alkstore_postgres._schema import render

pytestmark = pytest.mark.postgres

_S = timedelta(seconds=1)

#: What version 5 sets on the jobs table.
_AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0",
    "autovacuum_vacuum_insert_threshold": "1000",
    "autovacuum_vacuum_cost_delay": "0",
    "vacuum_index_cleanup": "on",
}


def reloptions(admin: psycopg.Connection[Any], schema: str, table: str) -> dict[str, str]:
    row = admin.execute(
        "SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
        [sql.Identifier(schema, table).as_string(None)],
    ).fetchone()
    assert row is not None
    return dict(option.split("=", 1) for option in row[0] or [])


def test_a_fresh_store_tunes_autovacuum_for_a_queue(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str
) -> None:
    assert reloptions(admin, schema, "jobs") == _AUTOVACUUM
    assert version(admin, schema) == SCHEMA_VERSION == 5


def test_version_4_is_migrated_with_jobs_in_every_state(
    open_pg: Callable[..., PostgresStore],
    admin: psycopg.Connection[Any],
    schema: str,
    clock: ManualClock,
) -> None:
    make_version(admin, schema, 4)
    assert "autovacuum_vacuum_threshold" not in reloptions(admin, schema, "jobs")
    due = put(admin, schema, "q", "pending", run_at=T0 + _S)
    future = put(admin, schema, "q", "scheduled", run_at=T0 + 3600 * _S)
    live = put(admin, schema, "q", "processing", deadline=T0 + 3600 * _S, priority=9)
    lapsed = put(admin, schema, "q", "lapsed", deadline=T0 + _S, run_at=T0 + 2 * _S)
    expired = put(admin, schema, "q", "expired", expires_at=T0 + 5 * _S)
    low = put(admin, schema, "q", "pending", run_at=T0, priority=-1)
    select_all = render(sql.SQL("SELECT * FROM {jobs} ORDER BY id"), schema)
    before = admin.execute(select_all).fetchall()

    clock.set(T0 + 6 * _S)
    store = open_pg()
    assert version(admin, schema) == SCHEMA_VERSION
    assert reloptions(admin, schema, "jobs") == _AUTOVACUUM
    # No row rewritten, every state kept.
    assert admin.execute(select_all).fetchall() == before
    assert states(admin, schema, "q") == {
        "pending": 2,
        "scheduled": 1,
        "processing": 1,
        "lapsed": 1,
        "expired": 1,
    }
    q = store.queue("q")
    # pending: due, low and the expired row (it holds no claim); processing: live + lapsed.
    assert q.stats() == (3, 1, 2, 0)
    handles = q.claim_batch("w", 10)
    assert [h.id for h in handles] == due + lapsed + low
    assert q.get_job(live[0]) is not None
    assert q.get_job(future[0]) is not None
    assert q.sweep_expired() == (1, 0)
    gone = q.get_job(expired[0])
    assert gone is not None
    assert gone.state == "dead"
    assert all(h.ack() for h in handles)
    assert q.stats() == (0, 1, 1, 1)


def _churn(store: PostgresStore, jobs: int) -> None:
    """``jobs`` jobs enqueued, claimed and acked: two dead row versions
    each (the claim's update, the ack's delete)."""
    q = store.queue("churn")
    q.enqueue_many([{"n": n} for n in range(jobs)])
    handles = q.claim_batch("w", jobs)
    assert len(handles) == jobs
    assert q.ack_batch([h.id for h in handles]) == jobs


def _vacuum(url: str) -> None:
    # VACUUM writes the table's dead row count to the statistics at once
    # (what it could not remove), so no wait for a backend's stats flush.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute('VACUUM (INDEX_CLEANUP ON) alkstore."jobs"')


def _jobs_table(store: PostgresStore) -> Any:
    report = store.vacuum_report()
    return next(t for t in report.tables if t.table == "alkstore.jobs")


def test_the_report_names_the_transaction_that_pins_the_horizon(tmp_path: Any) -> None:
    # The pin would stop vacuum for every test on a shared server: a
    # throwaway cluster of this test's own.
    with contextlib.ExitStack() as stack:
        cluster = throwaway_cluster(stack)
        url = cluster.url()
        store = stack.enter_context(open_store(url))
        assert {t.table for t in store.vacuum_report().tables} >= {
            "alkstore.jobs",
            "alkstore.dead",
            "alkstore.queues",
        }
        pin = stack.enter_context(psycopg.connect(url, autocommit=True, application_name="report"))
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT count(*) FROM pg_class")
        _churn(store, 50)
        _vacuum(url)
        jobs = _jobs_table(store)
        assert jobs.dead_rows == 100
        assert jobs.live_rows == 0
        assert jobs.last_vacuum is not None
        holders = store.vacuum_report().holders
        assert len(holders) == 1
        held = holders[0]
        assert held.kind == "session"
        assert held.ident == str(pin.info.backend_pid)
        assert held.application_name == "report"
        assert held.state == "idle in transaction"
        assert held.query == "SELECT count(*) FROM pg_class"
        assert held.age >= 1
        assert held.held_s is not None
        assert held.held_s >= 0
        assert held.xact_start is not None

        # The command prints the same.
        out = _bloat(tmp_path, url)
        assert "alkstore.jobs" in out
        assert f"session  {pin.info.backend_pid}" in out
        assert "idle in transaction" in out
        assert "SELECT count(*) FROM pg_class" in out

        # Released, vacuum removes them all and nothing holds the horizon.
        pin.execute("ROLLBACK")
        _vacuum(url)
        assert _jobs_table(store).dead_rows == 0
        assert store.vacuum_report().holders == ()
        assert "nothing holds the xmin horizon" in _bloat(tmp_path, url)


def test_the_report_names_prepared_transactions_and_slots() -> None:
    # Both outlive every session: what a DBA forgets and nobody sees in
    # pg_stat_activity.
    with contextlib.ExitStack() as stack:
        cluster = throwaway_cluster(
            stack, settings={"max_prepared_transactions": "2", "wal_level": "logical"}
        )
        url = cluster.url()
        store = stack.enter_context(open_store(url))
        with psycopg.connect(url, autocommit=True) as conn:
            # A logical slot nobody reads holds the catalogs' horizon (made
            # first: making one waits for every open transaction).
            conn.execute("SELECT pg_create_logical_replication_slot('gone', 'test_decoding')")
            conn.execute("BEGIN")
            conn.execute("INSERT INTO alkstore.queues VALUES (%s, false)", ["forgotten"])
            conn.execute("PREPARE TRANSACTION 'forgotten'")
        try:
            kinds = {(h.kind, h.ident) for h in store.vacuum_report().holders}
            assert kinds == {("prepared transaction", "forgotten"), ("replication slot", "gone")}
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ROLLBACK PREPARED 'forgotten'")
                conn.execute("SELECT pg_drop_replication_slot('gone')")
        assert store.vacuum_report().holders == ()


def _bloat(project: Any, url: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    done = subprocess.run(
        [sys.executable, "-m", "alkstore", "--url", url, "bloat"],
        check=False,
        cwd=project,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
