"""The claim is index-driven: its cost does not grow with the rows waiting
(docs/contract.md §3 "Claim"), whatever they wait for: their turn, their run_at, the
sweep of their expiry, or the reclaim of their lapsed claim.

The work is counted in SQLite virtual-machine instructions, not timed, so
these tests are exact and quick on any machine.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from alkstore import QueueOpts
from alkstore_contract_tests import ManualClock
from alkstore_sqlite import SqliteStore, open_store
from alkstore_sqlite._queue import (
    _BURY_EXHAUSTED,
    _BURY_EXPIRED,
    _LAPSED_CLAIMS,
    _MOVES,
    _STATS,
    CLAIM_ANY,
    CLAIM_DUE,
    CLAIM_DUE_ONE,
    LOOK,
)
from alkstore_sqlite._rows import to_us
from alkstore_sqlite._wake import _NEW_JOBS

#: Rows of the shape under test waiting, in the small and the large case.
SMALL, LARGE = 200, 20_000
#: B-tree depth grows by a level or so between them.
SLACK = 1.5


def _plan(conn: sqlite3.Connection, sql: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """``(step, parent step)`` of each line of the statement's query plan."""
    rows = conn.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
    detail = {row[0]: row[3] for row in rows}
    return [(row[3], detail.get(row[1], "")) for row in rows]


def _params(clock: ManualClock, n: int = 1) -> dict[str, Any]:
    return {"queue": "q", "worker": "w", "now": to_us(clock()), "n": n, "error": "e"}


def _search(index: str, terms: str) -> str:
    return f"SEARCH _alkstore_jobs USING INDEX {index} ({terms})"


def _covering(index: str, terms: str) -> str:
    return f"SEARCH _alkstore_jobs USING COVERING INDEX {index} ({terms})"


BY_ID = "SEARCH _alkstore_jobs USING INTEGER PRIMARY KEY (rowid=?)"
PENDING = _search("_alkstore_jobs_pending", "queue=?")
LAPSED = _search("_alkstore_jobs_lapsed", "queue=?")
CAME_DUE = _search("_alkstore_jobs_scheduled", "queue=? AND run_at<?")
CLAIMS_LAPSED = _search("_alkstore_jobs_processing", "queue=? AND claim_deadline<?")
NEWLY_EXPIRED = ("_alkstore_jobs_expiry", "queue=? AND state=? AND expires_at<?")
NOT_EXPIRED = ("_alkstore_jobs_expiry", "queue=? AND state=? AND expires_at>?")


def test_claim_plan_uses_the_partial_indexes(
    store: SqliteStore, db_path: Path, clock: ManualClock
) -> None:
    with sqlite3.connect(db_path) as conn:
        plans = {
            sql: _plan(conn, sql, _params(clock))
            for sql in (LOOK, CLAIM_DUE_ONE, CLAIM_DUE, CLAIM_ANY, _BURY_EXHAUSTED, *_MOVES)
        }
        steps = {sql: {step for step, _ in plan} for sql, plan in plans.items()}
    assert {
        CAME_DUE,
        CLAIMS_LAPSED,
        _covering(*NEWLY_EXPIRED),
        _covering(*NOT_EXPIRED),
        PENDING,
        LAPSED,
    } <= steps[LOOK]
    for sql in (CLAIM_DUE_ONE, CLAIM_DUE):
        # The index walk yields claim order: no sort at all.
        assert {PENDING, BY_ID} <= steps[sql]
        assert not [step for step in steps[sql] if "TEMP B-TREE" in step]
    assert {PENDING, LAPSED, BY_ID} <= steps[CLAIM_ANY]
    # CLAIM_ANY sorts only what its two walks returned (at most n rows
    # each), to merge them.
    for step, parent in plans[CLAIM_ANY]:
        if "TEMP B-TREE" in step:
            assert parent in ("LEFT", "RIGHT")
    # The dead-letter step and the moves find their rows by range.
    assert steps[_BURY_EXHAUSTED] == {CLAIMS_LAPSED}
    came_due, lapsed, newly_expired, not_expired = _MOVES
    assert steps[came_due] == {CAME_DUE}
    assert steps[lapsed] == {CLAIMS_LAPSED}
    assert steps[newly_expired] == {_search(*NEWLY_EXPIRED)}
    assert steps[not_expired] == {_search(*NOT_EXPIRED)}
    # No step reads the whole table.
    for plan in steps.values():
        assert not [step for step in plan if step.startswith("SCAN _alkstore_jobs")]


