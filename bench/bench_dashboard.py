"""Dashboard benchmark: how fast its pages answer over a big queue, on SQLite and PostgreSQL.

Run from the repository root after installing requirements-dev.txt::

    python bench/bench_dashboard.py                   # both engines, a few minutes
    python bench/bench_dashboard.py --engine sqlite   # or postgres, or both (default)
    python bench/bench_dashboard.py --waiting 100000 --dead 10000   # smaller, for a try

The issue's target: "the dashboard's queue page answers in under 100 ms with
1,000,000 jobs waiting and 100,000 dead". One queue, ``bench``, is loaded
through the public API, untimed: ``--dead`` (100,000) jobs enqueued with a
short expiry and moved to the dead table by one ``queue.sweep_expired()``
(as a sweeper does), then ``--waiting`` (1,000,000) due jobs by
``enqueue_many`` in batches of 10,000; PostgreSQL then ``VACUUM ANALYZE``
(bench_postgres.py's ``settle()``: what autovacuum does after such a load).

The dashboard (``alkstore.dashboard.create_app``, read-only) is served by
uvicorn on a thread of this process, as ``alkstore dashboard`` serves it,
and each page is fetched over HTTP with httpx, ``--warmup`` (3) times
untimed, then ``--requests`` (30) times: the median and the 95th
percentile of the wall time of a GET, response read. The rows: the queues
overview (the page of the target: every queue's ``is_paused()`` and
``throughput()``, and its counts, ``stats()`` and ``completed_count()``,
as the dashboard keeps them: taken at most once per 5 s, in the
background once a page has them; docs/operations.md "The dashboard"),
once for a fresh dashboard (its first GET counts while it waits) and then
in the steady state, its GETs spread over 15 s so that they meet the
recounts running in the background; the first page of the waiting jobs and of the dead
letters; then, under the table, the time of each store call the overview
makes, to say which one costs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import uvicorn
from _report import Row, Table, percentile
from bench_postgres import Server, add_url_option, settle

import alkstore
from alkstore.dashboard import create_app

QUEUE = "bench"
BATCH = 10_000
TARGET_MS = 100.0
#: How old the dashboard lets its counts get with refresh_s=0 (counts.py).
COUNTS_MAX_AGE_S = 5.0
PAYLOAD = {"to": "user@example.com", "n": 0}


@contextlib.contextmanager
def serve(app: object) -> Iterator[str]:
    """uvicorn on a free port of 127.0.0.1, on a thread; its base URL."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def load(url: str, waiting: int, dead: int) -> str:
    """Fill the queue; say how long it took."""
    began = time.perf_counter()
    with alkstore.open(url) as store:
        queue = store.queue(QUEUE)
        for start in range(0, dead, BATCH):
            n = min(BATCH, dead - start)
            queue.enqueue_many([{**PAYLOAD, "n": start + i} for i in range(n)], expires=0.001)
        time.sleep(0.01)  # past every expiry (untimed loading, not a measurement)
        swept = queue.sweep_expired()
        assert swept.expired == dead, swept
        for start in range(0, waiting, BATCH):
            n = min(BATCH, waiting - start)
            queue.enqueue_many([{**PAYLOAD, "n": start + i} for i in range(n)])
        stats = queue.stats()
        assert (stats.pending, stats.dead) == (waiting, dead), stats
    return f"loaded {waiting:,} waiting and {dead:,} dead in {time.perf_counter() - began:.0f} s"


def timed(run: Callable[[], object], warmup: int, n: int, pace_s: float = 0.0) -> list[float]:
    """Milliseconds of each of ``n`` runs after ``warmup`` untimed ones,
    starting one every ``pace_s`` seconds at most."""
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1000)
        time.sleep(max(0.0, pace_s - (time.perf_counter() - start)))
    return samples


PAGES = [
    ("queues overview (GET /)", "/"),
    ("waiting jobs, first page (GET /jobs)", f"/jobs?queue={QUEUE}&state=pending"),
    ("dead letters, first page (GET /dead)", f"/dead?queue={QUEUE}"),
]


