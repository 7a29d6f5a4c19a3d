"""SQLite benchmark: alkstore beside the raw sqlite3 ceiling, in one run.

Run from the repository root after installing requirements-dev.txt (and,
for the peer columns, bench/requirements.txt)::

    python bench/bench_sqlite.py            # the full run (1,000 and 1,000,000 waiting)
    python bench/bench_sqlite.py --quick    # a smoke run (1,000 and 20,000 waiting)

Every figure is jobs (or rows) per second unless the unit says otherwise.
"raw" runs the bare statements an ideal queue would need, on the same file
settings (WAL, the same ``synchronous``), so the ratio shows alkstore's own
cost. ``--synchronous full`` is alkstore's durable default; ``normal`` is the
faster setting whose last commits a power loss may drop.
"W waiting" means at least W further jobs stay queued during the measurement.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Row, Table, percentile, rate

import alkstore

BATCH = 100
PAYLOAD = {"task": "noop", "args": [1, 2, 3]}


# -- raw sqlite3 ceiling -----------------------------------------------------


class Raw:
    """The bare statements of a queue on a plain table: one INSERT per job,
    one UPDATE ... RETURNING per claim (returning what a worker needs at
    least: the id and the payload), one DELETE per ack."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " queue TEXT NOT NULL, state INTEGER NOT NULL DEFAULT 0,"
            " priority INTEGER NOT NULL DEFAULT 0, run_at INTEGER NOT NULL,"
            " payload BLOB NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
            " worker_id TEXT, claim_deadline INTEGER)"
        )
        self.db.execute(
            "CREATE INDEX IF NOT EXISTS jobs_claim ON jobs (queue, priority DESC, run_at, id)"
            " WHERE state = 0"
        )
        self.payload = b'{"task":"noop","args":[1,2,3]}'

    def insert_one(self, n: int) -> None:
        for _ in range(n):
            self.db.execute(
                "INSERT INTO jobs (queue, run_at, payload) VALUES ('q', ?, ?)",
                (time.time_ns() // 1000, self.payload),
            )

    def insert_batches(self, n: int, batch: int = BATCH) -> None:
        for start in range(0, n, batch):
            now = time.time_ns() // 1000
            rows = [("q", now, self.payload)] * min(batch, n - start)
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany("INSERT INTO jobs (queue, run_at, payload) VALUES (?, ?, ?)", rows)
            self.db.execute("COMMIT")

    def drain(self, n: int, batch: int) -> None:
        done = 0
        while done < n:
            now = time.time_ns() // 1000
            ids = [
                r[0]
                for r in self.db.execute(
                    "UPDATE jobs SET state = 1, attempts = attempts + 1, worker_id = 'w',"
                    " claim_deadline = ? WHERE id IN (SELECT id FROM jobs WHERE queue = 'q'"
                    " AND state = 0 AND run_at <= ? ORDER BY priority DESC, run_at, id"
                    " LIMIT ?) RETURNING id, payload",
                    (now + 30_000_000, now, batch),
                ).fetchall()
            ]
            if not ids:
                raise RuntimeError("raw queue ran dry")
            marks = ",".join("?" * len(ids))
            self.db.execute(f"DELETE FROM jobs WHERE id IN ({marks})", ids)
            done += len(ids)


# -- alkstore ----------------------------------------------------------------


def enqueue_one(q: alkstore.Queue, n: int) -> None:
    for _ in range(n):
        q.enqueue(PAYLOAD)


def enqueue_batches(q: alkstore.Queue, n: int, batch: int = BATCH) -> None:
    for start in range(0, n, batch):
        q.enqueue_many([PAYLOAD] * min(batch, n - start))


def drain_one(q: alkstore.Queue, n: int) -> None:
    for _ in range(n):
        handle = q.claim_one("bench")
        if handle is None:
            raise RuntimeError("queue ran dry")
        handle.ack()


def drain_batches(q: alkstore.Queue, n: int, batch: int = BATCH) -> None:
    done = 0
    while done < n:
        handles = q.claim_batch("bench", min(batch, n - done))
        if not handles:
            raise RuntimeError("queue ran dry")
        q.ack_batch([h.id for h in handles])
        done += len(handles)


def _drain_child(url: str, n: int, start: Any, synchronous: str) -> None:
    with alkstore.open(url, synchronous=synchronous) as store:
        q = store.queue("q")
        start.wait()
        drain_batches(q, n)


def drain_processes(url: str, n: int, procs: int, synchronous: str) -> float:
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    children = [
        ctx.Process(target=_drain_child, args=(url, n // procs, start, synchronous))
        for _ in range(procs)
    ]
    for c in children:
        c.start()
    time.sleep(2.0)  # let every child open its store before the clock starts
    began = time.perf_counter()
    start.set()
    for c in children:
        c.join()
        if c.exitcode != 0:
            raise RuntimeError(f"drain child failed with {c.exitcode}")
    return n / (time.perf_counter() - began)


def _wake_child(url: str, ready: Any, pipe: Any, samples: int) -> None:
    with alkstore.open(url) as store, store.listen("wake") as sub:
        ready.set()
        for _ in range(samples):
            if not sub.wait(5.0):
                pipe.send(None)
                continue
            pipe.send(time.clock_gettime_ns(time.CLOCK_MONOTONIC))


def wake_latency(url: str, samples: int) -> list[float]:
    """Milliseconds from an enqueue's commit in this process to the wake in
    another process."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    here, there = ctx.Pipe()
    child = ctx.Process(target=_wake_child, args=(url, ready, there, samples))
    child.start()
    ready.wait(30)
    out: list[float] = []
    with alkstore.open(url) as store:
        q = store.queue("wake")
        for i in range(samples):
            time.sleep(0.005 + (i % 7) * 0.002)  # the subscriber idles between wakes
            q.enqueue(i)
            committed = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            woke = here.recv()
            if woke is not None:
                out.append(max(0, woke - committed) / 1e6)
    child.join()
    return out


def _idle_child(url: str, seconds: float, pipe: Any) -> None:
    with alkstore.open(url) as store:
        before = resource.getrusage(resource.RUSAGE_SELF)
        began = time.perf_counter()
        with store.listen("idle") as sub:
            while time.perf_counter() - began < seconds:
                sub.wait(0.5)
        after = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - began
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    pipe.send(100.0 * cpu / wall)


def idle_cpu_percent(url: str, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_idle_child, args=(url, seconds, there))
    child.start()
    value: float = here.recv()
    child.join()
    return value


# -- peers ---------------------------------------------------------------------


def peer_huey(tmp: Path, waiting: int, n: int) -> tuple[float, float] | None:
    try:
        from huey.storage import SqliteStorage
    except ImportError:
        return None
    storage = SqliteStorage("bench", filename=str(tmp / "huey.db"))
    data = b'{"task":"noop","args":[1,2,3]}'
    for _ in range(waiting):
        storage.enqueue(data)
    enq = rate(n, lambda: [storage.enqueue(data) for _ in range(n)])
    drn = rate(n, lambda: [storage.dequeue() for _ in range(n)])
    return enq, drn


def peer_persist_queue(tmp: Path, waiting: int, n: int) -> tuple[float, float] | None:
    try:
        from persistqueue import SQLiteAckQueue
    except ImportError:
        return None
    q = SQLiteAckQueue(str(tmp / "pq"), multithreading=True, auto_commit=True)
    payload = dict(PAYLOAD)
    for _ in range(waiting):
        q.put(payload)
    enq = rate(n, lambda: [q.put(payload) for _ in range(n)])

    def drain() -> None:
        for _ in range(n):
            item = q.get(block=False, raw=True)
            q.ack(id=item["pqid"])

    return enq, rate(n, drain)


# -- the run -------------------------------------------------------------------


def median_of(times: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--synchronous", choices=["full", "normal"], default="full")
    args = parser.parse_args()
    sync = {"synchronous": args.synchronous}
    big = 20_000 if args.quick else 1_000_000
    per_row = 2_000
    batched = 20_000
    tmp = Path(tempfile.mkdtemp(prefix="alkstore-bench-"))
    systems = ["raw sqlite3", "alkstore", "alkstore/raw", "huey", "persist-queue"]
    table = Table(
        f"SQLite, {os.cpu_count()} cores, Python {sys.version.split()[0]},"
        f" SQLite {sqlite3.sqlite_version}, synchronous={args.synchronous}",
        systems,
    )

    for waiting in (1_000, big):
        label = f"{waiting:,} waiting"
        raw = Raw(tmp / f"raw-{waiting}.db", args.synchronous)
        url = f"sqlite:///{tmp / f'alk-{waiting}.db'}"
        store = alkstore.open(url, **sync)
        q = store.queue("q")
        raw.insert_batches(waiting + per_row + batched, 10_000)
        enqueue_batches(q, waiting + per_row + batched, 10_000)

        figures: list[tuple[str, int, Callable[[int], object], Callable[[int], object]]] = [
            ("enqueue one by one", per_row, raw.insert_one, partial(enqueue_one, q)),
            (f"enqueue_many ({BATCH})", batched, raw.insert_batches, partial(enqueue_batches, q)),
            ("claim_one + ack drain", per_row, partial(raw.drain, batch=1), partial(drain_one, q)),
            (
                f"claim_batch({BATCH}) + ack_batch drain",
                batched,
                partial(raw.drain, batch=BATCH),
                partial(drain_batches, q),
            ),
        ]
        for name, n, raw_run, alk_run in figures:
            r = rate(n, partial(raw_run, n))
            a = rate(n, partial(alk_run, n))
            table.add(
                Row(
                    f"{name}, {label}",
                    "jobs/s",
                    {"raw sqlite3": r, "alkstore": a, "alkstore/raw": a / r},
                    ">= 0.5 of raw",
                    "ok" if a / r >= 0.5 else "MISS",
                )
            )
        store.close()
        with alkstore.open(url, **sync) as refill:
            enqueue_batches(refill.queue("q"), batched, 10_000)
        four = drain_processes(url, batched, 4, args.synchronous)
        table.add(
            Row(
                f"claim_batch({BATCH}) + ack_batch drain, 4 processes, {label}",
                "jobs/s",
                {"alkstore": four},
            )
        )

    rows = {r.scenario: r for r in table.rows}
    for name in ("claim_one + ack drain", f"claim_batch({BATCH}) + ack_batch drain"):
        small = rows[f"{name}, 1,000 waiting"].figures["alkstore"]
        large = rows[f"{name}, {big:,} waiting"].figures["alkstore"]
        table.add(
            Row(
                f"{name}: rate at {big:,} / rate at 1,000",
                "ratio",
                {"alkstore": large / small},
                ">= 0.8",
                "ok" if large / small >= 0.8 else "MISS",
            )
        )

    for peer, run in (("huey", peer_huey), ("persist-queue", peer_persist_queue)):
        got = run(tmp, 1_000, per_row)
        if got is None:
            continue
        table.rows[0].figures[peer] = got[0]
        rows["claim_one + ack drain, 1,000 waiting"].figures[peer] = got[1]

    url = f"sqlite:///{tmp / 'wake.db'}"
    alkstore.open(url).close()
    lat = wake_latency(url, 100 if args.quick else 300)
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    table.add(
        Row(
            "cross-process wake latency p50",
            "ms",
            {"alkstore": p50},
            "< 2 ms",
            "ok" if p50 < 2 else "MISS",
        )
    )
    table.add(
        Row(
            "cross-process wake latency p99",
            "ms",
            {"alkstore": p99},
            "< 5 ms",
            "ok" if p99 < 5 else "MISS",
        )
    )
    idle = idle_cpu_percent(url, 3 if args.quick else 10)
    table.add(
        Row(
            "idle subscriber CPU",
            "% of a core",
            {"alkstore": idle},
            "< 2 %",
            "ok" if idle < 2 else "MISS",
        )
    )
    print(table.render())


if __name__ == "__main__":
    main()