def test_stats_and_sweep_read_only_their_indexes(
    store: SqliteStore, db_path: Path, clock: ManualClock
) -> None:
    with sqlite3.connect(db_path) as conn:
        for sql in (_STATS, _BURY_EXPIRED):
            plan = [step for step, _ in _plan(conn, sql, _params(clock))]
            assert not [step for step in plan if step.startswith("SCAN _alkstore_jobs")]
            assert not [step for step in plan if "TEMP B-TREE" in step]
        sweep = [step for step, _ in _plan(conn, _BURY_EXPIRED, _params(clock))]
        assert sweep == [_search(*NEWLY_EXPIRED)]


def test_lapsed_claims_reads_one_index_range_per_state(
    store: SqliteStore, db_path: Path, clock: ManualClock
) -> None:
    """Live claims are passed over by their deadline's index range; the
    private 'lapsed' and 'expired' rows are read from their own indexes."""
    with sqlite3.connect(db_path) as conn:
        plan = [step for step, _ in _plan(conn, _LAPSED_CLAIMS, _params(clock))]
    assert [step for step in plan if step.startswith("SEARCH")] == [
        CLAIMS_LAPSED,
        LAPSED,
        _search("_alkstore_jobs_expiry", "queue=? AND state=? AND expires_at>?"),
    ]
    assert not [step for step in plan if step.startswith("SCAN _alkstore_jobs")]


# -- the work of whole claims, counted ---------------------------------------


@contextmanager
def _counting(store: SqliteStore) -> Iterator[dict[str, int]]:
    """Count the VM instructions of the store's operations inside."""
    # Single-threaded, the pool lends its one connection again and again.
    store.queue("warm-up").stats()
    (conn,) = store._pool._idle
    counter = {"steps": 0}

    def count() -> int:
        counter["steps"] += 1
        return 0

    conn.set_progress_handler(count, 1)
    try:
        yield counter
    finally:
        conn.set_progress_handler(None, 1)
    assert store._pool._idle == [conn]


Shape = Callable[[SqliteStore, ManualClock, int], None]


def _due(store: SqliteStore, clock: ManualClock, rows: int) -> None:
    store.queue("q").enqueue_many(["waiting"] * rows)


def _future_higher_priority(store: SqliteStore, clock: ManualClock, rows: int) -> None:
    # Due in an hour, at a priority above the job the claim is after: in
    # claim order they all come first.
    store.queue("q").enqueue_many(["future"] * rows, priority=10, delay=3600)


def _expired_unswept(store: SqliteStore, clock: ManualClock, rows: int) -> None:
    queue = store.queue("q")
    queue.enqueue_many(["expired"] * rows, priority=10, expires=5)
    clock.advance(10)
    # The first claim afterwards sets them aside, once (and finds nothing).
    assert queue.claim_batch("w", 1) == []
    assert queue.stats().pending == rows


def _lapsed_claims(store: SqliteStore, clock: ManualClock, rows: int) -> None:
    queue = store.queue("q", QueueOpts(visibility_timeout_s=5))
    queue.enqueue_many(["lapsed"] * rows, priority=-10)
    assert len(queue.claim_batch("dead-worker", rows)) == rows
    clock.advance(10)
    # The first claim afterwards finds them lapsed, once (and reclaims one).
    assert len(queue.claim_batch("w", 1)) == 1
    assert queue.stats().processing == rows


