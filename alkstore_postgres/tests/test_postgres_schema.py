"""The schema: its own PostgreSQL schema, versioned migrations safe from
many processes, SchemaVersionError, isolation between schemas, and claim
plans that stay index-driven (docs/contract.md §3 "Schema", "Claim")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import postgres_children
import psycopg
import pytest
from postgres_helpers import in_threads, index_names
from postgres_server import drop_schema, fresh_schema_name
from psycopg import sql

from alkstore.errors import SchemaVersionError
from alkstore_contract_tests import T0, ManualClock
from alkstore_postgres import SCHEMA_VERSION, PostgresStore
from alkstore_postgres._queue import CLAIM
from alkstore_postgres._schema import (
    _CREATE_META,
    _CREATE_SCHEMA,
    _MIGRATIONS,
    _WRITE_VERSION,
    numbered,
    render,
)

pytestmark = pytest.mark.postgres


def version(admin: psycopg.Connection[Any], schema: str) -> int:
    row = admin.execute(
        sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(
            sql.Identifier(schema, "meta")
        )
    ).fetchone()
    assert row is not None
    found: int = row[0]
    return found


def schema_exists(admin: psycopg.Connection[Any], schema: str) -> bool:
    row = admin.execute("SELECT to_regnamespace(%s) IS NOT NULL", [f'"{schema}"']).fetchone()
    assert row is not None
    exists: bool = row[0]
    return exists


def test_tables_live_in_their_own_schema(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str
) -> None:
    tables = admin.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
        [schema],
    ).fetchall()
    assert [t for (t,) in tables] == [
        "completed",
        "dead",
        "jobs",
        "maintenance",
        "meta",
        "queues",
        "schedules",
        "throughput",
        "workers",
    ]
    indexes = index_names(admin, schema)
    assert {
        "jobs_pending",
        "jobs_scheduled",
        "jobs_processing",
        "jobs_lapsed",
        "jobs_expiry",
        "dead_died",
        "dead_queue",
        "schedules_due",
    } <= indexes
    # Version 2's, replaced in version 4.
    assert not {"jobs_reclaim", "jobs_exhausted"} & indexes
    types = dict(
        admin.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'jobs'",
            [schema],
        ).fetchall()
    )
    assert types["payload"] == "bytea"
    assert types["id"] == "bigint"
    assert "json" not in " ".join(types.values())
    assert version(admin, schema) == SCHEMA_VERSION


def test_migrate_is_idempotent(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str
) -> None:
    job_id = store.queue("jobs").enqueue(1)
    store.migrate()
    store.migrate()
    assert version(admin, schema) == SCHEMA_VERSION
    assert store.queue("jobs").get_job(job_id) is not None


def test_a_newer_schema_is_refused(
    store: PostgresStore,
    open_pg: Callable[..., PostgresStore],
    admin: psycopg.Connection[Any],
    schema: str,
) -> None:
    admin.execute(
        sql.SQL("UPDATE {} SET value = %s").format(sql.Identifier(schema, "meta")),
        [SCHEMA_VERSION + 1],
    )
    for migrate in (True, False):
        with pytest.raises(SchemaVersionError, match="newer"):
            open_pg(migrate=migrate)
    with pytest.raises(SchemaVersionError, match="newer"):
        store.migrate()


def test_a_missing_schema_without_migrate(
    open_pg: Callable[..., PostgresStore], admin: psycopg.Connection[Any], schema: str
) -> None:
    # The message names the schema that was looked for, and the way out.
    with pytest.raises(SchemaVersionError, match=f"schema '{schema}' of .* has no alkstore schema"):
        open_pg(migrate=False)
    assert not schema_exists(admin, schema)  # nothing was created
    open_pg()
    open_pg(migrate=False)


def test_a_schema_made_by_a_dba_is_adopted(
    open_pg: Callable[..., PostgresStore], admin: psycopg.Connection[Any], schema: str
) -> None:
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    store = open_pg()
    assert store.queue("jobs").enqueue(1) >= 1
    assert version(admin, schema) == SCHEMA_VERSION


def test_threads_open_a_fresh_schema_at_once(
    open_pg: Callable[..., PostgresStore], admin: psycopg.Connection[Any], schema: str
) -> None:
    barrier = threading.Barrier(8)

    def opener(_: int) -> None:
        barrier.wait()
        open_pg()

    in_threads(8, opener)
    assert version(admin, schema) == SCHEMA_VERSION


@pytest.mark.slow
def test_processes_open_a_fresh_schema_at_once(
    postgres_url: str, schema: str, admin: psycopg.Connection[Any]
) -> None:
    barrier = postgres_children.barrier(6)
    versions = postgres_children.run_children(
        postgres_children.open_at_once, [(postgres_url, schema, barrier)] * 6
    )
    assert versions == [SCHEMA_VERSION] * 6
    assert version(admin, schema) == SCHEMA_VERSION


def test_the_migrate_command_says_what_it_did(
    postgres_url: str, schema: str, admin: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """``alkstore migrate`` through an app on PostgreSQL: created, already
    current, upgraded from version 1, or refused as newer, each said in one
    line (as on SQLite: alkstore/tests/test_cli.py)."""
    (tmp_path / "pgapp.py").write_text(
        "import os\nimport alkstore\n"
        "app = alkstore.App(os.environ['PG_URL'], schema=os.environ['PG_SCHEMA'])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    env.update(PG_URL=postgres_url, PG_SCHEMA=schema)

    def migrate() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "alkstore", "migrate", "--app", "pgapp:app"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def said(result: subprocess.CompletedProcess[str]) -> str:
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert said(migrate()) == f"created the alkstore schema at version {SCHEMA_VERSION}\n"
    assert said(migrate()) == f"the alkstore schema is already at version {SCHEMA_VERSION}\n"
    drop_schema(postgres_url, schema)
    make_version(admin, schema, 1)
    assert said(migrate()) == f"upgraded the alkstore schema from version 1 to {SCHEMA_VERSION}\n"
    assert said(migrate()) == f"the alkstore schema is already at version {SCHEMA_VERSION}\n"
    admin.execute(sql.SQL("UPDATE {} SET value = value + 1").format(sql.Identifier(schema, "meta")))
    refused = migrate()
    assert refused.returncode == 1, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert f"is version {SCHEMA_VERSION + 1}, newer than this code's {SCHEMA_VERSION}" in line
    assert line.endswith("(SchemaVersionError)")


def test_version_1_is_migrated(
    open_pg: Callable[..., PostgresStore],
    admin: psycopg.Connection[Any],
    schema: str,
    clock: ManualClock,
) -> None:
    make_version(admin, schema, 1)
    # Version 1 wrote future rows as 'pending'.
    fill(admin, schema, _FILL, queue="jobs", priority=9, run_at=T0 + timedelta(seconds=60), rows=1)
    fill(admin, schema, _FILL, queue="jobs", priority=0, run_at=T0 - timedelta(seconds=1), rows=1)
    q = open_pg().queue("jobs")
    assert version(admin, schema) == SCHEMA_VERSION
    indexes = index_names(admin, schema)
    assert {"jobs_scheduled", "jobs_processing", "jobs_lapsed", "jobs_expiry"} <= indexes
    assert not {"jobs_reclaim", "jobs_exhausted"} & indexes
    scheduled = q.enqueue("new", delay=120)  # the widened CHECK admits 'scheduled'
    assert q.stats() == (1, 2, 0, 0)
    # Version 3's migration moved the version 1 future row to 'scheduled'
    # (future at the migrating store's clock); the due one stays 'pending'.
    states = admin.execute(
        render(sql.SQL("SELECT priority, state FROM {jobs} ORDER BY id"), schema)
    ).fetchall()
    assert states == [(9, "scheduled"), (0, "pending"), (0, "scheduled")]
    handle = q.claim_one("w")
    assert handle is not None
    assert handle.payload == 1
    assert handle.run_at == T0 - timedelta(seconds=1) + timedelta(microseconds=1)
    assert handle.ack()
    clock.set(T0 + timedelta(seconds=60))
    assert q.claim_one("w") is None  # due at T0 + 60 s + 1 us
    clock.set(T0 + timedelta(seconds=60, microseconds=1))
    legacy = q.claim_one("w")
    assert legacy is not None
    assert legacy.priority == 9
    assert legacy.ack()
    clock.set(T0 + timedelta(seconds=120))
    last = q.claim_one("w")
    assert last is not None
    assert last.id == scheduled


@pytest.fixture
def other_schema(postgres_url: str) -> Iterator[str]:
    name = fresh_schema_name()
    yield name
    drop_schema(postgres_url, name)


def test_two_schemas_do_not_see_each_other(
    open_pg: Callable[..., PostgresStore], other_schema: str
) -> None:
    a, b = open_pg(), open_pg(schema=other_schema)
    qa, qb = a.queue("jobs"), b.queue("jobs")
    sub_b = b.listen("jobs")
    job_id = qa.enqueue("only in a")
    assert not sub_b.wait(0.3)  # no wake across schemas
    assert qb.claim_one("w") is None
    assert qb.get_job(job_id) is None
    assert not qb.cancel(job_id)
    assert qb.stats() == (0, 0, 0, 0)
    assert qa.stats() == (1, 0, 0, 0)
    other = qb.enqueue("only in b")
    handle = qa.claim_one("w")
    assert handle is not None
    assert handle.payload == "only in a"
    handle_b = qb.claim_one("w")
    assert handle_b is not None
    assert (handle_b.id, handle_b.payload) == (other, "only in b")


def test_numbered_gives_postgresql_parameters() -> None:
    query = b"SELECT %(b)s, %(a)s, %(b)s, '100%%'"
    assert numbered(query, ("a", "b")) == b"SELECT $2, $1, $2, '100%'"
    with pytest.raises(KeyError):
        numbered(b"SELECT %(c)s", ("a", "b"))


# -- plans ------------------------------------------------------------------

_FILL = """
    INSERT INTO {jobs} (queue, state, payload, content_type, priority, run_at,
        enqueued_at, max_attempts, visibility_timeout_s, backoff_base_s, backoff_cap_s)
    SELECT %(queue)s, 'pending', '\\x31'::bytea, 'application/json', %(priority)s,
        %(run_at)s::timestamptz + g * interval '1 microsecond', %(run_at)s, 5, 30, 4, 3600
    FROM generate_series(1, %(rows)s) AS g
