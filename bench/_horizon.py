"""The pinned-horizon rows of bench_postgres.py: what a claim costs after
100,000 jobs went through while a long-open transaction elsewhere kept
VACUUM from cleaning up after them, against the same after a VACUUM.

It pins the xmin horizon of a whole server, so it makes a throwaway cluster
of its own (the one of :mod:`_restart`), never the server named by
``--url``. Two stores in two fresh schemas of that cluster:

* ``clean``: 100,000 jobs go through (``enqueue_many`` of 100, then
  ``claim_batch`` + ``ack_batch`` of them, as fast as one client can), then
  ``VACUUM (ANALYZE, INDEX_CLEANUP ON)`` of its tables;
* ``pinned``: first a separate connection opens ``BEGIN ISOLATION LEVEL
  REPEATABLE READ`` and reads a table (its snapshot now holds the horizon:
  no row version deleted after it can be removed), then the same 100,000
  jobs go through. The pin is released in a ``finally`` block.

On each, the timed operations are a ``claim_one`` + ``ack`` of one fresh
job (enqueued first, not timed) and an empty ``claim_one``; each figure is
the median of ``samples`` of them. The ratio pinned / clean is the row the
target is on (within 3x).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from _report import Row
from _restart import _cluster

import alkstore

__all__ = ["TARGET_RATIO", "horizon_rows"]

#: The target: pinned claim cost over clean claim cost.
TARGET_RATIO = 3.0
JOBS = 100_000
BATCH = 100
PAYLOAD = {"task": "noop", "args": [1, 2, 3]}


def _run_through(queue: alkstore.Queue, jobs: int) -> float:
    """``jobs`` jobs enqueued, claimed and acked in batches; seconds taken."""
    begun = time.perf_counter()
    for _ in range(jobs // BATCH):
        queue.enqueue_many([PAYLOAD] * BATCH)
        handles = queue.claim_batch("bench", BATCH)
        if len(handles) != BATCH:
            raise RuntimeError(f"claimed {len(handles)} of {BATCH}")
        queue.ack_batch([h.id for h in handles])
    return time.perf_counter() - begun


def _median_ms(samples: int, before: Callable[[], object], timed: Callable[[], object]) -> float:
    out = []
    for _ in range(samples):
        before()
        begun = time.perf_counter()
        timed()
        out.append((time.perf_counter() - begun) * 1000)
    return statistics.median(out)


def _costs(queue: alkstore.Queue, samples: int) -> tuple[float, float]:
    """Median ms of a claim_one + ack of a fresh job, and of an empty claim."""

    def claim_ack() -> None:
        handle = queue.claim_one("bench")
        if handle is None:
            raise RuntimeError("the fresh job was not claimed")
        handle.ack()

    def empty() -> None:
        if queue.claim_one("bench") is not None:
            raise RuntimeError("the queue was not empty")

    # Warm: the statements prepared on the pool's connections.
    for _ in range(5):
        queue.enqueue(PAYLOAD)
        claim_ack()
        empty()
    busy = _median_ms(samples, lambda: queue.enqueue(PAYLOAD), claim_ack)
    idle = _median_ms(samples, lambda: None, empty)
    return busy, idle


def _dead_tuples(url: str, schema: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = %s",
            [schema],
        ).fetchone()
    return int(row[0]) if row else 0


def horizon_rows(quick: bool = False, notes: list[str] | None = None) -> list[Row]:
    """Measure both schemas on a throwaway cluster; return the rows (ms per
    claim + ack and per empty claim, clean and pinned, then the ratios).

    ``quick`` takes 50 samples instead of 300 (the 100,000 jobs go through
    either way: that is the scenario). Lines for under the table go to
    ``notes``.

    Raises
    ------
    RuntimeError
        If no throwaway cluster can be made.
    """
    samples = 50 if quick else 300
    figures: dict[str, tuple[float, float]] = {}
    with _cluster() as cluster:
        url = cluster.url
        for schema in ("clean", "pinned"):
            pin = None
            try:
                if schema == "pinned":
                    pin = psycopg.connect(url, autocommit=True)
                    pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    pin.execute("SELECT 1 FROM pg_class LIMIT 1")
                with alkstore.open(url, schema=schema) as store:
                    queue = store.queue("bloat")
                    took = _run_through(queue, JOBS)
                    if pin is None:
                        with psycopg.connect(url, autocommit=True) as conn:
                            conn.execute(f"VACUUM (ANALYZE, INDEX_CLEANUP ON) {schema}.jobs")
                            conn.execute(f"VACUUM (ANALYZE, INDEX_CLEANUP ON) {schema}.dead")
                    dead = _dead_tuples(url, schema)
                    figures[schema] = _costs(queue, samples)
                if notes is not None:
                    notes.append(
                        f"horizon rows, {schema}: {JOBS:,} jobs went through in {took:.1f} s"
                        f" ({JOBS / took:,.0f}/s); dead tuples then {dead:,}"
                    )
            finally:
                if pin is not None:
                    pin.close()
    (busy_clean, idle_clean), (busy_pinned, idle_pinned) = figures["clean"], figures["pinned"]
    ratio = busy_pinned / busy_clean
    idle_ratio = idle_pinned / idle_clean
    target = f"<= {TARGET_RATIO:g}"
    return [
        Row("claim_one + ack after 100k jobs, vacuumed", "ms/job", {"alkstore": busy_clean}),
        Row("claim_one + ack after 100k jobs, horizon pinned", "ms/job", {"alkstore": busy_pinned}),
        Row("empty claim after 100k jobs, vacuumed", "ms", {"alkstore": idle_clean}),
        Row("empty claim after 100k jobs, horizon pinned", "ms", {"alkstore": idle_pinned}),
        Row(
            "claim cost, horizon pinned after 100k jobs / clean",
            "ratio",
            {"alkstore": ratio},
            target,
            "ok" if ratio <= TARGET_RATIO else "MISS",
        ),
        Row(
            "empty claim, horizon pinned after 100k jobs / clean",
            "ratio",
            {"alkstore": idle_ratio},
            target,
            "ok" if idle_ratio <= TARGET_RATIO else "MISS",
        ),
    ]


if __name__ == "__main__":  # python bench/_horizon.py [--quick]
    from _report import Table

    notes: list[str] = []
    table = Table("PostgreSQL, pinned xmin horizon (throwaway cluster)", ["alkstore"])
    for row in horizon_rows(quick="--quick" in sys.argv, notes=notes):
        table.add(row)
    print(table.render())
    for note in notes:
        print(note)
