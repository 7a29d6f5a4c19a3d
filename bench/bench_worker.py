"""Worker benchmark: no-op tasks per second through ``alkstore worker``, on both engines.

Run from the repository root after installing requirements-dev.txt::

    python bench/bench_worker.py            # 20,000 jobs per figure
    python bench/bench_worker.py --quick    # 2,000 jobs per figure
    python bench/bench_worker.py --engine sqlite

For each engine (an SQLite file with its durable default ``synchronous=full``,
and a fresh database on the PostgreSQL server named by ``--url``, default
``$ALKSTORE_BENCH_POSTGRES_URL``, else ``$ALKSTORE_TEST_POSTGRES_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``) and each concurrency N, in
one run on the same store:

* "raw claim_one+ack": N threads of one process, each looping ``claim_one``
  + ``ack`` until the queue is empty: one claim and one ack per job, the loop
  a hand-written consumer runs (issue 4's "raw claim+ack drain figure", the
  baseline of the verdict);
* "raw batch drain": N threads, each looping ``claim_batch(100)`` +
  ``ack_batch`` (the engine's drain figure, as in bench_sqlite.py and
  bench_postgres.py), for information: the ceiling of a consumer that
  batches both sides and runs no handler;
* "worker": ``alkstore --url URL worker benchapp:app --concurrency N
  --burst`` as a subprocess with a no-op task, from its start to its exit once
  the queue is empty, less the same command's time on an empty queue
  (interpreter start, imports, opening the store: what a long-running worker
  pays once). "worker, gross" is the whole wall time, start-up included.

Every figure is jobs per second. The target (issue 4): the worker layer costs
under 30% of the raw claim+ack drain rate, i.e. worker >= 0.7 x raw
claim_one+ack, at every concurrency on both engines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Row, Table
from bench_postgres import DEFAULT_ADMIN_URL, Server, in_child, sql

import alkstore

QUEUE = "bench"
BATCH = 100
PAYLOAD = {"task": "noop", "args": [], "kwargs": {}}  # what noop.enqueue() stores

APP_MODULE = '''\
"""The app the benchmark's worker runs: one no-op task."""

import json
import os

import alkstore

app = alkstore.App(**json.loads(os.environ.get("BENCH_ENGINE_OPTIONS", "{}")))


@app.task(queue="bench", name="noop")
def noop() -> None:
    return None
