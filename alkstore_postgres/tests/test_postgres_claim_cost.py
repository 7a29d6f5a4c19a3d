"""The private states 'lapsed' and 'expired' (docs/decisions.md D25): a
claim's cost does not grow with the rows that wait (docs/contract.md §3 "Claim"),
measured in the pages it touches rather than in time; every move a claim
makes; and the migration from version 3, whose lapsed and expired rows the
first claim moves."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from postgres_helpers import index_names
from postgres_server import throwaway_cluster
from psycopg import sql
from test_postgres_schema import claim_plan, make_version, nodes, version

from alkstore_contract_tests import T0, ManualClock
from alkstore_postgres import SCHEMA_VERSION, PostgresStore
from alkstore_postgres._schema import (
    render,
)

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A throwaway cluster for this module: its page counts assume VACUUM
    can clean the table, which no other session's snapshot may stop (on a
    shared server, any long transaction in the database does)."""
    with contextlib.ExitStack() as stack:
        yield throwaway_cluster(stack).url()


_S = timedelta(seconds=1)

# Rows as the engine writes them, every instant given: ``rows`` of them,
# their run_at a microsecond apart from ``run_at`` on.
_FILL = """
    INSERT INTO {jobs} (queue, state, payload, content_type, priority, run_at,
        expires_at, enqueued_at, attempts, max_attempts, visibility_timeout_s,
        backoff_base_s, backoff_cap_s, worker_id, claim_deadline)
    SELECT %(queue)s, %(state)s, '\\x31'::bytea, 'application/json', %(priority)s,
        %(run_at)s::timestamptz + g * interval '1 microsecond',
        %(expires_at)s::timestamptz, %(t0)s::timestamptz, %(attempts)s, %(max_attempts)s,
        30, 4, 3600, %(worker_id)s, %(deadline)s::timestamptz
    FROM generate_series(1, %(rows)s) AS g
    RETURNING id
"""


def put(
    admin: psycopg.Connection[Any],
    schema: str,
    queue: str,
    state: str,
    *,
    rows: int = 1,
    priority: int = 0,
    run_at: datetime = T0,
    expires_at: datetime | None = None,
    deadline: datetime | None = None,
    attempts: int | None = None,
    max_attempts: int = 5,
) -> list[int]:
    """Insert rows in a private state; a ``deadline`` makes them claims."""
    claimed = deadline is not None
    params = {
        "queue": queue,
        "state": state,
        "rows": rows,
        "priority": priority,
        "run_at": run_at,
        "expires_at": expires_at,
        "t0": T0,
        "attempts": (1 if claimed else 0) if attempts is None else attempts,
        "max_attempts": max_attempts,
        "worker_id": "w" if claimed else None,
        "deadline": deadline,
    }
    cur = admin.execute(render(sql.SQL(_FILL), schema), params)
    return [job_id for (job_id,) in cur.fetchall()]


def states(admin: psycopg.Connection[Any], schema: str, queue: str) -> dict[str, int]:
    rows = admin.execute(
        render(sql.SQL("SELECT state, count(*) FROM {jobs} WHERE queue = %s GROUP BY 1"), schema),
        [queue],
    ).fetchall()
    return dict(rows)


def analyze(admin: psycopg.Connection[Any], schema: str) -> None:
    admin.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, "jobs")))
    admin.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "dead")))
    admin.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "queues")))


def buffers(plan: dict[str, Any]) -> int:
    """The shared pages a plan's nodes hit or read (a node's count includes
    its children's; the top node's is the statement's)."""
    total: int = plan["Plan"].get("Shared Hit Blocks", 0)
    total += plan["Plan"].get("Shared Read Blocks", 0)
    return total


