"""Worker benchmark: alkstore's worker beside each peer's own worker, on SQLite and PostgreSQL.

Run from the repository root after installing requirements-dev.txt and
bench/requirements.txt (the peers)::

    python bench/bench_worker.py                    # 20,000 jobs per figure
    python bench/bench_worker.py --quick            # 2,000 jobs per figure
    python bench/bench_worker.py --engine sqlite    # or postgres, or both (default)
    python bench/bench_worker.py --prefetch 16      # `alkstore worker --prefetch 16`

Each system runs through its own worker and its own enqueue API, as its
users run it, with a no-op task, at concurrency 1, 4 and 16:

* SQLite (a file per system, WAL, ``synchronous=FULL``): alkstore's command
  ``alkstore --url sqlite:///... worker benchapp:app --concurrency N --burst``
  beside huey's consumer (``SqliteHuey``, thread workers, ``workers=N``).
  alkstore's SQLite default is ``synchronous=FULL`` in WAL. huey's
  ``SqliteStorage`` sets ``synchronous`` only when given ``fsync`` (its
  ``_create_connection`` runs ``pragma synchronous=2``, FULL, on every
  connection it opens with ``fsync=True``, and ``=0`` with ``fsync=False``;
  WAL is its default ``journal_mode``), so the bench opens
  ``SqliteHuey(..., fsync=True)`` and checks that the connection reads
  ``synchronous`` 2 and ``journal_mode`` wal. Only the untimed fill of
  huey's queue goes through a ``fsync=False`` instance.
* PostgreSQL (``--url`` names a database to administer from, default
  ``$ALKSTORE_BENCH_POSTGRES_URL``, else ``$ALKSTORE_TEST_POSTGRES_URL``, else
  ``postgresql://postgres@127.0.0.1:5432/test``; each system gets a fresh
  database of its own, bench_postgres.py's ``Systems``, dropped at the end):
  the same ``alkstore worker`` command beside PgQueuer's ``QueueManager``
  and procrastinate's worker, driven by bench_async.py's and
  bench_postgres.py's drivers (imported, not copied).

The rows (bench/README.md has the details):

* "drain N through the worker, concurrency C": N no-op jobs queued through
  each system's API (alkstore: ``enqueue_many`` of the payload
  ``noop.enqueue()`` stores; huey: calls of the task; PgQueuer and
  procrastinate: their batch enqueue), then run by that system's worker
  until every job ran. alkstore: the command's wall time from start to exit
  (burst mode: the queue empty, every outcome acked) less its start-up, the
  median of 3 runs of the same command on the empty queue (interpreter
  start, imports, opening the store: what a long-running worker pays once;
  printed under the table with the gross rate). huey has no burst mode: in
  a fresh process its consumer is made as ``huey_consumer`` makes it
  (``ConsumerConfig(workers=N, worker_type="thread", logfile=...)``, its
  ``setup_logger`` and ``huey.create_consumer(**config.values)``), timed
  from ``start()`` to the end of the last job's handler (a counter in the
  task); after ``stop()`` its queue must be empty. PgQueuer: one
  ``QueueManager`` run in drain mode, capped at C by ``concurrency_limit``
  or by ``max_concurrent_tasks``, the faster shown (bench_async.py's
  ``pgq_worker_drain``; both figures under the table). procrastinate:
  ``run_worker_async(concurrency=C, wait=False)`` (bench_postgres.py's
  ``proc_drain``). PgQueuer's and procrastinate's drains are of 10,000 jobs
  in the full run (2,000 in the quick one). Targets: >= 1.5x the fastest
  peer at every concurrency; at concurrency 16 also >= 0.5x the engine's
  own batch drain (the "ceiling" column of the drain rows).
* "raw claim_one+ack" and "raw claim_batch(100)+ack_batch": alkstore's
  engine alone, C threads of one process looping ``claim_one`` + ``ack``, or
  ``claim_batch(100)`` + ``ack_batch``, until the queue is empty (no
  handler, no worker): the engine's own figures.
* "wake latency p50 / p99, commit to handler": milliseconds from an
  enqueue's commit in a producer process (``CLOCK_MONOTONIC`` read when the
  enqueue returns) to the first line of the handler in an idle worker
  (concurrency 1) in another process, which reads the same clock; 300
  samples (quick 50) after 5 warm-up ones, the producer pausing 5 to 17 ms
  between jobs. alkstore: bench_postgres.py's producer (``alk_wake``) and
  ``Worker.run()`` (what the command runs; with ``--prefetch N``,
  ``prefetch=N``) with the sync no-op task; huey:
  its consumer (one thread worker; it polls, 0.1 s after an empty dequeue,
  growing 1.15x) and a producer calling the task; PgQueuer and
  procrastinate: bench_postgres.py's ``pgq_wake`` and ``proc_wake``.
  Target: below every peer's.
* "enqueue N one by one": ``noop.enqueue()`` in one process, the store open
  and one call made first, beside the "ceiling", the bare insert of one job
  per commit: alkstore's job insert statement and row through a bare
  sqlite3 connection (``sqlite_insert_ceiling``: WAL,
  ``synchronous=FULL``, a fresh file) and bench_postgres.py's
  ``bare_enqueue`` (alkstore's insert statement through a bare, prepared
  psycopg connection in autocommit). The two take turns for 5 rounds that
  share the N jobs; the medians are shown. Target: >= 0.9x the ceiling. The
  peers' single enqueue (huey's task call, PgQueuer's ``queries.enqueue``,
  procrastinate's ``defer_async``), one run each, is for information.

Every figure is jobs per second unless the unit says otherwise. A peer that
is missing or fails prints ``-`` and a line under the table; the verdict of
a row whose reference is missing is ``?``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Row, Table, percentile, rate
from bench_postgres import (
    Server,
    Systems,
    add_url_option,
    alk_wake,
    bare_enqueue,
    in_child,
    pgq_enqueue,
    pgq_fill,
    pgq_wake,
    proc_drain,
    proc_enqueue,
    proc_fill,
    proc_wake,
    sample_wakes,
    sql,
)

import alkstore
from alkstore import QueueOpts, encode_payload, enqueue_options, resolve

QUEUE = "bench"
BATCH = 100
PAYLOAD = {"task": "noop", "args": [], "kwargs": {}}  # what noop.enqueue() stores
CONCURRENCIES = (1, 4, 16)
WARMUP = 5
#: Targets: the worker's drain over the fastest peer's; over the engine's
#: batch drain at concurrency 16; single enqueue over the bare insert.
VS_PEER = 1.5
VS_BATCH_DRAIN = 0.5
VS_INSERT = 0.9
SQLITE_PEERS = ("huey",)
POSTGRES_PEERS = ("PgQueuer", "procrastinate")
COLUMNS = [
    "alkstore",
    *SQLITE_PEERS,
    *POSTGRES_PEERS,
    "alkstore/best peer",
    "ceiling",
    "alkstore/ceiling",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Sizes:
    jobs: int  # per drain and per enqueue figure
    #: per drain and per enqueue figure of PgQueuer and procrastinate: at
    #: 200 to 4,000 jobs/s their drains of 20,000 would take 5 minutes of
    #: the full run (and their rates over 20,000 were no higher than over
    #: 2,000 or 10,000: a shorter queue does not slow them)
    pg_peer_jobs: int
    wake: int  # wake samples, after WARMUP


QUICK = Sizes(jobs=2_000, pg_peer_jobs=2_000, wake=50)
FULL = Sizes(jobs=20_000, pg_peer_jobs=10_000, wake=300)
#: The enqueue row's ceiling and alkstore take turns this many times, each
#: round a share of the figure's jobs; the medians are shown.
ENQUEUE_ROUNDS = 5
#: alkstore worker runs on an empty queue per concurrency: the median is its start-up.
START_UPS = 3

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


def engine_options(url: str, consumers: int) -> dict[str, Any]:
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


def check_empty(url: str) -> None:
    with alkstore.open(url) as store:
        stats = store.queue(QUEUE).stats()
    if stats.pending or stats.processing or stats.dead:
        raise RuntimeError(f"the queue is not empty after the run: {stats}")


# -- alkstore: the engine alone ---------------------------------------------------


def raw_drain(url: str, n: int, consumers: int, batch: int) -> float:
    """``consumers`` threads, each looping claim (``claim_batch(batch)``, or
    ``claim_one`` for batch 1) and ack (``ack_batch``, or ``ack``) until the
    queue is empty; connections opened and statements prepared first."""
    with alkstore.open(url, **engine_options(url, consumers)) as store:
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


def sqlite_insert_ceiling(path: str, n: int) -> float:
    """alkstore's own job insert (the row ``noop.enqueue()`` writes, its
    statement and schema) sent one by one through a bare sqlite3 connection,
    each its own commit (WAL, ``synchronous=FULL``), on a fresh file: the
    driver's ceiling, without the store, the option resolution and the
    payload codec, as bench_postgres.py's ``bare_enqueue`` is for
    PostgreSQL."""
    from alkstore_sqlite._queue import _INSERT, job_row

    url = f"sqlite:///{path}"
    with alkstore.open(url) as store:  # creates the schema
        resolved = resolve(store._now(), QueueOpts(), enqueue_options())
    row = job_row(QUEUE, resolved, encode_payload(PAYLOAD))
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        for _ in range(10):
            db.execute(_INSERT, row)

        def insert_one(count: int) -> None:
            for _ in range(count):
                db.execute(_INSERT, row)

        return rate(n, lambda: insert_one(n))
    finally:
        db.close()


# -- alkstore: the worker and the task API -----------------------------------------


def worker_command() -> list[str]:
    script = Path(sys.executable).with_name("alkstore")
    return [str(script)] if script.exists() else [sys.executable, "-m", "alkstore"]


def worker_knows(option: str) -> bool:
    """Whether ``alkstore worker --help`` lists ``option``."""
    out = subprocess.run(
        [*worker_command(), "worker", "--help"], capture_output=True, text=True, check=False
    )
    return option in out.stdout


def worker_args(url: str, consumers: int, log_level: str, prefetch: int | None) -> list[str]:
    """The command's arguments after the program's name."""
    args = ["--url", url, "worker", "benchapp:app", "--concurrency", str(consumers), "--burst"]
    args += ["--log-level", log_level.lower()]
    if prefetch is not None:
        args += ["--prefetch", str(prefetch)]
    return args


def run_worker(
    url: str, consumers: int, workdir: Path, log_level: str, prefetch: int | None
) -> float:
    """Seconds from starting ``alkstore worker --burst`` to its exit."""
    env = dict(os.environ)
    env["BENCH_ENGINE_OPTIONS"] = json.dumps(engine_options(url, consumers))
    env.pop("ALKSTORE_URL", None)
    cmd = [*worker_command(), *worker_args(url, consumers, log_level, prefetch)]
    log_path = workdir / "worker.log"
    with log_path.open("wb") as log:
        begun = time.perf_counter()
        done = subprocess.run(cmd, check=False, cwd=workdir, env=env, stdout=log, stderr=log)
        elapsed = time.perf_counter() - begun
    if done.returncode != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"alkstore worker exited {done.returncode}: {' | '.join(tail)}")
    return elapsed


def _alk_app(
    url: str, consumers: int, on_job: Callable[[], None] | None = None
) -> tuple[alkstore.App, alkstore.Task[[], None]]:
    """benchapp's app in this process: the sync no-op task on the bench
    queue, which calls ``on_job()`` first when given."""
    app = alkstore.App(url, **engine_options(url, consumers))

    def noop() -> None:
        if on_job is not None:
            on_job()

    return app, app.task(queue=QUEUE, name="noop")(noop)


def alk_enqueue_one(url: str, n: int) -> float:
    """``noop.enqueue()`` one by one, the app's store open and one call made first."""
    app, noop = _alk_app(url, 1)
    with app:
        noop.enqueue()
        begun = time.perf_counter()
        for _ in range(n):
            noop.enqueue()
        return n / (time.perf_counter() - begun)


