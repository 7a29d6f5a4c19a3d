"""Completed-jobs benchmark: what ``QueueOpts(keep_completed_s=N)`` costs, on SQLite and PostgreSQL.

Run from the repository root after installing requirements-dev.txt::

    python bench/bench_completed.py                    # both engines, 2 to 3 minutes on 2 cores
    python bench/bench_completed.py --engine sqlite    # or postgres, or both (default)
    python bench/bench_completed.py --completed 200000 # a smaller retained table, for a try

The issue's targets: "enqueue and drain rates with keep_completed_s set stay
within 20% of the default; claim cost with 1,000,000 completed rows
retained stays within 20% of none". Every row sets a baseline beside the
same work with the feature, and the target is the ratio, feature over
baseline, >= 0.8 (rates, so higher is better). The two sides always take
turns in one process, a block each, the order rotating each turn, and a
side's rate is its jobs over the summed time of its blocks: a commit's fsync
varies a lot on a VM disk, and this way a slow spell reaches both alike
(bench_unique.py does the same).

* "enqueue N one by one": ``queue.enqueue(payload)`` (the 30-byte payload
  of bench_postgres.py), each call its own commit, through the default
  handle ``store.queue("bench")`` and through
  ``store.queue("bench", QueueOpts(keep_completed_s=3600))`` (the option is
  read by the ack and the sweep only, so the two paths should be the same).
  ``--rounds`` rounds (3), each a fresh process on an empty queue (SQLite: a
  fresh file; PostgreSQL: a fresh database), the two handles taking turns
  every ``--block`` calls (100); the medians.
* "drain N through the worker, concurrency C": the real worker,
  ``app.worker(queues=[q], concurrency=C).run(burst=True)``, in one process
  whose app registers two sync tasks that return the same small dict
  (``{"ok": True, "n": 1}``): ``noop_plain`` on queue ``plain`` (default
  options: the ack deletes the job, the return value is dropped) and
  ``noop_kept`` on queue ``kept`` with ``keep_completed_s=3600`` (the
  worker's completer acks in batches with ``ack_many(handles, results)``,
  each job moved to the completed table with its result). Each turn
  enqueues ``--drain-block`` jobs (2,000) on one queue (``enqueue_many``,
  untimed; PostgreSQL: then ``VACUUM ANALYZE`` of the jobs table, untimed)
  and times one burst run of the worker from ``run`` to its return (the
  queue empty, every finished job acked), the queues taking turns until each
  drained ``--drain-jobs`` (10,000). ``--drain-rounds`` rounds (3), each a
  fresh process on a fresh store, its pool's connections opened first.
  After each: every run reported every job succeeded, and the last turn's
  jobs are completed with their result in ``kept`` and gone from
  ``plain``.
* "claim_one + ack(result)" and "claim_batch(100) + ack_many(results)":
  two stores built alike, with the same backlog of ``--waiting`` jobs
  (50,000) on the queue, one with ``--completed`` (1,000,000) completed rows
  of that queue retained and one with none. The retained rows are made in
  bulk by SQL (one real job claimed and acked with a result through a
  ``keep_completed_s`` handle, then its completed row copied with ids after
  it and instants spread back over the 50 minutes before it, all within the
  retention; the jobs table's id counter then set past them in both
  stores, as if those jobs had been enqueued there), and then, on
  PostgreSQL, ``VACUUM ANALYZE`` of the completed table (what autovacuum
  does after so many inserts; SQLite's engine runs no ``ANALYZE``). Before
  each round both are settled: PostgreSQL bench_postgres.py's ``settle()``
  (``VACUUM (ANALYZE, INDEX_CLEANUP ON)`` and a checkpoint), SQLite a
  ``wal_checkpoint(TRUNCATE)``. A round is a fresh process with both stores
  open through ``keep_completed_s`` handles (the acks move the jobs to the
  completed table, in both stores alike); ``--claims`` (2,000) claim_one +
  ``handle.ack(result)`` on each store, taking turns every ``--block``, then
  ``--batch-claims`` jobs (10,000) in ``claim_batch(100)`` +
  ``queue.ack_many(handles, results)`` (the worker's way) taking turns
  every 10 batches. ``--rounds`` rounds, the medians. The claim statement
  reads only the live table (its partial indexes); what the retained rows
  can cost is the ack's insert into a bigger table and its index, and the
  cache and the disk they take. After the rounds each store holds exactly
  the jobs it should (waiting, and completed).

Every figure is jobs per second. A row shows the round whose ratio (the
feature's rate over the baseline's in that round) is the median of the
rounds' (the lower middle one for an even count): the two sides of a round
shared its slow and fast spells, those of different rounds did not. Every
round's figures go under the table, and for the drains the spread of the
single turns' ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from _report import Row, Table
from bench_postgres import Server, add_url_option, in_child, settle, sql

import alkstore
from alkstore import QueueOpts

QUEUE = "bench"
PAYLOAD = {"task": "noop", "args": [1, 2, 3]}
#: What the tasks return and the acks keep: a small dict.
RESULT = {"ok": True, "n": 1}
KEEP_S = 3600
KEEP = QueueOpts(keep_completed_s=KEEP_S)
WARMUP = 10
#: The issue's target: with the feature, at least this share of the baseline's rate.
TARGET = 0.8
#: Retained rows are spread back over this many microseconds each (50 minutes
#: for 1,000,000: all within the retention of an hour).
SPREAD_US = 3_000
#: claim_batch's size, and how many batches a side makes per turn.
BATCH = 100
BATCH_TURN = 10
#: Instants in the job tables (SQLite: microseconds; PostgreSQL: timestamptz).
INSTANTS = ("run_at", "expires_at", "enqueued_at", "claim_deadline", "finished_at")

Side = Literal["base", "feature"]
SIDES: tuple[Side, ...] = ("base", "feature")


def rotated(turn: int) -> tuple[Side, ...]:
    return SIDES if turn % 2 == 0 else SIDES[::-1]


def pool(url: str, size: int) -> dict[str, Any]:
    """Engine options: a pool of ``size`` connections on PostgreSQL."""
    if url.startswith("postgres"):
        return {"pool_min_size": size, "pool_max_size": size}
    return {}


def turns(n: int, block: int, calls: dict[Side, Callable[[int, int], None]]) -> dict[Side, float]:
    """``calls[side](start, stop)`` for both sides, a block of ``block`` each
    turn, the order rotating, until each made ``n``: seconds per side."""
    elapsed = dict.fromkeys(SIDES, 0.0)
    for turn, start in enumerate(range(0, n, block)):
        stop = min(start + block, n)
        for side in rotated(turn):
            begun = time.perf_counter()
            calls[side](start, stop)
            elapsed[side] += time.perf_counter() - begun
    return elapsed


# -- enqueue one by one, in a fresh process ------------------------------------------


def enqueue_round(url: str, n: int, block: int) -> dict[Side, float]:
    """``n`` enqueues through the default handle and ``n`` through a
    ``keep_completed_s`` handle, taking turns: jobs per second of each."""
    with alkstore.open(url) as store:
        handles = {"base": store.queue(QUEUE), "feature": store.queue(QUEUE, KEEP)}

        def enqueue(side: Side) -> Callable[[int, int], None]:
            q = handles[side]

            def run(start: int, stop: int) -> None:
                for _ in range(start, stop):
                    q.enqueue(PAYLOAD)

            return run

        for side in SIDES:
            enqueue(side)(0, WARMUP)
        elapsed = turns(n, block, {side: enqueue(side) for side in SIDES})
        stats = handles["base"].stats()
    if stats.pending != 2 * (n + WARMUP):
        raise RuntimeError(f"{stats.pending} jobs pending, expected {2 * (n + WARMUP)}")
    return {side: n / elapsed[side] for side in SIDES}


# -- drain through the worker, in a fresh process ------------------------------------

DRAIN_QUEUES: dict[Side, str] = {"base": "plain", "feature": "kept"}
DRAIN_TASKS: dict[Side, str] = {"base": "noop_plain", "feature": "noop_kept"}


def _warm(store: alkstore.Store, connections: int) -> None:
    """Open the pool's connections before the clock starts: ``connections``
    threads claim at once on an empty queue (as bench_async.py's)."""
    queue = store.queue("warm")
    barrier = threading.Barrier(connections)

    def claim() -> None:
        barrier.wait(10)
        queue.claim_batch("warm", 1)

    threads = [threading.Thread(target=claim) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def drain_round(url: str, n: int, block: int, concurrency: int) -> dict[str, Any]:
    """The worker drains ``block`` jobs of ``plain`` and ``block`` of ``kept``
    by turns until each drained ``n``: jobs per second of each, and each
    turn's ratio."""
    app = alkstore.App(url, **pool(url, concurrency + 3))

    @app.task(queue=DRAIN_QUEUES["base"], name=DRAIN_TASKS["base"])
    def noop_plain() -> dict[str, Any]:
        return RESULT

    @app.task(queue=DRAIN_QUEUES["feature"], name=DRAIN_TASKS["feature"], keep_completed_s=KEEP_S)
    def noop_kept() -> dict[str, Any]:
        return RESULT

    postgres = url.startswith("postgres")
    last: dict[Side, list[int]] = {}
    per_turn: list[dict[Side, float]] = []

    with app:
        _warm(app.store, concurrency + 3)
        elapsed = dict.fromkeys(SIDES, 0.0)
        for turn, start in enumerate(range(0, n, block)):
            k = min(block, n - start)
            took: dict[Side, float] = {}
            for side in rotated(turn):
                name = DRAIN_QUEUES[side]
                payload = {"task": DRAIN_TASKS[side], "args": [], "kwargs": {}}
                last[side] = app.queue(name).enqueue_many([payload] * k)
                if postgres:
                    sql(url, "VACUUM ANALYZE alkstore.jobs")
                worker = app.worker(queues=[name], concurrency=concurrency, handle_signals=False)
                begun = time.perf_counter()
                counts = worker.run(burst=True)
                took[side] = time.perf_counter() - begun
                if counts.succeeded != k or counts.total != k:
                    raise RuntimeError(f"{name}: {counts} for {k} jobs")
                elapsed[side] += took[side]
            per_turn.append(took)
        for side in SIDES:
            q = app.queue(DRAIN_QUEUES[side])
            stats = q.stats()
            if stats.pending or stats.scheduled or stats.processing or stats.dead:
                raise RuntimeError(f"{DRAIN_QUEUES[side]} is not empty after the run: {stats}")
            for job_id in (last[side][0], last[side][-1]):
                job = q.get_job(job_id)
                if side == "base" and job is not None:
                    raise RuntimeError(f"plain kept job {job_id}: {job.state}")
                if side == "feature" and (
                    job is None or job.state != "completed" or job.result != RESULT
                ):
                    raise RuntimeError(f"kept job {job_id} is {job}")
    return {
        "rates": {side: n / elapsed[side] for side in SIDES},
        # a turn's rate ratio, feature over baseline: its time ratio inverted
        "turn_ratios": [t["base"] / t["feature"] for t in per_turn],
    }


# -- claim cost with completed rows retained ------------------------------------------


def _sqlite_columns(db: sqlite3.Connection) -> list[str]:
    return [row[1] for row in db.execute("PRAGMA table_info(_alkstore_completed)")]


def retain(url: str, count: int, reserve: int) -> None:
    """The store at ``url`` (schema made, queue empty) gets ``count``
    completed rows of the queue (0: none), made from one real job acked
    through a ``keep_completed_s`` handle; its jobs' id counter is then set
    ``reserve`` past that job, so the next jobs' ids are alike in every store
    built with the same ``reserve``."""
    with alkstore.open(url) as store:
        q = store.queue(QUEUE, KEEP)
        first = q.enqueue(PAYLOAD)
        handle = q.claim_one("bench")
        if handle is None or handle.id != first or not handle.ack(RESULT):
            raise RuntimeError("the template job could not be completed")
    more = count - 1
    if url.startswith("sqlite"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            columns = _sqlite_columns(db)
            exprs = [
                "t.id + s.i"
                if c == "id"
                else f"t.{c} - (:more + 1 - s.i) * {SPREAD_US}"
                if c in INSTANTS
                else f"t.{c}"
                for c in columns
            ]
            db.execute("BEGIN IMMEDIATE")
            if more > 0:
                db.execute(
                    "WITH RECURSIVE s(i) AS"
                    " (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :more)"
                    f" INSERT INTO _alkstore_completed ({', '.join(columns)})"
                    f" SELECT {', '.join(exprs)} FROM _alkstore_completed AS t, s"
                    " WHERE t.id = :first",
                    {"more": more, "first": first},
                )
            elif count == 0:
                db.execute("DELETE FROM _alkstore_completed")
            db.execute(
                "UPDATE sqlite_sequence SET seq = ? WHERE name = '_alkstore_jobs'",
                (first + reserve,),
            )
            db.execute("COMMIT")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
        return
    with psycopg.connect(url, autocommit=True) as conn:
        columns = [
            str(r[0])
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = 'alkstore' AND table_name = 'completed'"
                " ORDER BY ordinal_position"
            )
        ]
        exprs = [
            "t.id + s.i"
            if c == "id"
            else f"t.{c} - (%(more)s + 1 - s.i) * interval '{SPREAD_US} microseconds'"
            if c in INSTANTS
            else f"t.{c}"
            for c in columns
        ]
        if more > 0:
            conn.execute(
                f"INSERT INTO alkstore.completed ({', '.join(columns)})"  # type: ignore[arg-type]
                f" SELECT {', '.join(exprs)}"
                " FROM alkstore.completed AS t, generate_series(1, %(more)s) AS s(i)"
                " WHERE t.id = %(first)s",
                {"more": more, "first": first},
            )
        elif count == 0:
            conn.execute("DELETE FROM alkstore.completed")
        conn.execute(
            "SELECT setval(pg_get_serial_sequence('alkstore.jobs', 'id'), %s)",
            (first + reserve,),
        )
        # What autovacuum does after so many inserts (its insert threshold).
        conn.execute("VACUUM ANALYZE alkstore.completed")


def backlog(url: str, count: int, chunk: int = 10_000) -> None:
    with alkstore.open(url) as store:
        q = store.queue(QUEUE)
        for start in range(0, count, chunk):
            q.enqueue_many([PAYLOAD] * min(chunk, count - start))


def counts(url: str) -> tuple[int, int]:
    """Jobs waiting on the queue, and completed rows of it."""
    with alkstore.open(url) as store:
        waiting = store.queue(QUEUE).stats().pending
    if url.startswith("sqlite"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            done = db.execute(
                "SELECT count(*) FROM _alkstore_completed WHERE queue = ?", (QUEUE,)
            ).fetchone()[0]
        finally:
            db.close()
    else:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM alkstore.completed WHERE queue = %s", (QUEUE,)
            ).fetchone()
            done = row[0] if row else -1
    return waiting, int(done)


def claim_round(
    urls: dict[Side, str], claims: int, batch_claims: int, block: int
) -> dict[str, dict[Side, float]]:
    """claim_one + ack(result), then claim_batch + ack_many(results), on the
    stores without (``base``) and with (``feature``) the retained rows,
    taking turns: jobs per second of each."""
    stores = {side: alkstore.open(urls[side]) for side in SIDES}
    try:
        queues = {side: stores[side].queue(QUEUE, KEEP) for side in SIDES}

        def one(side: Side) -> Callable[[int, int], None]:
            q = queues[side]

            def run(start: int, stop: int) -> None:
                for _ in range(start, stop):
                    handle = q.claim_one("bench")
                    if handle is None:
                        raise RuntimeError("the backlog ran dry")
                    if not handle.ack(RESULT):
                        raise RuntimeError(f"ack of job {handle.id} refused")

            return run

        def many(side: Side) -> Callable[[int, int], None]:
            q = queues[side]

            def run(start: int, stop: int) -> None:
                for at in range(start, stop, BATCH):
                    want = min(BATCH, stop - at)
                    handles = q.claim_batch("bench", want)
                    if len(handles) != want:
                        raise RuntimeError("the backlog ran dry")
                    if not all(q.ack_many(handles, [RESULT] * want)):
                        raise RuntimeError("an ack_many was refused")

            return run

        for side in SIDES:  # the connections opened, the statements prepared
            one(side)(0, 5)
            many(side)(0, 2 * BATCH)
        one_s = turns(claims, block, {side: one(side) for side in SIDES})
        many_s = turns(batch_claims, BATCH * BATCH_TURN, {side: many(side) for side in SIDES})
    finally:
        for store in stores.values():
            store.close()
    return {
        "one": {side: claims / one_s[side] for side in SIDES},
        "many": {side: batch_claims / many_s[side] for side in SIDES},
    }


# -- the rows -------------------------------------------------------------------------


@dataclass
class Measured:
    """One comparison: the baseline's and the feature's rates, round by round."""

    scenario: str
    base: list[float] = field(default_factory=list)
    feature: list[float] = field(default_factory=list)
    #: the drains: each turn's ratio, feature over baseline
    turn_ratios: list[float] = field(default_factory=list)

    def add(self, got: dict[Side, float]) -> None:
        self.base.append(float(got["base"]))
        self.feature.append(float(got["feature"]))

    def ratios(self) -> list[float]:
        return [f / b for b, f in zip(self.base, self.feature, strict=True)]

    def row(self) -> Row:
        # The round of the median ratio (the lower middle one for an even
        # count), its two rates beside it: the two sides of a round shared
        # its slow and fast spells, those of different rounds did not.
        ratios = self.ratios()
        middle = sorted(range(len(ratios)), key=ratios.__getitem__)[(len(ratios) - 1) // 2]
        base, feature, ratio = self.base[middle], self.feature[middle], ratios[middle]
        return Row(
            self.scenario,
            "jobs/s",
            {"baseline": base, "with feature": feature, "feature/baseline": ratio},
            f">= {TARGET}",
            "ok" if ratio >= TARGET else "MISS",
        )

    def note(self) -> str:
        pairs = ", ".join(
            f"{b:,.0f} / {f:,.0f} ({f / b:.2f})"
            for b, f in zip(self.base, self.feature, strict=True)
        )
        line = f"{self.scenario}: baseline / with feature in each round: {pairs}"
        if self.turn_ratios:
            r = self.turn_ratios
            line += (
                f"; each turn's ratio ({len(r)} turns): min {min(r):.2f}, median"
                f" {statistics.median(r):.2f}, max {max(r):.2f}"
            )
        return line


@dataclass
class Sizes:
    jobs: int
    rounds: int
    block: int
    drain_jobs: int
    drain_block: int
    drain_rounds: int
    concurrencies: tuple[int, ...]
    completed: int
    waiting: int
    claims: int
    batch_claims: int


def run_engine(
    name: str, sizes: Sizes, fresh: Callable[[str], str], settled: Callable[[str], None]
) -> tuple[list[Measured], list[str]]:
    """Every comparison on one engine. ``fresh(label)`` makes an empty store
    (schema made) and returns its url; ``settled(url)`` settles it."""
    s = sizes
    out: list[Measured] = []
    notes: list[str] = []

    enqueue = Measured(
        f"{name}: enqueue {s.jobs:,} one by one (default handle | keep_completed_s handle)"
    )
    for r in range(s.rounds):
        enqueue.add(in_child(enqueue_round, fresh(f"enqueue{r}"), s.jobs, s.block))
    out.append(enqueue)

    for c in s.concurrencies:
        drain = Measured(
            f"{name}: drain {s.drain_jobs:,} through the worker, concurrency {c}"
            " (default | keep_completed_s, results kept)"
        )
        for r in range(s.drain_rounds):
            got = in_child(drain_round, fresh(f"drain{c}_{r}"), s.drain_jobs, s.drain_block, c)
            drain.add(got["rates"])
            drain.turn_ratios += got["turn_ratios"]
        out.append(drain)

    urls: dict[Side, str] = {"base": fresh("claim_none"), "feature": fresh("claim_kept")}
    built = time.perf_counter()
    for side, count in (("base", 0), ("feature", s.completed)):
        retain(urls[side], count, s.completed)
        backlog(urls[side], s.waiting)
    notes.append(
        f"{name}: {s.completed:,} completed rows made, and {s.waiting:,} jobs queued in each"
        f" store, in {time.perf_counter() - built:.0f} s (not timed)"
    )
    what = f"{s.waiting:,} waiting at the start (0 | {s.completed:,} completed rows retained)"
    one = Measured(f"{name}: claim_one + ack(result), {what}")
    many = Measured(f"{name}: claim_batch({BATCH}) + ack_many(results), {what}")
    for _ in range(s.rounds):
        for url in urls.values():
            settled(url)
        got = in_child(claim_round, urls, s.claims, s.batch_claims, s.block)
        one.add(got["one"])
        many.add(got["many"])
    used = s.rounds * (5 + 2 * BATCH + s.claims + s.batch_claims)
    for side, kept in (("base", 0), ("feature", s.completed)):
        expected = (s.waiting - used, kept + used)
        if counts(urls[side]) != expected:
            raise RuntimeError(f"{urls[side]}: {counts(urls[side])}, expected {expected}")
    out += [one, many]
    return out, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    add_url_option(parser, "PostgreSQL: a database to administer from (CREATE DATABASE)")
    parser.add_argument("--jobs", type=int, default=2_000, help="enqueues per side (2,000)")
    parser.add_argument("--rounds", type=int, default=3, help="enqueue and claim rounds (3)")
    parser.add_argument("--block", type=int, default=100, help="calls per turn (100)")
    parser.add_argument(
        "--drain-jobs", type=int, default=10_000, help="per side and round (10,000)"
    )
    parser.add_argument("--drain-block", type=int, default=2_000, help="per turn (2,000)")
    parser.add_argument("--drain-rounds", type=int, default=3, help="drain rounds (3)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 16], help="worker concurrencies (1 16)"
    )
    parser.add_argument(
        "--completed", type=int, default=1_000_000, help="completed rows retained (1,000,000)"
    )
    parser.add_argument("--waiting", type=int, default=50_000, help="backlog (50,000)")
    parser.add_argument("--claims", type=int, default=2_000, help="claim_one per round (2,000)")
    parser.add_argument(
        "--batch-claims", type=int, default=10_000, help="jobs claimed in batches per round"
    )
    args = parser.parse_args()
    sizes = Sizes(
        args.jobs,
        args.rounds,
        args.block,
        args.drain_jobs,
        args.drain_block,
        args.drain_rounds,
        tuple(args.concurrency),
        args.completed,
        args.waiting,
        args.claims,
        args.batch_claims,
    )
    if min(args.jobs, args.rounds, args.block, args.drain_jobs, args.drain_block) < 1 or (
        args.drain_rounds < 1
    ):
        parser.error("sizes must be at least 1")
    if args.completed < 1 or args.batch_claims % BATCH:
        parser.error(f"--completed >= 1, --batch-claims a multiple of {BATCH}")
    if args.waiting <= args.rounds * (5 + 2 * BATCH + args.claims + args.batch_claims):
        parser.error("--waiting is too small for the claims of every round")
    began = time.perf_counter()
    table = Table("", ["baseline", "with feature", "feature/baseline"])
    about = [f"{os.cpu_count()} cores", f"Python {sys.version.split()[0]}"]
    notes: list[str] = []
    measured: list[Measured] = []
    workdir = Path(tempfile.mkdtemp(prefix="alkstore-bench-completed-"))
    server: Server | None = None
    try:
        if args.engine in ("sqlite", "both"):
            about.append(f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=FULL)")

            def sqlite_fresh(label: str) -> str:
                url = f"sqlite:///{workdir / f'{label}.db'}"
                alkstore.open(url).close()  # the schema
                return url

            def sqlite_settled(url: str) -> None:
                db = sqlite3.connect(url.removeprefix("sqlite:///"))
                try:
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                finally:
                    db.close()

            got, more = run_engine("SQLite", sizes, sqlite_fresh, sqlite_settled)
            measured += got
            notes += more
        if args.engine in ("postgres", "both"):
            try:
                server = Server(args.url)
            except Exception as exc:
                notes.append(f"PostgreSQL: - (cannot use the server at --url: {exc})")
        if server is not None:
            pg = server
            about.append(f"PostgreSQL {pg.version.split()[0]} ({pg.settings})")

            def pg_fresh(label: str) -> str:
                url = pg.create(f"completed_{label}")
                alkstore.open(url).close()  # the schema
                return url

            got, more = run_engine("PostgreSQL", sizes, pg_fresh, settle)
            measured += got
            notes += more
    finally:
        if server is not None:
            server.drop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    table.title = (
        f"alkstore with QueueOpts(keep_completed_s={KEEP_S}) beside the default, the two"
        " taking turns in one process; " + ", ".join(about)
    )
    for m in measured:
        table.add(m.row())
    print(table.render())
    print()
    for line in [*notes, *(m.note() for m in measured)]:
        print(textwrap.fill(line, 100, subsequent_indent="  "))
    print(f"\n(run took {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