def measure(engine: str, url: str, warmup: int, n: int) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    with alkstore.open(url, migrate=False) as store:
        with serve(create_app(store, refresh_s=0)) as base, httpx.Client(base_url=base) as client:
            # A fresh dashboard's first page counts every queue while it waits.
            (first,) = timed(lambda: client.get("/").raise_for_status(), 0, 1)
            rows.append(
                Row(
                    f"{engine}: queues overview, a fresh dashboard's first GET",
                    "ms",
                    {"median": first, "p95": first},
                )
            )
            for label, path in PAGES:

                def get(path: str = path) -> None:
                    response = client.get(path)
                    response.raise_for_status()

                # The overview as a browser tab refreshing: spread over three
                # recount intervals, so GETs meet the recounts in the background.
                pace_s = 3 * COUNTS_MAX_AGE_S / n if path == "/" else 0.0
                samples = timed(get, warmup, n, pace_s)
                median, p95 = statistics.median(samples), percentile(samples, 95)
                row = Row(f"{engine}: {label}", "ms", {"median": median, "p95": p95})
                if path == "/":
                    row.target = f"< {TARGET_MS:.0f} ms"
                    row.verdict = "met" if p95 < TARGET_MS else "MISSED"
                rows.append(row)
        queue = store.queue(QUEUE)
        calls: list[tuple[str, Callable[[], object]]] = [
            ("queue_names()", store.queue_names),
            ("stats()", queue.stats),
            ("completed_count()", queue.completed_count),
            ("is_paused()", queue.is_paused),
            ("throughput(3600)", lambda: queue.throughput(window_s=3600)),
        ]
        parts = []
        for name, call in calls:
            samples = timed(call, warmup, n)
            parts.append(f"{name} {statistics.median(samples):.1f}")
    return rows, [f"{engine}: the overview's store calls, median ms: " + ", ".join(parts)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    add_url_option(parser, "PostgreSQL: a database to administer from (CREATE DATABASE)")
    parser.add_argument("--waiting", type=int, default=1_000_000, help="due jobs (1,000,000)")
    parser.add_argument("--dead", type=int, default=100_000, help="dead jobs (100,000)")
    parser.add_argument("--requests", type=int, default=30, help="timed GETs per page (30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed GETs first (3)")
    args = parser.parse_args()
    if min(args.waiting, args.dead, args.requests) < 1 or args.warmup < 0:
        parser.error("sizes must be at least 1")
    began = time.perf_counter()
    table = Table("", ["median", "p95"])
    about = [f"{os.cpu_count()} cores", f"Python {sys.version.split()[0]}"]
    notes: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="alkstore-bench-dashboard-"))
    server: Server | None = None
    try:
        if args.engine in ("sqlite", "both"):
            about.append(f"SQLite {sqlite3.sqlite_version}")
            url = f"sqlite:///{workdir / 'dashboard.db'}"
            notes.append("SQLite: " + load(url, args.waiting, args.dead))
            rows, more = measure("SQLite", url, args.warmup, args.requests)
            table.rows += rows
            notes += more
        if args.engine in ("postgres", "both"):
            try:
                server = Server(args.url)
            except Exception as exc:
                notes.append(f"PostgreSQL: - (cannot use the server at --url: {exc})")
        if server is not None:
            about.append(f"PostgreSQL {server.version.split()[0]}")
            url = server.create("dashboard")
            notes.append("PostgreSQL: " + load(url, args.waiting, args.dead))
            settle(url)
            rows, more = measure("PostgreSQL", url, args.warmup, args.requests)
            table.rows += rows
            notes += more
    finally:
        if server is not None:
            server.drop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    table.title = (
        f"alkstore dashboard pages over one queue of {args.waiting:,} waiting and"
        f" {args.dead:,} dead jobs, {args.requests} GETs each over HTTP (uvicorn); "
        + ", ".join(about)
    )
    print(table.render())
    print()
    for line in notes:
        print(line)
    print(f"\n(run took {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