def _live_claims(store: SqliteStore, clock: ManualClock, rows: int) -> None:
    # Many claims in progress and one lapsed: finding the lapsed one must
    # not walk the live ones.
    queue = store.queue("q", QueueOpts(visibility_timeout_s=5))
    queue.enqueue("lapsed", priority=-10)
    assert len(queue.claim_batch("dead-worker", 1)) == 1
    clock.advance(4)
    live = store.queue("q", QueueOpts(visibility_timeout_s=3600))
    live.enqueue_many(["live"] * rows, priority=10)
    assert len(live.claim_batch("busy-worker", rows)) == rows
    clock.advance(2)


def _scheduled_then_claimed(store: SqliteStore, clock: ManualClock, rows: int) -> None:
    # Future rows that came due and were claimed, with as many future ones
    # behind them.
    queue = store.queue("q")
    queue.enqueue_many(["future"] * rows, priority=10, delay=3600)
    clock.advance(3600)
    assert len(queue.claim_batch("w", rows)) == rows
    queue.enqueue_many(["later"] * rows, priority=10, delay=3600)


SHAPES: dict[str, Shape] = {
    "due": _due,
    "future-higher-priority": _future_higher_priority,
    "expired-unswept": _expired_unswept,
    "lapsed-claims": _lapsed_claims,
    "live-claims-and-one-lapsed": _live_claims,
    "scheduled-then-claimed": _scheduled_then_claimed,
}


def _claim_work(path: Path, shape: Shape, rows: int, n: int) -> tuple[int, int]:
    """VM instructions and rows of ``claim_batch(n)`` with ``rows`` rows of
    ``shape`` waiting and one fresh due job at priority 5 (which comes
    first: the shapes' claimable rows have lower priorities)."""
    clock = ManualClock()
    with open_store(f"sqlite:///{path}", clock=clock) as store:
        shape(store, clock, rows)
        queue = store.queue("q")
        queue.enqueue("fresh", priority=5)
        with _counting(store) as counter:
            handles = queue.claim_batch("w", n)
        assert handles[0].payload == "fresh"
        return counter["steps"], len(handles)


@pytest.mark.parametrize("n", [1, 10])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_claim_work_does_not_grow_with_waiting_rows(tmp_path: Path, shape: str, n: int) -> None:
    small, small_rows = _claim_work(tmp_path / "small.db", SHAPES[shape], SMALL, n)
    large, large_rows = _claim_work(tmp_path / "large.db", SHAPES[shape], LARGE, n)
    assert small_rows == large_rows
    # 200 versus 20,000 rows of the shape waiting: the same work, give or
    # take B-tree depth.
    assert large <= small * SLACK, (small, large)


def test_rows_whose_time_came_are_moved_once(
    open_sqlite: Callable[..., SqliteStore], clock: ManualClock
) -> None:
    store = open_sqlite()
    baseline_queue = store.queue("baseline")
    baseline_queue.enqueue("due")
    with _counting(store) as baseline:
        assert len(baseline_queue.claim_batch("w", 1)) == 1

    queue = store.queue("q", QueueOpts(visibility_timeout_s=3600))
    queue.enqueue_many(["future"] * SMALL, priority=10, delay=60)
    queue.enqueue_many(["expiring"] * SMALL, priority=10, expires=30)
    short = store.queue("q", QueueOpts(visibility_timeout_s=10))
    short.enqueue_many(["claimed"] * SMALL, priority=15)
    assert len(short.claim_batch("dead-worker", SMALL)) == SMALL

    def claim() -> int:
        queue.enqueue("due", priority=20)
        with _counting(store) as counter:
            (handle,) = queue.claim_batch("w", 1)
        assert handle.payload == "due"
        return counter["steps"]

    clock.advance(45)  # expired, lapsed, not due yet
    assert claim() > 20 * baseline["steps"]
    assert claim() <= SLACK * baseline["steps"]
    clock.advance(30)  # due
    assert claim() > 20 * baseline["steps"]
    assert claim() <= SLACK * baseline["steps"]
    # The moves changed no public state.
    assert queue.stats() == (SMALL * 2, 0, SMALL + 4, 0)


def test_the_wake_detector_reads_a_rowid_range(store: SqliteStore, db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + _NEW_JOBS, (0,))]
    assert "SEARCH _alkstore_jobs USING INTEGER PRIMARY KEY (rowid>?)" in plan