# The four kinds of rows that wait without being claimable, each with the
# instants a tester gave them: enqueued with expires=5 s and not swept; claims
# that lapsed after 1 s and expired; live claims; future jobs. Every one sits
# ahead of the due job in claim order (same priority, earlier run_at), so a
# claim that walked over them would touch more pages with more of them.
_WAITING: dict[str, dict[str, Any]] = {
    "expired": {"state": "pending", "expires_at": T0 + 5 * _S},
    "lapsed_expired": {"state": "processing", "expires_at": T0 + 5 * _S, "deadline": T0 + _S},
    "live": {"state": "processing", "deadline": T0 + 3600 * _S},
    "future": {"state": "scheduled", "run_at": T0 + 3600 * _S},
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(_WAITING))
def test_a_claim_touches_the_same_pages_however_many_rows_wait(
    store: PostgresStore,
    admin: psycopg.Connection[Any],
    schema: str,
    clock: ManualClock,
    kind: str,
) -> None:
    now = T0 + 6 * _S
    clock.set(now)
    sizes = {"small": 1_000, "big": 50_000}
    expected = {}
    for queue, rows in sizes.items():
        put(admin, schema, queue, rows=rows, **_WAITING[kind])
        # The claim that finds them moves each one once (and hands out
        # nothing); this is the claim the tester measured after it.
        assert store.queue(queue).claim_one("w") is None
        # Then a due job and a claim that lapsed since, after all of them
        # in claim order.
        due = put(admin, schema, queue, "pending", run_at=T0 + 2 * _S)
        lapsed = put(admin, schema, queue, "processing", run_at=T0 + 3 * _S, deadline=T0 + 4 * _S)
        expected[queue] = due + lapsed
    analyze(admin, schema)

    pages = {}
    for queue in sizes:
        plan = claim_plan(admin, schema, queue, now)
        text = json.dumps(plan)
        seq = {n["Relation Name"] for n in nodes(plan["Plan"]) if n["Node Type"] == "Seq Scan"}
        assert seq <= {"queues"}, text
        assert plan["Plan"]["Actual Rows"] == 2, text
        pages[queue] = buffers(plan)
    # 50 times the rows: about the same pages (a deeper B-tree costs a page
    # per descent, and the claim makes about a dozen).
    assert pages["big"] <= pages["small"] + 25, pages

    for queue in sizes:
        handles = store.queue(queue).claim_batch("w", 10)
        assert [h.id for h in handles] == expected[queue]
        assert handles[1].attempts == 2
        assert all(h.ack() for h in handles)
        assert store.queue(queue).claim_one("w") is None


def test_the_first_claim_moves_each_kind_of_row_once(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str, clock: ManualClock
) -> None:
    q = store.queue("q")
    expired = put(admin, schema, "q", "pending", expires_at=T0 + 5 * _S)
    lapsed_expired = put(admin, schema, "q", "processing", expires_at=T0 + 5 * _S, deadline=T0 + _S)
    live = put(admin, schema, "q", "processing", deadline=T0 + 3600 * _S)
    future = put(admin, schema, "q", "scheduled", run_at=T0 + 3600 * _S)
    came_due_expired = put(admin, schema, "q", "scheduled", run_at=T0 + _S, expires_at=T0 + _S)
    came_due = put(admin, schema, "q", "scheduled", run_at=T0 + 2 * _S, priority=-1)
    lapsed = put(admin, schema, "q", "processing", deadline=T0 + _S, priority=-2, rows=2)
    exhausted = put(admin, schema, "q", "processing", deadline=T0 + _S, attempts=5, max_attempts=5)
    clock.set(T0 + 6 * _S)
    assert q.stats() == (3, 1, 5, 0)
    handle = q.claim_one("w")
    assert handle is not None
    assert handle.id == came_due[0]
    assert states(admin, schema, "q") == {
        "expired": 3,
        "processing": 2,
        "lapsed": 2,
        "scheduled": 1,
    }

    def private(job_id: int) -> str:
        row = admin.execute(
            render(sql.SQL("SELECT state FROM {jobs} WHERE id = %s"), schema), [job_id]
        ).fetchone()
        assert row is not None
        return str(row[0])

    assert {private(i) for i in expired + lapsed_expired + came_due_expired} == {"expired"}
    assert private(live[0]) == private(handle.id) == "processing"
    assert private(future[0]) == "scheduled"
    assert {private(i) for i in lapsed} == {"lapsed"}
    dead = q.get_job(exhausted[0])
    assert dead is not None
    assert (dead.state, dead.last_error) == ("dead", "max attempts exceeded")
    # Publicly nothing changed but the claim and the dead letter.
    public = {i: q.get_job(i) for i in expired + lapsed_expired + came_due_expired + lapsed}
    assert [j.state if j else None for j in public.values()] == [
        "pending",
        "processing",
        "pending",
        "processing",
        "processing",
    ]
    assert q.stats() == (2, 1, 5, 1)
    # A second claim finds nothing to move; the lapsed claims are next.
    reclaimed = q.claim_batch("w", 10)
    assert [h.id for h in reclaimed] == lapsed
    assert q.sweep_expired() == (3, 0)
    assert q.stats() == (0, 1, 4, 4)