"""
_FILL_DEAD = """
    INSERT INTO {dead} (id, queue, payload, content_type, priority, run_at, enqueued_at,
        attempts, max_attempts, visibility_timeout_s, backoff_base_s, backoff_cap_s, died_at)
    SELECT -g, %(queue)s, '\\x31'::bytea, 'application/json', 9, %(run_at)s, %(run_at)s,
        1, 5, 30, 4, 3600, %(run_at)s
    FROM generate_series(1, %(rows)s) AS g
"""


def fill(admin: psycopg.Connection[Any], schema: str, template: str, **params: Any) -> None:
    admin.execute(render(sql.SQL(template), schema), params)


def claim_plan(admin: psycopg.Connection[Any], schema: str, queue: str, now: datetime) -> Any:
    """The generic (prepared) plan of the claim, executed and rolled back."""
    text = numbered(render(CLAIM, schema), ("queue", "now", "n", "worker_id")).decode()
    admin.execute("BEGIN")
    try:
        admin.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        admin.execute(f"PREPARE claim_plan (text, timestamptz, bigint, text) AS {text}")
        row = admin.execute(
            sql.SQL(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim_plan({}, {}, 10, 'w')"
            ).format(sql.Literal(queue), sql.Literal(now))
        ).fetchone()
        admin.execute("DEALLOCATE claim_plan")
    finally:
        admin.execute("ROLLBACK")
    assert row is not None
    return row[0][0]


def make_version(admin: psycopg.Connection[Any], schema: str, version: int) -> None:
    """The schema exactly as the code of ``version`` created it."""
    with admin.transaction():
        admin.execute(render(_CREATE_SCHEMA, schema))
        admin.execute(render(_CREATE_META, schema))
        for statements in _MIGRATIONS[:version]:
            for statement in statements:
                query = render(statement, schema)
                admin.execute(query, {"now": T0} if b"%(" in query else None)
        admin.execute(render(_WRITE_VERSION, schema), ["schema_version", version])


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


_FILL_STATE = """
    INSERT INTO {jobs} (queue, state, payload, content_type, priority, run_at,
        enqueued_at, attempts, max_attempts, visibility_timeout_s, backoff_base_s,
        backoff_cap_s, worker_id, claim_deadline)
    SELECT %(queue)s, %(state)s, '\\x31'::bytea, 'application/json', %(priority)s,
        %(run_at)s::timestamptz + g * interval '1 microsecond', %(run_at)s, %(attempts)s, 5,
        30, 4, 3600, %(worker_id)s, %(deadline)s::timestamptz
    FROM generate_series(1, %(rows)s) AS g
