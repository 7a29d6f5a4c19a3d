"""The claim is index-driven: its cost does not grow with the rows waiting
(SPEC §3 "Claim")."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from alkstore_contract_tests import ManualClock
from alkstore_sqlite import SqliteStore
from alkstore_sqlite._queue import CLAIM_ANY, CLAIM_DUE, CLAIM_DUE_ONE, LOOK
from alkstore_sqlite._rows import to_us
from alkstore_sqlite._wake import _NEW_JOBS


def _plan(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> list[str]:
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


def _params(clock: ManualClock, n: int = 1) -> dict[str, Any]:
    return {"queue": "q", "worker": "w", "now": to_us(clock()), "n": n}


def test_claim_plan_uses_the_partial_indexes(
    store: SqliteStore, db_path: Path, clock: ManualClock
) -> None:
    pending = "SEARCH _alkstore_jobs USING INDEX _alkstore_jobs_pending (queue=?)"
    lapsed = (
        "SEARCH _alkstore_jobs USING INDEX _alkstore_jobs_processing (queue=? AND claim_deadline<?)"
    )
    exhausted = (
        "SEARCH _alkstore_jobs USING INDEX _alkstore_jobs_exhausted (queue=? AND claim_deadline<?)"
    )
    by_id = "SEARCH _alkstore_jobs USING INTEGER PRIMARY KEY (rowid=?)"
    with sqlite3.connect(db_path) as conn:
        plans = {
            sql: _plan(conn, sql, _params(clock))
            for sql in (LOOK, CLAIM_DUE_ONE, CLAIM_DUE, CLAIM_ANY)
        }
    assert {pending, lapsed, exhausted} <= set(plans[LOOK])
    for sql in (CLAIM_DUE_ONE, CLAIM_DUE):
        # The index walk yields claim order: no sort at all.
        assert {pending, by_id} <= set(plans[sql])
        assert not [step for step in plans[sql] if "TEMP B-TREE" in step]
    assert {pending, lapsed, by_id} <= set(plans[CLAIM_ANY])
    # No step reads the whole table.
    for plan in plans.values():
        assert not [step for step in plan if step.startswith("SCAN _alkstore_jobs")]


def _vm_steps(db_path: Path, sql: str, params: dict[str, Any]) -> int:
    """SQLite virtual-machine instructions one statement runs (rolled back)."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.set_progress_handler(count, 1)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(sql, params).fetchall()
        conn.set_progress_handler(None, 1)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    return steps


@pytest.mark.parametrize("n", [1, 10])
def test_claim_work_does_not_grow_with_waiting_rows(
    store: SqliteStore, db_path: Path, clock: ManualClock, n: int
) -> None:
    queue = store.queue("q")
    other = store.queue("other")
    queue.enqueue_many(list(range(200)))
    # Some lapsed claims too, so both branches of the claim have rows.
    for handle in queue.claim_batch("w", 5):
        assert handle.attempts == 1
    clock.advance(60)
    statements = (LOOK, CLAIM_DUE_ONE, CLAIM_DUE, CLAIM_ANY)
    small = [_vm_steps(db_path, sql, _params(clock, n)) for sql in statements]
    for _ in range(10):
        queue.enqueue_many(list(range(2_000)))
        other.enqueue_many(list(range(2_000)))
    queue.enqueue_many(list(range(2_000)), delay=3600)
    large = [_vm_steps(db_path, sql, _params(clock, n)) for sql in statements]
    # 200 versus 42,200 rows of the queue waiting: the same work, give or
    # take B-tree depth.
    for before, after in zip(small, large, strict=True):
        assert after <= before * 1.5


def test_the_wake_detector_reads_a_rowid_range(store: SqliteStore, db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + _NEW_JOBS, (0,))]
    assert "SEARCH _alkstore_jobs USING INTEGER PRIMARY KEY (rowid>?)" in plan