def test_a_clock_moving_back_restores_expired_rows(
    store: PostgresStore, admin: psycopg.Connection[Any], schema: str, clock: ManualClock
) -> None:
    q = store.queue("q")
    pending = q.enqueue("p", expires=10)
    claimed = q.enqueue("c", expires=10, priority=1)
    handle = q.claim_one("w")
    assert handle is not None
    assert handle.id == claimed
    clock.set(T0 + 40 * _S)  # lapsed (30 s) and expired (10 s)
    assert q.claim_one("w") is None
    assert states(admin, schema, "q") == {"expired": 2}
    assert not handle.heartbeat()
    # Back before the expiry and the claim's deadline: the claim is valid
    # again, and the pending job claimable.
    clock.set(T0 + 5 * _S)
    assert handle.heartbeat(60)
    got = q.claim_one("w")
    assert got is not None
    assert got.id == pending
    # The other one holds its claim again (the heartbeat made it live).
    assert states(admin, schema, "q") == {"processing": 2}
    assert q.stats() == (0, 0, 2, 0)
    assert handle.ack()
    assert got.ack()
    assert q.stats() == (0, 0, 0, 0)


def test_version_3_is_migrated_with_lapsed_and_expired_rows(
    open_pg: Callable[..., PostgresStore],
    admin: psycopg.Connection[Any],
    schema: str,
    clock: ManualClock,
) -> None:
    make_version(admin, schema, 3)
    # Rows as version 3 code left them at T0 + 6 s: expired pending rows,
    # a lapsed claim that also expired, a lapsed claim with attempts left,
    # an exhausted one, a live claim, a future row and a due one.
    expired = put(admin, schema, "old", "pending", expires_at=T0 + 5 * _S, rows=2)
    lapsed_expired = put(
        admin, schema, "old", "processing", expires_at=T0 + 5 * _S, deadline=T0 + _S
    )
    lapsed = put(admin, schema, "old", "processing", deadline=T0 + _S, run_at=T0 + 2 * _S)
    exhausted = put(
        admin, schema, "old", "processing", deadline=T0 + _S, attempts=5, max_attempts=5
    )
    live = put(admin, schema, "old", "processing", deadline=T0 + 3600 * _S, priority=9)
    future = put(admin, schema, "old", "scheduled", run_at=T0 + 3600 * _S)
    due = put(admin, schema, "old", "pending", run_at=T0 + _S)
    select_all = render(sql.SQL("SELECT * FROM {jobs} ORDER BY id"), schema)
    before = admin.execute(select_all).fetchall()

    clock.set(T0 + 6 * _S)
    store = open_pg()
    assert version(admin, schema) == SCHEMA_VERSION
    # No row rewritten (version 6 added unique_key, NULL on every old row).
    assert [(*row, None) for row in before] == admin.execute(select_all).fetchall()
    indexes = index_names(admin, schema)
    assert {"jobs_pending", "jobs_scheduled", "jobs_processing", "jobs_lapsed"} <= indexes
    assert not {"jobs_reclaim", "jobs_exhausted"} & indexes
    expiry = admin.execute(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND indexname = 'jobs_expiry'",
        [schema],
    ).fetchone()
    assert expiry is not None
    assert "(queue, state, expires_at) WHERE (expires_at IS NOT NULL)" in expiry[0]
    # The widened CHECK admits the new states, and still refuses others.
    probe = render(sql.SQL("UPDATE {jobs} SET state = %s WHERE id = %s"), schema)
    with pytest.raises(psycopg.errors.CheckViolation), admin.transaction():
        admin.execute(probe, ["gone", due[0]])

    q = store.queue("old")
    assert store.queue_names() == ["old"]
    assert q.stats() == (3, 1, 4, 0)
    handles = q.claim_batch("w", 10)
    assert [h.id for h in handles] == due + lapsed
    assert states(admin, schema, "old") == {"expired": 3, "processing": 3, "scheduled": 1}
    buried = q.get_job(exhausted[0])
    assert buried is not None
    assert buried.state == "dead"
    assert q.stats() == (2, 1, 4, 1)
    assert store.queue_names() == ["old"]
    assert q.sweep_expired() == (3, 0)
    assert {q.get_job(i).state for i in expired + lapsed_expired} == {"dead"}  # type: ignore[union-attr]
    assert q.get_job(live[0]) is not None
    assert q.get_job(future[0]) is not None
    assert all(h.ack() for h in handles)
    assert q.stats() == (0, 1, 1, 4)


