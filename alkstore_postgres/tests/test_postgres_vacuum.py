"""Vacuum and bloat (docs/decisions.md D29, docs/operations.md "Long
transactions"): the jobs table's autovacuum settings (schema version 5),
whose migration keeps every row, and the report of what holds the xmin
horizon (``PostgresStore.vacuum_report``), tested on a throwaway cluster
because it pins that horizon."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from postgres_server import throwaway_cluster
from psycopg import sql
from test_postgres_claim_cost import buffers, put, states
from test_postgres_schema import claim_plan, make_version, nodes, version

from alkstore_contract_tests import T0, ManualClock
from alkstore_postgres import SCHEMA_VERSION, PostgresStore, open_store
from alkstore_postgres._compact import compact
from alkstore_postgres._schema import render

pytestmark = pytest.mark.postgres

_S = timedelta(seconds=1)

#: What version 5 sets on the jobs table (version 6 keeps it).
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
    assert version(admin, schema) == SCHEMA_VERSION == 7


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
    # No row rewritten, every state kept (version 6 added unique_key, NULL).
    assert admin.execute(select_all).fetchall() == [(*row, None) for row in before]
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


# -- compaction (alkstore_postgres._compact) -------------------------------------

_SELECT_ALL = sql.SQL("SELECT * FROM {jobs} ORDER BY id")


def _size(admin: psycopg.Connection[Any], schema: str) -> int:
    row = admin.execute(
        "SELECT pg_relation_size(%s::regclass)", [sql.Identifier(schema, "jobs").as_string(None)]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_compaction_keeps_every_live_row_and_drops_the_dead(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str, clock: ManualClock
) -> None:
    q = store.queue("q")
    q.enqueue_many([{"n": n} for n in range(3000)])
    assert q.ack_batch([h.id for h in q.claim_batch("w", 3000)]) == 3000
    kept = {
        "pending": put(admin, schema, "q", "pending", run_at=T0 - _S, rows=3),
        "scheduled": put(admin, schema, "q", "scheduled", run_at=T0 + 3600 * _S),
        "processing": put(admin, schema, "q", "processing", deadline=T0 + 3600 * _S),
        "lapsed": put(admin, schema, "q", "lapsed", deadline=T0 - _S),
        "expired": put(admin, schema, "q", "expired", expires_at=T0 - _S),
    }
    before = admin.execute(render(_SELECT_ALL, schema)).fetchall()
    bloated = _size(admin, schema)

    # Too few dead rows, or too many live ones: untouched.
    assert not compact(store, horizon_min_s=0, dead_min=10**9, interval_s=0)
    assert not compact(store, horizon_min_s=0, dead_min=0, live_max=6, interval_s=0)
    assert _size(admin, schema) == bloated

    assert compact(store, horizon_min_s=0, dead_min=0, interval_s=0)
    assert admin.execute(render(_SELECT_ALL, schema)).fetchall() == before
    assert _size(admin, schema) < bloated / 10
    # The turn: not again within the interval.
    assert not compact(store, horizon_min_s=0, dead_min=0, interval_s=3600)
    # Ids go on from the sequence, never reused.
    new = q.enqueue({"n": "new"})
    assert new > max(row[0] for row in before)
    handles = q.claim_batch("w", 10)
    # Claim order: the pending rows (run_at T0 - 1 s), the new job (T0),
    # the lapsed claim (T0 + 1 microsecond).
    assert [h.id for h in handles] == [*kept["pending"], new, *kept["lapsed"]]
    assert all(h.ack() for h in handles)
    assert q.get_job(kept["processing"][0]) is not None


def test_compaction_gives_up_at_once_while_a_transaction_holds_the_table(
    store: PostgresStore, admin: psycopg.Connection[Any], postgres_url: str
) -> None:
    q = store.queue("q")
    with psycopg.connect(postgres_url) as app:
        job_id = q.enqueue_tx(app, {"n": 1})
        # The enqueue is not committed: the table cannot be taken, and the
        # compaction does not wait for it (lock_timeout).
        assert not compact(store, horizon_min_s=0, dead_min=0, interval_s=0)
        app.commit()
    assert compact(store, horizon_min_s=0, dead_min=0, interval_s=0)
    handle = q.claim_one("w")
    assert handle is not None
    assert handle.id == job_id


def test_claims_racing_compactions_hand_out_every_job_once(store: PostgresStore) -> None:
    # Producers, claimers and a compactor at once, on the real clock: every
    # job claimed exactly once and acked, none lost by a rewrite.
    q = store.queue("race")
    jobs = 4000
    claimed: list[int] = []
    done = threading.Event()
    compactions = 0

    def produce() -> None:
        for start in range(0, jobs, 100):
            q.enqueue_many([{"n": n} for n in range(start, start + 100)])

    def consume() -> None:
        while not done.is_set():
            handles = q.claim_batch("w", 50)
            claimed.extend(h.id for h in handles)
            assert q.ack_batch([h.id for h in handles]) == len(handles)
            if len(claimed) >= jobs:
                done.set()

    def compactor() -> None:
        nonlocal compactions
        while not done.is_set():
            compactions += compact(
                store, horizon_min_s=0, dead_min=0, live_max=10_000, interval_s=0
            )

    threads = [threading.Thread(target=t) for t in (produce, consume, consume, compactor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert len(claimed) == len(set(claimed)) == jobs
    assert q.stats() == (0, 0, 0, 0)
    assert compactions > 0


def test_a_pinned_horizon_is_compacted_out_of_the_claims_path(tmp_path: Any) -> None:
    # A claim after 5,000 jobs with the horizon pinned walks their dead
    # entries (and reads their pages); after a compaction it does not, and
    # its plan is still index-driven.
    with contextlib.ExitStack() as stack:
        cluster = throwaway_cluster(stack)
        url = cluster.url()
        store = stack.enter_context(open_store(url))
        admin = stack.enter_context(psycopg.connect(url, autocommit=True))
        pin = stack.enter_context(psycopg.connect(url, autocommit=True))
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT count(*) FROM pg_class")
        _churn(store, 5000)
        queued = store.queue("churn").enqueue({"n": "last"})
        now = admin.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        walked = buffers(claim_plan(admin, "alkstore", "churn", now))
        assert walked > 100
        # Vacuum is taken to be held back only once the pin is old enough.
        assert not compact(store, dead_min=0, interval_s=0, horizon_min_s=3600)
        assert compact(store, dead_min=0, interval_s=0, horizon_min_s=0)
        plan = claim_plan(admin, "alkstore", "churn", now)
        assert buffers(plan) < 60
        scans = {n.get("Index Name") for n in nodes(plan["Plan"])}
        assert {"jobs_pending", "jobs_processing", "jobs_lapsed"} <= scans
        # The walks keep their indexes. (The moves' primary-key update is
        # planned as on a fresh store, whose table is as small.)
        seq = [n.get("Alias") for n in nodes(plan["Plan"]) if n["Node Type"] == "Seq Scan"]
        assert len(seq) <= 1
        handle = store.queue("churn").claim_one("w")
        assert handle is not None
        assert handle.id == queued