def worker_wake_consumer(
    url: str,
    ready: Any,
    pipe: Any,
    count: int,
    *,
    make_app: Callable[..., tuple[alkstore.App, Any]] = _alk_app,
    prefetch: int | None = None,
) -> None:
    """An idle worker (``Worker.run()``, concurrency 1, ``prefetch`` when
    given) of the app ``make_app(url, 1, on_job)`` builds (default: this
    bench's sync no-op task), whose handler sends ``CLOCK_MONOTONIC`` first;
    stopped from the handler after ``count``. bench_async.py runs it with
    its async task."""
    got = 0
    worker: alkstore.Worker | None = None

    def on_job() -> None:
        nonlocal got
        pipe.send(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        got += 1
        if got >= count and worker is not None:
            worker.stop()

    app, _ = make_app(url, 1, on_job)
    with app:
        app.store.queue(QUEUE).stats()  # the store open before the first sample
        options = {} if prefetch is None else {"prefetch": prefetch}
        worker = app.worker(queues=[QUEUE], concurrency=1, handle_signals=False, **options)
        ready.set()
        worker.run()


def alk_worker_wake(url: str, samples: int, warmup: int, prefetch: int | None) -> list[float]:
    """bench_postgres.py's producer (``alk_wake``) enqueueing the task's
    payload, with :func:`worker_wake_consumer` as the consumer."""
    consumer = partial(worker_wake_consumer, prefetch=prefetch)
    return alk_wake(url, samples, warmup, consumer=consumer, queue=QUEUE, payload=PAYLOAD)


# -- huey -------------------------------------------------------------------------


def _huey(path: str, *, fsync: bool, on_job: Callable[[], None] | None = None) -> tuple[Any, Any]:
    """A ``SqliteHuey`` on ``path`` and its no-op task (which calls
    ``on_job()`` first when given). With ``fsync=True`` huey's storage runs
    ``pragma synchronous=2`` (FULL) on each connection it opens, in WAL (its
    default journal mode): alkstore's durability."""
    from huey import SqliteHuey  # type: ignore[import-untyped]

    huey = SqliteHuey("bench", filename=path, fsync=fsync)

    @huey.task(name="noop")  # type: ignore[untyped-decorator]
    def noop() -> None:
        if on_job is not None:
            on_job()

    if fsync:
        synchronous = huey.storage.conn.execute("pragma synchronous").fetchone()[0]
        mode = huey.storage.conn.execute("pragma journal_mode").fetchone()[0]
        if (synchronous, mode) != (2, "wal"):
            raise RuntimeError(f"huey's storage runs synchronous={synchronous}, {mode}")
    return huey, noop


def _huey_consumer(huey: Any, workers: int, log_level: str, logfile: str | None) -> Any:
    """huey's consumer as ``huey_consumer`` makes it: a ``ConsumerConfig``
    (thread workers, its defaults otherwise), its logger on the ``huey``
    namespace (INFO, a line as each job starts and ends, when ``logfile``),
    and ``huey.create_consumer(**config.values)``."""
    from huey.consumer_options import ConsumerConfig  # type: ignore[import-untyped]

    verbose = {"DEBUG": True, "INFO": None}.get(log_level, False)
    config = ConsumerConfig(workers=workers, worker_type="thread", logfile=logfile, verbose=verbose)
    config.validate()
    if logfile is not None:
        config.setup_logger(logging.getLogger("huey"))
    return huey.create_consumer(**config.values)


def huey_enqueue_one(path: str, n: int) -> float:
    """Calls of huey's task one by one (each an ``INSERT`` and a commit)."""
    _, noop = _huey(path, fsync=True)
    noop()
    begun = time.perf_counter()
    for _ in range(n):
        noop()
    return n / (time.perf_counter() - begun)


def huey_fill(path: str, n: int) -> None:
    """``n`` calls of the task, through a storage with ``fsync=False`` (not timed)."""
    _, noop = _huey(path, fsync=False)
    for _ in range(n):
        noop()


def huey_drain(path: str, n: int, workers: int, log_level: str, logfile: str) -> float:
    """huey's consumer (``workers`` threads) from ``start()`` to the end of
    the ``n``-th handler; the queue must then be empty."""
    lock = threading.Lock()
    done = threading.Event()
    ran = 0

    def on_job() -> None:
        nonlocal ran
        with lock:
            ran += 1
            if ran >= n:
                done.set()

    huey, _ = _huey(path, fsync=True, on_job=on_job)
    consumer = _huey_consumer(huey, workers, log_level, logfile)
    begun = time.perf_counter()
    consumer.start()
    finished = done.wait(600)
    elapsed = time.perf_counter() - begun
    consumer.stop(graceful=True)
    left = huey.storage.queue_size()
    if not finished or ran != n or left:
        raise RuntimeError(f"huey ran {ran} of {n} jobs, {left} left in its queue")
    return n / elapsed


def _huey_wake_consumer(path: str, ready: Any, pipe: Any, count: int) -> None:
    """An idle huey consumer (one thread worker); the handler sends
    ``CLOCK_MONOTONIC`` first. Stopped after ``count`` jobs."""
    got = 0
    finished = threading.Event()

    def on_job() -> None:
        nonlocal got
        pipe.send(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        got += 1
        if got >= count:
            finished.set()

    huey, _ = _huey(path, fsync=True, on_job=on_job)
    consumer = _huey_consumer(huey, 1, "WARNING", None)
    consumer.start()
    ready.set()
    finished.wait(600)
    consumer.stop(graceful=True)


def huey_wake(path: str, samples: int, warmup: int) -> list[float]:
    """As bench_postgres.py's ``alk_wake``, for huey: calls of the task here,
    its consumer in another process (it polls: no wake)."""
    _, noop = _huey(path, fsync=True)
    return sample_wakes(
        _huey_wake_consumer, path, noop, samples=samples, warmup=warmup, who="the huey consumer"
    )


# -- PostgreSQL peers: bench_async.py's and bench_postgres.py's drivers -------------


def pgq_worker_drains(
    url: str, n: int, concurrency: int, reset: Callable[[], None]
) -> dict[str, float]:
    """bench_async.py's PgQueuer worker drain under each of its caps (only
    ``concurrency_limit`` at concurrency 1), each from a freshly filled,
    vacuumed queue. bench_async.py imports this module, so it is imported here."""
    from bench_async import PGQ_CAPS, pgq_worker_drain

    got: dict[str, float] = {}
    for cap in PGQ_CAPS if concurrency > 1 else PGQ_CAPS[:1]:
        reset()
        in_child(pgq_fill, url, n)
        sql(url, "VACUUM ANALYZE")
        got[cap] = float(in_child(pgq_worker_drain, url, n, concurrency, cap))
    return got


def pgq_batch_of(cap: str, concurrency: int) -> int:
    from bench_async import pgq_batch

    return pgq_batch(cap, concurrency)


# -- the run ----------------------------------------------------------------------


@dataclass
class Bench:
    table: Table
    sizes: Sizes
    workdir: Path
    log_level: str
    prefetch: int | None
    notes: list[str] = field(default_factory=list)
    #: peers that cannot be driven: the reason (they are skipped from then on).
    broken: dict[str, str] = field(default_factory=dict)

    def peer(self, name: str, measure: Callable[[], T]) -> T | None:
        """``measure()``, or ``None`` when the peer fails (the reason goes under the table)."""
        if name in self.broken:
            return None
        try:
            return measure()
        except Exception as exc:
            hint = " (pip install -r bench/requirements.txt)" if "Import" in str(exc) else ""
            self.broken[name] = f"failed: {exc}{hint}"
            return None


def add_row(
    table: Table,
    scenario: str,
    unit: str,
    alk: float | None,
    peers: dict[str, float | None],
    *,
    ceiling: float | None = None,
    vs_peer: float | None = None,
    lower: bool = False,
    vs_ceiling: float | None = None,
) -> None:
    """A row: alkstore, the engine's peers, alkstore over the best peer (the
    fastest, or with ``lower`` the lowest figure), the ceiling and alkstore
    over it. Targets: ``vs_peer`` times the best peer (with ``lower``:
    below every peer), ``vs_ceiling`` times the ceiling. The verdict is
    ``?`` when a figure it needs is missing."""
    figures: dict[str, float] = {k: v for k, v in peers.items() if v is not None}
    measured = list(figures.values())
    best = (min(measured) if lower else max(measured)) if measured else None
    if alk is not None:
        figures["alkstore"] = alk
        if best:
            figures["alkstore/best peer"] = alk / best
    if ceiling is not None:
        figures["ceiling"] = ceiling
        if alk is not None:
            figures["alkstore/ceiling"] = alk / ceiling
    targets: list[str] = []
    checks: list[bool | None] = []  # None: a figure the check needs is missing
    if lower or vs_peer is not None:
        targets.append("< every peer" if lower else f">= {vs_peer}x best peer")
        if alk is None or best is None or len(measured) < len(peers):
            checks.append(None)
        else:
            checks.append(alk < best if lower else alk >= (vs_peer or 0.0) * best)
    if vs_ceiling is not None:
        targets.append(f">= {vs_ceiling}x ceiling")
        checks.append(None if alk is None or ceiling is None else alk >= vs_ceiling * ceiling)
    verdict = ""
    if checks:
        verdict = "?" if None in checks else ("ok" if all(checks) else "MISS")
    table.add(Row(scenario, unit, figures, ", ".join(targets), verdict))


@dataclass
class Engine:
    """What one engine's run measured, before it becomes rows."""

    name: str
    peers: tuple[str, ...]
    url: str
    ceiling_name: str
    jobs: int
    peer_jobs: int
    drains: dict[int, dict[str, float | None]] = field(default_factory=dict)
    raw_one: dict[int, float] = field(default_factory=dict)
    raw_batch: dict[int, float] = field(default_factory=dict)
    wake: dict[str, list[float] | None] = field(default_factory=dict)
    enqueue: dict[str, float | None] = field(default_factory=dict)
    insert_ceiling: float | None = None

    def rows(self, table: Table) -> None:
        e, n = self.name, self.jobs
        peers = f" (peers {self.peer_jobs:,})" if self.peer_jobs != n else ""
        for c in CONCURRENCIES:
            figs = self.drains[c]
            add_row(
                table,
                f"{e}: drain {n:,}{peers} through the worker, concurrency {c}",
                "jobs/s",
                figs["alkstore"],
                {p: figs.get(p) for p in self.peers},
                ceiling=self.raw_batch[c],
                vs_peer=VS_PEER,
                vs_ceiling=VS_BATCH_DRAIN if c == CONCURRENCIES[-1] else None,
            )
        for c in CONCURRENCIES:
            table.add(
                Row(
                    f"{e}: raw claim_one+ack, concurrency {c}",
                    "jobs/s",
                    {"alkstore": self.raw_one[c]},
                )
            )
        for c in CONCURRENCIES:
            table.add(
                Row(
                    f"{e}: raw claim_batch({BATCH})+ack_batch, concurrency {c}",
                    "jobs/s",
                    {"alkstore": self.raw_batch[c]},
                )
            )
        for q in (50, 99):
            at = {k: percentile(v, q) if v else None for k, v in self.wake.items()}
            add_row(
                table,
                f"{e}: wake latency p{q}, commit to handler",
                "ms",
                at["alkstore"],
                {p: at.get(p) for p in self.peers},
                lower=True,
            )
        add_row(
            table,
            f"{e}: enqueue {n:,}{peers} one by one",
            "jobs/s",
            self.enqueue["alkstore"],
            {p: self.enqueue.get(p) for p in self.peers},
            ceiling=self.insert_ceiling,
            vs_ceiling=VS_INSERT,
        )


def alk_worker_drain(
    bench: Bench, url: str, consumers: int, prepare: Callable[[], None], engine: str
) -> float:
    """``alkstore worker --burst`` on the empty queue (its start-up), then on
    ``n`` queued jobs: jobs per second net of the start-up."""
    n = bench.sizes.jobs
    start_up = statistics.median(
        run_worker(url, consumers, bench.workdir, bench.log_level, bench.prefetch)
        for _ in range(START_UPS)
    )
    prepare()
    gross = run_worker(url, consumers, bench.workdir, bench.log_level, bench.prefetch)
    check_empty(url)
    bench.notes.append(
        f"{engine}, concurrency {consumers}: alkstore worker start-up {start_up:.2f} s"
        f" (the median of {START_UPS} runs on the empty queue), gross {n / gross:,.0f} jobs/s"
    )
    return n / max(gross - start_up, 1e-9)


def alk_raw_drains(
    engine: Engine, url: str, n: int, consumers: int, prepare: Callable[[], None]
) -> None:
    prepare()
    engine.raw_batch[consumers] = float(in_child(raw_drain, url, n, consumers, BATCH))
    prepare()
    engine.raw_one[consumers] = float(in_child(raw_drain, url, n, consumers, 1))


def enqueue_turns(
    n: int, ceiling: Callable[[int], float], alk: Callable[[int], float]
) -> tuple[float, float]:
    """The ceiling and alkstore's ``noop.enqueue()`` taking turns for
    ``ENQUEUE_ROUNDS`` rounds that share ``n`` jobs: the two medians."""
    k = n // ENQUEUE_ROUNDS
    turns = [(ceiling(k), alk(k)) for _ in range(ENQUEUE_ROUNDS)]
    return (
        statistics.median(t[0] for t in turns),
        statistics.median(t[1] for t in turns),
    )


def run_sqlite(bench: Bench) -> Engine:
    s, work = bench.sizes, bench.workdir
    n = s.jobs
    url = f"sqlite:///{work / 'alkstore.db'}"
    engine = Engine(
        "SQLite",
        SQLITE_PEERS,
        url,
        "alkstore's insert statement through bare sqlite3, a commit each, WAL, FULL",
        n,
        n,
    )
    huey_db = str(work / "huey.db")
    alkstore.open(url).close()

    def prepare() -> None:
        fill(url, n)

    for c in CONCURRENCIES:
        alk_raw_drains(engine, url, n, c, prepare)
        alk = alk_worker_drain(bench, url, c, prepare, "SQLite")

        def huey(c: int = c) -> float:
            in_child(huey_fill, huey_db, n)
            log = str(work / "huey.log")
            return float(in_child(huey_drain, huey_db, n, c, bench.log_level, log))

        engine.drains[c] = {"alkstore": alk, "huey": bench.peer("huey", huey)}

    wake_url = f"sqlite:///{work / 'alkstore-wake.db'}"
    alkstore.open(wake_url).close()
    engine.wake["alkstore"] = in_child(alk_worker_wake, wake_url, s.wake, WARMUP, bench.prefetch)
    engine.wake["huey"] = bench.peer(
        "huey", lambda: in_child(huey_wake, str(work / "huey-wake.db"), s.wake, WARMUP)
    )

    engine.insert_ceiling, engine.enqueue["alkstore"] = enqueue_turns(
        n,
        partial(in_child, sqlite_insert_ceiling, str(work / "raw-insert.db")),
        partial(in_child, alk_enqueue_one, f"sqlite:///{work / 'alkstore-enqueue.db'}"),
    )
    engine.enqueue["huey"] = bench.peer(
        "huey", lambda: in_child(huey_enqueue_one, str(work / "huey-enqueue.db"), n)
    )
    return engine


def run_postgres(bench: Bench, systems: Systems) -> Engine:
    s, urls = bench.sizes, systems.urls
    n, k = s.jobs, s.pg_peer_jobs
    url = urls["alkstore"]
    engine = Engine(
        "PostgreSQL",
        POSTGRES_PEERS,
        url,
        "alkstore's insert statement through bare psycopg, a commit each",
        n,
        k,
    )

    def prepare() -> None:
        fill(url, n)
        sql(url, "VACUUM ANALYZE")

    for c in CONCURRENCIES:
        systems.reset("alkstore")
        alk_raw_drains(engine, url, n, c, prepare)
        alk = alk_worker_drain(bench, url, c, prepare, "PostgreSQL")

        def pgq(c: int = c) -> float:
            got = pgq_worker_drains(urls["PgQueuer"], k, c, lambda: systems.reset("PgQueuer"))
            bench.notes.append(
                f"PostgreSQL, concurrency {c}, PgQueuer: "
                + "; ".join(
                    f"{cap}={c}, batch_size={pgq_batch_of(cap, c)}: {v:,.0f}/s"
                    for cap, v in got.items()
                )
            )
            return max(got.values())

        def procrastinate(c: int = c) -> float:
            in_child(proc_fill, urls["procrastinate"], k)
            sql(urls["procrastinate"], "VACUUM ANALYZE")
            return float(in_child(proc_drain, urls["procrastinate"], k, c))

        engine.drains[c] = {
            "alkstore": alk,
            "PgQueuer": systems.measure("PgQueuer", pgq),
            "procrastinate": systems.measure("procrastinate", procrastinate, reset=True),
        }

    systems.reset("alkstore")
    engine.wake["alkstore"] = in_child(alk_worker_wake, url, s.wake, WARMUP, bench.prefetch)
    for peer, wake in (("PgQueuer", pgq_wake), ("procrastinate", proc_wake)):
        engine.wake[peer] = systems.measure(
            peer, partial(in_child, wake, urls[peer], s.wake, WARMUP), reset=True
        )

    def on_empty(measure: Callable[[str, int], float]) -> Callable[[int], float]:
        def run(k: int) -> float:
            systems.reset("alkstore")
            return float(in_child(measure, url, k))

        return run

    engine.insert_ceiling, engine.enqueue["alkstore"] = enqueue_turns(
        n, on_empty(bare_enqueue), on_empty(alk_enqueue_one)
    )
    systems.reset("alkstore")
    for peer, enqueue in (("PgQueuer", pgq_enqueue), ("procrastinate", proc_enqueue)):
        engine.enqueue[peer] = systems.measure(
            peer, partial(in_child, enqueue, urls[peer], k, 1), reset=True
        )
    return engine


def version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 jobs per figure")
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    add_url_option(parser, "PostgreSQL: a database to administer from (CREATE DATABASE)")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="the worker's --log-level, and huey's consumer's (default INFO, the commands':"
        " a line per job, to a file)",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        metavar="N",
        help="passed on as `alkstore worker --prefetch N` (default: not passed, the"
        " worker's own default)",
    )
    args = parser.parse_args()
    if args.prefetch is not None and not worker_knows("--prefetch"):
        parser.error("this `alkstore worker` has no --prefetch option yet")
    began = time.perf_counter()
    sizes = QUICK if args.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="alkstore-bench-worker-"))
    (workdir / "benchapp.py").write_text(APP_MODULE)
    table = Table("", COLUMNS)
    bench = Bench(table, sizes, workdir, args.log_level, args.prefetch)
    about = [f"{os.cpu_count()} cores", f"Python {sys.version.split()[0]}"]
    server: Server | None = None
    systems: Systems | None = None
    engines: list[Engine] = []
    try:
        if args.engine in ("sqlite", "both"):
            about.append(f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=FULL)")
            if v := version("huey"):
                about.append(f"huey {v}")
            engines.append(run_sqlite(bench))
        if args.engine in ("postgres", "both"):
            try:
                server = Server(args.url)
            except Exception as exc:
                bench.notes.append(f"PostgreSQL: - (cannot use the server at --url: {exc})")
        if server is not None:
            systems = Systems(server)
            about.append(f"PostgreSQL {server.version.split()[0]} ({server.settings})")
            about += [f"{k} {v}" for k, v in systems.versions.items()]
            engines.append(run_postgres(bench, systems))
            systems.note_missing()
    finally:
        if server is not None:
            server.drop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    table.title = (
        f"alkstore worker beside the peers' workers, {sizes.jobs:,} no-op jobs per figure,"
        f" wake {sizes.wake} samples; " + ", ".join(about)
    )
    for engine in engines:
        engine.rows(table)
    print(table.render())
    print()
    for engine in engines:
        command = ["alkstore", *worker_args(engine.url, 1, args.log_level, args.prefetch)]
        command[command.index("--concurrency") + 1] = "N"
        print(f"{engine.name} worker command (N: the concurrency): {shlex.join(command)}")
    for engine in engines:
        print(
            f"{engine.name} ceiling: for the drains, the raw claim_batch({BATCH})+ack_batch at"
            f" the same concurrency; for enqueue one by one, {engine.ceiling_name}"
        )
    for name, why in bench.broken.items():
        print(f"{name}: - ({why})")
    for note in [*(systems.notes if systems else []), *bench.notes]:
        print(textwrap.fill(note, 100, subsequent_indent="  "))
    print(f"\n(run took {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