def test_the_claim_settles_on_its_generic_plan(
    open_pg: Callable[..., PostgresStore],
    admin: psycopg.Connection[Any],
    schema: str,
    clock: ManualClock,
) -> None:
    store = open_pg(pool_max_size=1)  # one session holds the prepared claim
    # Rows in every range the claim's moves read, none of them due to move:
    # a custom plan would know the ranges are empty, the generic plan must
    # not guess them bigger (or every claim is planned afresh).
    put(admin, schema, "q", "pending", rows=20_000, expires_at=T0 + 3600 * _S)
    put(admin, schema, "q", "scheduled", rows=20_000, run_at=T0 + 3600 * _S)
    put(admin, schema, "q", "processing", rows=20_000, deadline=T0 + 3600 * _S)
    put(admin, schema, "q", "expired", rows=20_000, expires_at=T0 - _S)
    analyze(admin, schema)
    clock.set(T0 + _S)
    q = store.queue("q")
    for _ in range(8):
        handle = q.claim_one("w")
        assert handle is not None
        assert handle.ack()
    with store._db.connection() as conn:
        row = conn.execute(
            "SELECT sum(generic_plans) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%WITH paused AS%"],
        ).fetchone()
    assert row is not None
    assert row[0] >= 3, row


def test_the_claim_is_never_planned_again_after_a_drain(
    open_pg: Callable[..., PostgresStore],
    admin: psycopg.Connection[Any],
    schema: str,
    clock: ManualClock,
) -> None:
    """After a large drain the statistics still count the drained rows, and
    PostgreSQL's 'auto' plan choice then found the generic plan dearer and
    re-planned every claim (0.5 ms, about doubling the wake latency): the
    pool forces the generic plan, so the claim's plan is made once."""
    store = open_pg(pool_max_size=1)  # one session holds the prepared claim
    drained = store.queue("drained")
    drained.enqueue_many(list(range(20_000)))
    analyze(admin, schema)
    while batch := drained.claim_batch("w", 100):
        assert drained.ack_batch([h.id for h in batch]) == len(batch)
    q = store.queue("q")
    for _ in range(8):
        q.enqueue("x")
        handle = q.claim_one("w")
        assert handle is not None
        assert handle.ack()
    with store._db.connection() as conn:
        row = conn.execute(
            "SELECT sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            ["%WITH paused AS%"],
        ).fetchone()
    assert row == (8, 0)


def test_a_worker_claims_ahead_in_prepared_sizes(
    open_pg: Callable[..., PostgresStore], admin: psycopg.Connection[Any], schema: str
) -> None:
    """Up to 16, and a power of two up to 1024 (what a worker's prefetch
    asks for), a claim is a statement prepared once per connection; any
    other size is planned at each call (about 1 ms more)."""
    store = open_pg(pool_max_size=1)  # one session: its prepared statements
    q = store.queue("q")
    for n in (1, 16, 17, 64, 100, 1024, 2048):
        assert q.claim_batch("w", n) == []
        assert q.claim_batch("w", n) == []
    with store._db.connection() as conn:
        rows = conn.execute(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%WITH paused AS%"],
        ).fetchall()
    limits = {int(m) for (text,) in rows for m in re.findall(r"LIMIT (\d+)", text)}
    assert limits == {1, 16, 64, 1024}