"""


def fill_state(
    admin: psycopg.Connection[Any],
    schema: str,
    *,
    state: str,
    deadline: datetime | None = None,
    **params: Any,
) -> None:
    claimed = deadline is not None
    fill(
        admin,
        schema,
        _FILL_STATE,
        state=state,
        deadline=deadline,
        attempts=1 if claimed else 0,
        worker_id="w" if claimed else None,
        **params,
    )


@pytest.mark.slow
def test_claims_stay_index_driven_and_flat(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str
) -> None:
    early, late = datetime(2020, 1, 1, tzinfo=T0.tzinfo), datetime(2040, 1, 1, tzinfo=T0.tzinfo)
    # A small queue and a big one in one table, each with due jobs, future
    # jobs of a *higher* priority (scheduled), lapsed claims (as a claim
    # left them), and live claims of a higher priority (as many as workers
    # hold); the big one also has future jobs as version 1 wrote them
    # (pending, same priority), dead rows and a higher-priority queue beside
    # it.
    for queue, rows in (("small", 1_000), ("big", 100_000)):
        fill(admin, schema, _FILL, queue=queue, priority=0, run_at=early, rows=rows)
        fill_state(
            admin, schema, state="scheduled", queue=queue, priority=9, run_at=late, rows=rows
        )
        fill_state(
            admin,
            schema,
            state="lapsed",
            deadline=early,
            queue=queue,
            priority=0,
            run_at=early,
            rows=rows,
        )
        fill_state(
            admin,
            schema,
            state="processing",
            deadline=late,
            queue=queue,
            priority=9,
            run_at=early,
            rows=50,
        )
    fill(admin, schema, _FILL, queue="big", priority=0, run_at=late, rows=100_000)
    fill(admin, schema, _FILL, queue="other", priority=9, run_at=early, rows=50_000)
    fill(admin, schema, _FILL_DEAD, queue="big", run_at=early, rows=100_000)
    store.queue("other").pause()  # the claim's pause guard reads a row
    admin.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, "jobs")))
    admin.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "dead")))
    admin.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "queues")))

    buffers = {}
    for queue in ("small", "big"):
        plan = claim_plan(admin, schema, queue, T0)
        text = json.dumps(plan)
        # Only the pause guard may read its table (a page) whole.
        seq = {n["Relation Name"] for n in nodes(plan["Plan"]) if n["Node Type"] == "Seq Scan"}
        assert seq <= {"queues"}, text
        assert any(n.get("Relation Name") == "queues" for n in nodes(plan["Plan"])), text
        # Nothing big is sorted: no sort spills to disk.
        assert all(n.get("Sort Space Type", "Memory") == "Memory" for n in nodes(plan["Plan"]))
        scans = {n.get("Index Name") for n in nodes(plan["Plan"]) if "Index Name" in n}
        assert {
            "jobs_pending",
            "jobs_scheduled",
            "jobs_processing",
            "jobs_lapsed",
            "jobs_expiry",
        } <= scans
        assert plan["Plan"]["Actual Rows"] == 10
        buffers[queue] = sum(
            n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
            for n in nodes(plan["Plan"])
        )
    # 100 times the rows, future higher-priority jobs, lapsed claims, future
    # and dead rows beside them: the claim touches about the same number of
    # pages (a deeper B-tree costs a page per descent).
    assert buffers["big"] <= buffers["small"] + 40, buffers