'''


def engine_options(url: str, consumers: int) -> dict[str, object]:
    """A pool large enough for ``consumers`` threads plus the claim loop, the
    heartbeats and the completer (deployment.md: the concurrency plus three)."""
    if url.startswith("postgres"):
        return {"pool_min_size": consumers + 3, "pool_max_size": consumers + 3}
    return {}


def fill(url: str, n: int, chunk: int = 10_000, payload: object = PAYLOAD) -> None:
    """``n`` jobs of ``payload`` (default: what ``noop.enqueue()`` stores) on the queue."""
    with alkstore.open(url) as store:
        q = store.queue(QUEUE)
        for start in range(0, n, chunk):
            q.enqueue_many([payload] * min(chunk, n - start))


def raw_drain(url: str, n: int, consumers: int, batch: int) -> float:
    """``consumers`` threads, each looping claim (``claim_batch(batch)``, or
    ``claim_one`` for batch 1) and ack (``ack_batch``, or ``ack``) until the
    queue is empty; connections opened and statements prepared first."""
    with alkstore.open(url, **engine_options(url, consumers)) as store:  # type: ignore[arg-type]
        q = store.queue(QUEUE)
        warm = store.queue("warm")
        ready = threading.Barrier(consumers + 1)
        counts = [0] * consumers
        errors: list[BaseException] = []

        def consume(i: int) -> None:
            try:
                warm.claim_batch("bench", batch)
                warm.ack_batch([0])
                ready.wait()
                if batch == 1:
                    while (handle := q.claim_one("bench")) is not None:
                        if not handle.ack():
                            raise RuntimeError(f"ack of job {handle.id} refused")
                        counts[i] += 1
                else:
                    while handles := q.claim_batch("bench", batch):
                        q.ack_batch([h.id for h in handles])
                        counts[i] += len(handles)
            except BaseException as exc:
                errors.append(exc)
                ready.abort()

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(consumers)]
        for t in threads:
            t.start()
        ready.wait()
        begun = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - begun
    if errors:
        raise errors[0]
    if sum(counts) != n:
        raise RuntimeError(f"drained {sum(counts)} of {n} jobs")
    return n / elapsed


def worker_command() -> list[str]:
    script = Path(sys.executable).with_name("alkstore")
    return [str(script)] if script.exists() else [sys.executable, "-m", "alkstore"]


def run_worker(url: str, consumers: int, workdir: Path, log_level: str) -> float:
    """Seconds from starting ``alkstore worker --burst`` to its exit."""
    env = dict(os.environ)
    env["BENCH_ENGINE_OPTIONS"] = json.dumps(engine_options(url, consumers))
    env.pop("ALKSTORE_URL", None)
    cmd = [
        *worker_command(),
        "--url",
        url,
        "worker",
        "benchapp:app",
        "--concurrency",
        str(consumers),
        "--burst",
        "--log-level",
        log_level,
    ]
    log_path = workdir / "worker.log"
    with log_path.open("wb") as log:
        begun = time.perf_counter()
        done = subprocess.run(cmd, check=False, cwd=workdir, env=env, stdout=log, stderr=log)
        elapsed = time.perf_counter() - begun
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"alkstore worker exited {done.returncode}: {' | '.join(tail)}")
    return elapsed


def check_empty(url: str) -> None:
    with alkstore.open(url) as store:
        stats = store.queue(QUEUE).stats()
    if stats.pending or stats.processing or stats.dead:
        raise RuntimeError(f"the queue is not empty after the run: {stats}")


def bench_engine(
    table: Table, engine: str, url: str, *, n: int, workdir: Path, log_level: str
) -> list[str]:
    notes = []
    pg = url.startswith("postgres")

    def prepare() -> None:
        fill(url, n)
        if pg:
            sql(url, "VACUUM ANALYZE")

    for consumers in (1, 4, 16):
        prepare()
        raw = in_child(raw_drain, url, n, consumers, BATCH)
        prepare()
        per_job = in_child(raw_drain, url, n, consumers, 1)
        start_up = run_worker(url, consumers, workdir, log_level)  # on the empty queue
        prepare()
        gross = run_worker(url, consumers, workdir, log_level)
        check_empty(url)
        worker = n / max(gross - start_up, 1e-9)
        ratio = worker / per_job
        table.add(
            Row(
                f"{engine}, concurrency {consumers}",
                "jobs/s",
                {
                    "raw claim_one+ack": per_job,
                    "worker": worker,
                    "worker, gross": n / gross,
                    "worker/claim_one+ack": ratio,
                    "raw batch drain": raw,
                    "worker/batch drain": worker / raw,
                },
                ">= 0.7 x claim_one+ack",
                "ok" if ratio >= 0.7 else "MISS",
            )
        )
        notes.append(f"{engine}, concurrency {consumers}: worker start-up {start_up:.2f} s")
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 jobs per figure")
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument(
        "--url",
        default=os.environ.get("ALKSTORE_BENCH_POSTGRES_URL")
        or os.environ.get("ALKSTORE_TEST_POSTGRES_URL")
        or DEFAULT_ADMIN_URL,
        help="PostgreSQL: a database to administer from (CREATE DATABASE)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="the worker's --log-level (default INFO, the command's: a line per job)",
    )
    args = parser.parse_args()
    began = time.perf_counter()
    n = 2_000 if args.quick else 20_000
    workdir = Path(tempfile.mkdtemp(prefix="alkstore-bench-worker-"))
    (workdir / "benchapp.py").write_text(APP_MODULE)
    table = Table(
        f"alkstore worker, {n:,} no-op jobs per figure, {os.cpu_count()} cores,"
        f" Python {sys.version.split()[0]}, worker --log-level {args.log_level}",
        [
            "raw claim_one+ack",
            "worker",
            "worker, gross",
            "worker/claim_one+ack",
            "raw batch drain",
            "worker/batch drain",
        ],
    )
    notes: list[str] = []
    server: Server | None = None
    try:
        if args.engine in ("sqlite", "both"):
            url = f"sqlite:///{workdir / 'bench.db'}"
            notes += bench_engine(
                table, "SQLite", url, n=n, workdir=workdir, log_level=args.log_level
            )
        if args.engine in ("postgres", "both"):
            server = Server(args.url)
            url = server.create("worker")
            engine = f"PostgreSQL {server.version.split()[0]}"
            notes += bench_engine(
                table, engine, url, n=n, workdir=workdir, log_level=args.log_level
            )
    finally:
        if server is not None:
            server.drop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    print(table.render())
    print()
    print(textwrap.fill("; ".join(notes), 100))
    print(f"\n(run took {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
