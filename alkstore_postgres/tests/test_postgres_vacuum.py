"""Vacuum and bloat (docs/decisions.md D28, docs/operations.md "Long
transactions"): the jobs table's autovacuum settings (schema version 5),
whose migration keeps every row, and the report of what holds the xmin
horizon (``PostgresStore.vacuum_report``), tested on a throwaway cluster
because it pins that horizon."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from test_postgres_claim_cost import put, states
from test_postgres_schema import make_version, version

from alkstore_contract_tests import T0, ManualClock
from alkstore_postgres import SCHEMA_VERSION, PostgresStore
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
