"""PostgreSQL benchmark: alkstore beside PgQueuer, procrastinate and pgbench, in one run.

Run from the repository root after installing requirements-dev.txt and
bench/requirements.txt (the peers), with ``pgbench`` on PATH::

    python bench/bench_postgres.py            # the full run (10,000 and 1,000,000 waiting)
    python bench/bench_postgres.py --quick    # a smoke run (10,000 and 100,000 waiting)
    python bench/bench_postgres.py --url postgresql://postgres@127.0.0.1:5432/test

``--url`` names a database to connect to for administration (default
``$ALKSTORE_BENCH_POSTGRES_URL``, else ``$ALKSTORE_TEST_POSTGRES_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``); the role must be allowed to
create databases. Every system gets its own fresh database on that server,
dropped at the end, so none can see another's tables, triggers or NOTIFYs.

Every figure is jobs per second unless the unit says otherwise. "pgbench"
runs the bare statements an ideal queue would send, against alkstore's own
table and indexes (see bench/README.md for the scripts), so it is the
ceiling of the server for those statements. Every measurement runs in a
fresh process with its connections already open; the drains start from a
vacuumed table. "W waiting" means at least W further jobs stay queued during
the measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from _horizon import horizon_rows
from _pool import pool_wait_row
from _report import Row, Table, percentile
from _restart import restart_recovery_row

import alkstore
from alkstore_postgres import channel_name

BATCH = 100
PAYLOAD = {"task": "noop", "args": [1, 2, 3]}
PAYLOAD_BYTES = b'{"task":"noop","args":[1,2,3]}'
PEERS = ("PgQueuer", "procrastinate")
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


def add_url_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The benches' ``--url``: ``$ALKSTORE_BENCH_POSTGRES_URL``, else
    ``$ALKSTORE_TEST_POSTGRES_URL``, else :data:`DEFAULT_ADMIN_URL`."""
    parser.add_argument(
        "--url",
        default=os.environ.get("ALKSTORE_BENCH_POSTGRES_URL")
        or os.environ.get("ALKSTORE_TEST_POSTGRES_URL")
        or DEFAULT_ADMIN_URL,
        help=help_text,
    )


# -- running a measurement in a fresh process --------------------------------


@dataclass
class _Failed:
    text: str


def _child_main(pipe: Any, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        pipe.send(target(*args))
    except BaseException as exc:
        last = traceback.format_exception_only(exc)[-1].strip()
        pipe.send(_Failed(last))
        traceback.print_exc()


def in_child(target: Callable[..., Any], *args: Any) -> Any:
    """Run ``target(*args)`` in a fresh spawned process and return its result."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(there, target, args))
    child.start()
    there.close()
    try:
        result = here.recv()
    except EOFError:
        child.join()
        raise RuntimeError(f"{target.__name__} died (exit code {child.exitcode})") from None
    child.join()
    if isinstance(result, _Failed):
        raise RuntimeError(result.text)
    return result


# -- the server ----------------------------------------------------------------


class Server:
    """One PostgreSQL server: a database per system, dropped by :meth:`drop_all`."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.created: list[str] = []
        with psycopg.connect(admin_url, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            self.version = row[0] if row else "?"
            settings = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in ("synchronous_commit", "fsync", "shared_buffers")
            }
        self.settings = ", ".join(f"{k}={v}" for k, v in settings.items())

    def url(self, database: str) -> str:
        parts = urlsplit(self.admin_url)
        return urlunsplit(parts._replace(path=f"/{database}"))

    def create(self, name: str) -> str:
        database = f"alkbench_{os.getpid()}_{name}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
            conn.execute(f'CREATE DATABASE "{database}"')
        self.created.append(database)
        return self.url(database)

    def drop_all(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for database in self.created:
                conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        self.created.clear()


def sql(url: str, *statements: str) -> None:
    """Run housekeeping statements (TRUNCATE, VACUUM) outside any transaction."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def settle(url: str) -> None:
    """Put the backlog in the same state before every claim-cost measurement,
    whatever ran before it and whatever its size (not timed).

    A VACUUM that also cleans the indexes: by default (``INDEX_CLEANUP AUTO``,
    PostgreSQL 14+) VACUUM skips the indexes while fewer than 2% of the
    table's pages hold dead rows, so in the 1,000,000 table (and not in the
    10,000 one) it would leave in the claim's indexes the entries of every
    job the previous measurements claimed and acked, and each claim would
    walk over them. Then a CHECKPOINT, so that writing out the fill's dirty
    pages does not compete with the measured commits for the disk (skipped
    when the role may not run it).
    """
    sql(url, "VACUUM (ANALYZE, INDEX_CLEANUP ON)")
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        sql(url, "CHECKPOINT")


# -- pgbench: the ceiling --------------------------------------------------------

_COLUMNS = (
    "queue, state, payload, content_type, priority, run_at, expires_at, enqueued_at,"
    " max_attempts, visibility_timeout_s, backoff_base_s, backoff_cap_s"
)
# No colon in the payload literal: pgbench would read ":name" as a variable.
_VALUES = (
    "'{queue}', 'pending', '\\x" + PAYLOAD_BYTES.hex() + "'::bytea, 'application/json', 0,"
    " now(), NULL, now(), 5, 30, 4, 3600"
)


def insert_script(queue: str, batch: int) -> str:
    """alkstore's enqueue statement: the insert and the NOTIFY in one statement."""
    values = _VALUES.format(queue=queue)
    source = (
        f"VALUES ({values})"
        if batch == 1
        else f"SELECT {values} FROM generate_series(1, {batch}) ORDER BY 1"
    )
    return (
        f"WITH ins AS (INSERT INTO alkstore.jobs ({_COLUMNS}) {source} RETURNING id),\n"
        f"wake AS (SELECT pg_notify('{channel_name('alkstore', queue)}', ''))\n"
        "SELECT ins.id FROM ins, wake;\n"
    )


def claim_script(queue: str, batch: int) -> str:
    """The bare claim (a SKIP LOCKED walk of the pending index in claim order,
    the update, the rows returned), then the ack of what it claimed."""
    claim = (
        "WITH due AS (\n"
        f"  SELECT id FROM alkstore.jobs WHERE queue = '{queue}' AND state = 'pending'\n"
        "    AND run_at <= now() AND (expires_at IS NULL OR expires_at > now())\n"
        f"  ORDER BY priority DESC, run_at, id LIMIT {batch} FOR UPDATE SKIP LOCKED\n"
        "), claimed AS (\n"
        "  UPDATE alkstore.jobs SET state = 'processing', attempts = attempts + 1,\n"
        "    worker_id = 'pgbench',\n"
        "    claim_deadline = now() + make_interval(secs => visibility_timeout_s)\n"
        "  WHERE id IN (SELECT id FROM due)\n"
        "  RETURNING id, payload, content_type, attempts, max_attempts, claim_deadline\n"
        ")\n"
    )
    ack_where = f"AND queue = '{queue}' AND state = 'processing' AND claim_deadline > now();\n"
    if batch == 1:
        return (
            f"{claim}SELECT id, payload FROM claimed \\gset\n"
            f"DELETE FROM alkstore.jobs WHERE id = :id {ack_where}"
        )
    return (
        f"{claim}SELECT array_agg(id) AS ids, array_agg(payload) AS payloads FROM claimed \\gset\n"
        f"DELETE FROM alkstore.jobs WHERE id = ANY(:ids::bigint[]) {ack_where}"
    )


# The cheapest durable transaction a queue could commit: one int into a table
# with no index. Its rate at one client bounds every one-by-one enqueue on
# this server, whatever the client.
FLOOR_TABLE = "alkstore_bench_floor"
FLOOR_SCRIPT = f"INSERT INTO {FLOOR_TABLE} VALUES (1);\n"


def fill_sql(queue: str, count: int) -> str:
    values = _VALUES.format(queue=queue)
    return (
        f"INSERT INTO alkstore.jobs ({_COLUMNS}) SELECT {values}"
        f" FROM generate_series(1, {count}) ORDER BY 1"
    )


class Pgbench:
    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.exe = shutil.which("pgbench")
        self.version = ""
        if self.exe:
            out = subprocess.run(
                [self.exe, "--version"], check=False, capture_output=True, text=True
            )
            found = re.search(r"\d+(\.\d+)+", out.stdout)
            self.version = found.group(0) if found else "?"

    def tps(self, name: str, script: str, clients: int, transactions: int) -> float:
        """Transactions per second of ``script``, ``transactions`` per client."""
        if self.exe is None:
            raise RuntimeError("pgbench not found on PATH")
        path = self.tmp / f"{name}.sql"
        path.write_text(script)
        cmd = [
            self.exe,
            "--no-vacuum",
            "--protocol=prepared",
            f"--file={path}",
            f"--client={clients}",
            f"--jobs={min(clients, os.cpu_count() or 1)}",
            f"--transactions={transactions}",
            self.url,
        ]
        out = subprocess.run(cmd, check=False, capture_output=True, text=True)
        found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out.stdout)
        failed = re.search(r"number of failed transactions: ([1-9][0-9]*)", out.stdout)
        if out.returncode != 0 or not found or failed:
            raise RuntimeError(f"pgbench {name} failed: {out.stderr.strip()[-300:]}")
        return float(found.group(1))


# -- alkstore ------------------------------------------------------------------


def alk_enqueue(url: str, n: int, batch: int) -> float:
    with alkstore.open(url) as store:
        q = store.queue("enq")
        # The pool's connection, the statements prepared.
        q.enqueue_many([PAYLOAD] * 10)
        q.enqueue(PAYLOAD)
        begun = time.perf_counter()
        if batch == 1:
            for _ in range(n):
                q.enqueue(PAYLOAD)
        else:
            for start in range(0, n, batch):
                q.enqueue_many([PAYLOAD] * min(batch, n - start))
        return n / (time.perf_counter() - begun)


def bare_enqueue(url: str, n: int) -> float:
    """alkstore's enqueue statement (pgbench's script) sent one by one through
    a bare psycopg connection, prepared: the driver's ceiling, without the
    pool, the option resolution and the payload codec."""
    statement = insert_script("enq", 1).encode()
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(10):
            conn.execute(statement, prepare=True).fetchone()
        begun = time.perf_counter()
        for _ in range(n):
            conn.execute(statement, prepare=True).fetchone()
        return n / (time.perf_counter() - begun)


def alk_fill(url: str, queue: str, n: int, chunk: int = 10_000) -> None:
    with alkstore.open(url) as store:
        q = store.queue(queue)
        for start in range(0, n, chunk):
            q.enqueue_many([PAYLOAD] * min(chunk, n - start))


def alk_drain(
    url: str,
    queue: str,
    n: int,
    consumers: int,
    batch: int = BATCH,
    *,
    options: dict[str, Any] | None = None,
) -> float:
    """``consumers`` threads of one process, each looping claim_batch + ack_batch
    until the queue is empty: how one alkstore worker process consumes
    (``options``: further engine options, such as ``pooler``)."""
    size = consumers + 2
    with alkstore.open(url, pool_min_size=size, pool_max_size=size, **(options or {})) as store:
        q = store.queue(queue)
        warm = store.queue("warm")
        ready = threading.Barrier(consumers + 1)
        counts = [0] * consumers
        errors: list[BaseException] = []

        def consume(i: int) -> None:
            try:
                warm.claim_batch("bench", batch)
                warm.ack_batch([0])
                ready.wait()
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
        raise RuntimeError(f"alkstore drained {sum(counts)} of {n} jobs")
    return n / elapsed


def alk_drain_pooled(url: str, queue: str, n: int, consumers: int, pooler: str | None) -> float:
    """:func:`alk_drain` with the engine option ``pooler``."""
    return alk_drain(url, queue, n, consumers, options={"pooler": pooler})


def alk_claim_cost(url: str, queue: str, n: int) -> float:
    """Milliseconds per claim_one + ack, one consumer."""
    with alkstore.open(url) as store:
        q = store.queue(queue)
        h = q.claim_one("bench")
        assert h is not None
        h.ack()
        begun = time.perf_counter()
        for _ in range(n):
            handle = q.claim_one("bench")
            if handle is None:
                raise RuntimeError("the backlog ran dry")
            handle.ack()
        return (time.perf_counter() - begun) * 1000 / n


def _alk_wake_consumer(url: str, ready: Any, pipe: Any, samples: int) -> None:
    with alkstore.open(url) as store, store.listen("wake") as sub:
        q = store.queue("wake")
        ready.set()
        got = 0
        while got < samples:
            handle = q.claim_one("bench")
            if handle is None:
                sub.wait(5.0)
                continue
            pipe.send(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
            handle.ack()
            got += 1


def alk_wake(
    url: str,
    samples: int,
    warmup: int,
    *,
    consumer: Callable[..., None] = _alk_wake_consumer,
    queue: str = "wake",
    payload: Any = PAYLOAD,
) -> list[float]:
    """Milliseconds from an enqueue's commit here to its claim in a consumer
    process that waits on ``store.listen()`` and claims on wake.

    ``consumer(url, ready, pipe, count)`` is the consumer process's target
    (spawned): it sets ``ready``, then sends ``CLOCK_MONOTONIC`` (ns) down
    ``pipe`` as it takes each of ``count`` jobs of ``queue``; the producer
    here enqueues ``payload`` one at a time."""
    with alkstore.open(url) as store:
        q = store.queue(queue)
        return sample_wakes(
            consumer,
            url,
            lambda: q.enqueue(payload),
            samples=samples,
            warmup=warmup,
            who="the alkstore consumer",
        )


def sample_wakes(
    consumer: Callable[..., None],
    where: str,
    enqueue: Callable[[], object],
    *,
    samples: int,
    warmup: int,
    who: str,
) -> list[float]:
    """Milliseconds from each ``enqueue()`` here (its commit: when it
    returns) to the ``CLOCK_MONOTONIC`` (ns) a spawned consumer process
    sends down its pipe as it takes the job: ``consumer(where, ready, pipe,
    count)`` sets ``ready``, then sends one reading per job of ``count``.
    The producer pauses 5 to 17 ms before each job, so the consumer idles
    between them; the first ``warmup`` samples are dropped."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    here, there = ctx.Pipe(duplex=False)
    child = ctx.Process(target=consumer, args=(where, ready, there, warmup + samples))
    child.start()
    ready.wait(30)
    out: list[float] = []
    try:
        for i in range(warmup + samples):
            time.sleep(0.005 + (i % 7) * 0.002)  # the consumer idles between wakes
            enqueue()
            committed = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            if not here.poll(10):
                raise RuntimeError(f"{who} did not take the job within 10 s")
            taken = here.recv()
            if i >= warmup:
                out.append(max(0, taken - committed) / 1e6)
    finally:
        child.join(10)
        if child.is_alive():
            child.terminate()
            child.join()
    return out


# -- PgQueuer (asyncpg) ----------------------------------------------------------


async def _pgq_queries(url: str) -> tuple[Any, Any]:
    """PgQueuer's ``Queries`` on a new asyncpg connection, and the connection."""
    import asyncpg
    from pgqueuer import Queries

    conn = await asyncpg.connect(url)
    return Queries.from_asyncpg_connection(conn), conn


def pgq_install(url: str) -> str:
    async def run() -> None:
        queries, conn = await _pgq_queries(url)
        await queries.install()
        await conn.close()

    asyncio.run(run())
    return metadata.version("pgqueuer")


def pgq_enqueue(url: str, n: int, batch: int) -> float:
    async def run() -> float:
        queries, conn = await _pgq_queries(url)
        await queries.enqueue("noop", PAYLOAD_BYTES)
        begun = time.perf_counter()
        if batch == 1:
            for _ in range(n):
                await queries.enqueue("noop", PAYLOAD_BYTES)
        else:
            for start in range(0, n, batch):
                k = min(batch, n - start)
                await queries.enqueue(["noop"] * k, [PAYLOAD_BYTES] * k, [0] * k)
        elapsed = time.perf_counter() - begun
        await conn.close()
        return n / elapsed

    return asyncio.run(run())


def pgq_fill(url: str, n: int, chunk: int = 10_000) -> None:
    async def run() -> None:
        queries, conn = await _pgq_queries(url)
        for start in range(0, n, chunk):
            k = min(chunk, n - start)
            await queries.enqueue(["noop"] * k, [PAYLOAD_BYTES] * k, [0] * k)
        await conn.close()

    asyncio.run(run())


def pgq_drain(url: str, n: int, consumers: int, batch: int = BATCH) -> float:
    """``consumers`` QueueManagers in one process (one asyncpg connection each),
    ``run(mode=drain, batch_size=batch)`` with a no-op async entrypoint."""
    from pgqueuer import QueueManager
    from pgqueuer.types import QueueExecutionMode

    done = 0

    async def run() -> float:
        nonlocal done
        managers = []
        for _ in range(consumers):
            qm = QueueManager((await _pgq_queries(url))[0])

            @qm.entrypoint("noop")
            async def noop(job: Any) -> None:
                nonlocal done
                done += 1

            managers.append(qm)
        begun = time.perf_counter()
        await asyncio.gather(
            *(qm.run(batch_size=batch, mode=QueueExecutionMode.drain) for qm in managers)
        )
        return time.perf_counter() - begun

    elapsed = asyncio.run(run())
    if done != n:
        raise RuntimeError(f"PgQueuer ran {done} of {n} jobs")
    return n / elapsed


def _pgq_wake_consumer(url: str, ready: Any, pipe: Any, samples: int) -> None:
    from pgqueuer import QueueManager

    async def run() -> None:
        qm = QueueManager((await _pgq_queries(url))[0])
        got = 0

        @qm.entrypoint("wake")
        async def wake(job: Any) -> None:
            nonlocal got
            pipe.send(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
            got += 1
            if got >= samples:
                qm.shutdown.set()

        ready.set()
        await qm.run(batch_size=1)

    asyncio.run(run())


def pgq_wake(url: str, samples: int, warmup: int) -> list[float]:
    """As :func:`alk_wake`: PgQueuer's QueueManager LISTENs on its channel
    (its table's trigger NOTIFYs on insert) and dequeues on the notice."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    here, there = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_pgq_wake_consumer, args=(url, ready, there, warmup + samples))
    child.start()
    ready.wait(30)

    async def produce() -> list[float]:
        queries, conn = await _pgq_queries(url)
        out: list[float] = []
        for i in range(warmup + samples):
            await asyncio.sleep(0.005 + (i % 7) * 0.002)
            await queries.enqueue("wake", PAYLOAD_BYTES)
            committed = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            if not here.poll(10):
                raise RuntimeError("the PgQueuer consumer did not run the job within 10 s")
            claimed = here.recv()
            if i >= warmup:
                out.append(max(0, claimed - committed) / 1e6)
        await conn.close()
        return out

    try:
        return asyncio.run(produce())
    finally:
        child.join(10)
        if child.is_alive():
            child.terminate()
            child.join()


# -- procrastinate (psycopg 3, async) ----------------------------------------------


def _proc_app(url: str, pool_size: int, on_job: Callable[[], None] | None = None) -> Any:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url, min_size=pool_size, max_size=pool_size))

    @app.task(name="noop", queue="bench")
    async def noop(args: list[int]) -> None:
        if on_job is not None:
            on_job()

    app.noop = noop  # type: ignore[attr-defined]
    return app


def proc_install(url: str) -> str:
    async def run() -> None:
        app = _proc_app(url, 1)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(run())
    return metadata.version("procrastinate")


def proc_enqueue(url: str, n: int, batch: int) -> float:
    async def run() -> float:
        app = _proc_app(url, 2)
        async with app.open_async():
            await app.noop.defer_async(args=[1, 2, 3])
            begun = time.perf_counter()
            if batch == 1:
                for _ in range(n):
                    await app.noop.defer_async(args=[1, 2, 3])
            else:
                for start in range(0, n, batch):
                    k = min(batch, n - start)
                    await app.noop.batch_defer_async(*[{"args": [1, 2, 3]}] * k)
            return n / (time.perf_counter() - begun)

    return asyncio.run(run())


def proc_fill(url: str, n: int, chunk: int = 10_000) -> None:
    async def run() -> None:
        app = _proc_app(url, 2)
        async with app.open_async():
            for start in range(0, n, chunk):
                k = min(chunk, n - start)
                await app.noop.batch_defer_async(*[{"args": [1, 2, 3]}] * k)

    asyncio.run(run())


def proc_drain(url: str, n: int, concurrency: int) -> float:
    """One worker, ``run_worker_async(concurrency=N, wait=False)``: it returns
    once it has caught up with the queue."""
    done = 0

    def count() -> None:
        nonlocal done
        done += 1

    async def run() -> float:
        app = _proc_app(url, concurrency + 4, count)
        async with app.open_async():
            begun = time.perf_counter()
            await app.run_worker_async(
                queues=["bench"],
                concurrency=concurrency,
                wait=False,
                install_signal_handlers=False,
            )
            return time.perf_counter() - begun

    elapsed = asyncio.run(run())
    if done != n:
        raise RuntimeError(f"procrastinate ran {done} of {n} jobs")
    return n / elapsed


def _proc_wake_consumer(url: str, ready: Any, pipe: Any, samples: int) -> None:
    got = 0
    finished: asyncio.Event | None = None

    def on_job() -> None:
        nonlocal got
        pipe.send(time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        got += 1
        if got >= samples and finished is not None:
            finished.set()

    async def run() -> None:
        nonlocal finished
        finished = asyncio.Event()
        app = _proc_app(url, 4, on_job)
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=["bench"],
                    concurrency=1,
                    wait=True,
                    listen_notify=True,
                    install_signal_handlers=False,
                )
            )
            ready.set()
            await finished.wait()
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    asyncio.run(run())


def proc_wake(url: str, samples: int, warmup: int) -> list[float]:
    """As :func:`alk_wake`: procrastinate's worker with ``listen_notify=True``
    (its trigger NOTIFYs on insert) fetches on the notification."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    here, there = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_proc_wake_consumer, args=(url, ready, there, warmup + samples))
    child.start()
    ready.wait(30)
    time.sleep(1.0)  # the worker's LISTEN is set up after run_worker_async starts

    async def produce() -> list[float]:
        app = _proc_app(url, 1)
        out: list[float] = []
        async with app.open_async():
            for i in range(warmup + samples):
                await asyncio.sleep(0.005 + (i % 7) * 0.002)
                await app.noop.defer_async(args=[1, 2, 3])
                committed = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                if not here.poll(10):
                    raise RuntimeError("the procrastinate worker did not run the job within 10 s")
                claimed = here.recv()
                if i >= warmup:
                    out.append(max(0, claimed - committed) / 1e6)
        return out

    try:
        return asyncio.run(produce())
    finally:
        child.join(10)
        if child.is_alive():
            child.terminate()
            child.join()


# -- the run -------------------------------------------------------------------


@dataclass
class Sizes:
    single: int
    batched: int
    drain: int
    wake: int
    small: int
    big: int
    claims: int
    repeat: int


QUICK = Sizes(
    single=500,
    batched=10_000,
    drain=4_000,
    wake=50,
    small=10_000,
    big=100_000,
    claims=300,
    repeat=1,
)
FULL = Sizes(
    single=5_000,
    batched=50_000,
    drain=20_000,
    wake=300,
    small=10_000,
    big=1_000_000,
    claims=2_000,
    repeat=3,
)

TRUNCATE = {
    "alkstore": "TRUNCATE alkstore.jobs, alkstore.dead",
    "pgbench": "TRUNCATE alkstore.jobs, alkstore.dead",  # pgbench runs on alkstore's tables
    "PgQueuer": "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics",
    "procrastinate": "TRUNCATE procrastinate_jobs, procrastinate_workers CASCADE",
}


class Systems:
    """alkstore and the peers, each in a fresh database of its own on
    ``server`` (alkstore's migrated, the peers' schemas installed); a peer
    that cannot be set up is recorded in :attr:`broken` and skipped."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.urls: dict[str, str] = {}
        self.notes: list[str] = []
        self.versions: dict[str, str] = {}
        self.broken: dict[str, str] = {}
        self.urls["alkstore"] = server.create("alkstore")
        alkstore.open(self.urls["alkstore"]).close()
        for peer, install in (("PgQueuer", pgq_install), ("procrastinate", proc_install)):
            try:
                self.urls[peer] = server.create(peer.lower())
                self.versions[peer] = in_child(install, self.urls[peer])
            except Exception as exc:
                hint = " (pip install -r bench/requirements.txt)" if "Import" in str(exc) else ""
                self.broken[peer] = f"cannot be installed or set up: {exc}{hint}"

    def reset(self, system: str) -> None:
        """Empty the system's tables (between scenarios; not timed)."""
        sql(self.urls[system], TRUNCATE[system])

    def measure(self, system: str, run: Callable[[], Any], *, reset: bool = False) -> Any:
        """``run()``, after emptying the system's tables if ``reset``; ``None``
        when a peer or pgbench cannot be driven (the reason goes under the
        table, and the system is skipped from then on). alkstore's own
        failures propagate."""
        if system in self.broken:
            return None
        if system == "alkstore":
            if reset:
                self.reset(system)
            return run()
        try:
            if reset:
                self.reset(system)
            return run()
        except Exception as exc:
            self.broken[system] = f"failed: {exc}"
            return None

    def note_missing(self) -> None:
        for system, why in self.broken.items():
            self.notes.append(f"{system}: - ({why})")


class Bench(Systems):
    """The systems, and pgbench on alkstore's database (its ceiling)."""

    def __init__(self, server: Server, sizes: Sizes, tmp: Path) -> None:
        super().__init__(server)
        self.sizes = sizes
        self.urls["pgbench"] = self.urls["alkstore"]
        self.pgbench = Pgbench(self.urls["alkstore"], tmp)
        if self.pgbench.exe is None:
            self.broken["pgbench"] = "pgbench is not on PATH"


def rate_row(
    table: Table,
    name: str,
    figures: dict[str, float | None],
    *,
    vs_peer: float | None = None,
    vs_pgbench: float | None = None,
) -> None:
    """Add a jobs/s row; with ``vs_peer`` / ``vs_pgbench``, the target that
    alkstore reaches that multiple of the best peer / of pgbench."""
    shown = {k: v for k, v in figures.items() if v is not None}
    alk = shown.get("alkstore")
    peers = [shown[p] for p in PEERS if p in shown]
    best_peer = max(peers) if peers else None
    ceiling = shown.get("pgbench")
    if alk is not None and ceiling:
        shown["alkstore/pgbench"] = alk / ceiling
    if alk is not None and best_peer:
        shown["alkstore/best peer"] = alk / best_peer
    targets, checks = [], []
    if vs_peer is not None:
        targets.append(f">= {vs_peer}x best peer")
        checks.append((best_peer, vs_peer))
    if vs_pgbench is not None:
        targets.append(f">= {vs_pgbench}x pgbench")
        checks.append((ceiling, vs_pgbench))
    verdict = ""
    if checks:
        if alk is None or any(ref is None for ref, _ in checks):
            verdict = "?"  # a reference could not be measured: see the notes
        else:
            met = all(alk >= minimum * ref for ref, minimum in checks)  # type: ignore[operator]
            verdict = "ok" if met else "MISS"
    table.add(Row(name, "jobs/s", shown, ", ".join(targets), verdict))


def enqueue_floor(bench: Bench, n: int, figures: dict[str, float | None]) -> None:
    """Note what bounds one-by-one enqueue on this server: each call waits
    for its own commit's WAL flush, so a durable one-int insert at one client
    (pgbench) is the floor of its cost, and the bare driver sending
    alkstore's statement is the ceiling of any psycopg client."""
    alk_url = bench.urls["alkstore"]
    sql(alk_url, f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (x int)")
    floor = bench.measure(
        "pgbench", lambda: bench.pgbench.tps("floor", FLOOR_SCRIPT, 1, n), reset=False
    )
    bench.reset("alkstore")
    bare = in_child(bare_enqueue, alk_url, n)
    bench.reset("alkstore")
    sql(alk_url, f"DROP TABLE {FLOOR_TABLE}")
    best_peer = max((figures[p] or 0.0 for p in PEERS), default=0.0)
    parts = [f"alkstore's statement through bare psycopg {bare:,.0f}/s"]
    if floor is not None:
        parts.insert(0, f"a durable one-int insert (pgbench) {floor:,.0f}/s")
    if best_peer:
        parts.append(f"1.5x the best peer is {1.5 * best_peer:,.0f}/s")
    bench.notes.append("enqueue one by one, at one client on this server: " + "; ".join(parts))


#: The PgBouncer row's concurrency, and its target as a fraction of direct.
BOUNCER_CONSUMERS = 16
BOUNCER_TARGET = 0.7


def pgbouncer_row(bench: Bench, table: Table) -> None:
    """The drain at concurrency 16 through a PgBouncer of the bench's own in
    ``pool_mode = transaction`` (stock settings otherwise; started by
    ``alkstore_postgres/tests/postgres_bouncer.py``, which the engine's tests
    use too) as a multiple of the same drain straight to the server: the
    median of ``repeat`` rounds each, taking turns from a vacuumed table."""
    tests = Path(__file__).resolve().parent.parent / "alkstore_postgres" / "tests"
    sys.path.insert(0, str(tests))
    from postgres_bouncer import BouncerUnavailable, find_pgbouncer, pgbouncer

    alk_url = bench.urls["alkstore"]
    n, c = bench.sizes.drain, BOUNCER_CONSUMERS
    name = f"drain {n:,}, concurrency {c}, PgBouncer transaction / direct"
    program = find_pgbouncer()
    try:
        with pgbouncer(alk_url, "transaction") as bouncer:
            rounds: dict[str, list[float]] = {"direct": [], "PgBouncer": []}
            for _ in range(bench.sizes.repeat):
                for way, url, pooler in (
                    ("direct", alk_url, None),
                    ("PgBouncer", bouncer.url(), "transaction"),
                ):
                    bench.reset("alkstore")
                    alk_fill(alk_url, "drain", n)
                    sql(alk_url, "VACUUM ANALYZE")
                    rounds[way].append(in_child(alk_drain_pooled, url, "drain", n, c, pooler))
    except BouncerUnavailable as exc:
        bench.notes.append(f"{name}: - ({exc})")
        table.add(Row(name, "ratio", {}, f">= {BOUNCER_TARGET}x", "?"))
        return
    direct, bounced = (statistics.median(rounds[k]) for k in ("direct", "PgBouncer"))
    version = subprocess.run(
        [str(program), "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[:1]
    bench.notes.append(
        f"{name}: direct {direct:,.0f} jobs/s, through {' '.join(version)} "
        f"(pool_mode = transaction, stock settings) {bounced:,.0f} jobs/s"
    )
    ratio = bounced / direct
    verdict = "ok" if ratio >= BOUNCER_TARGET else "MISS"
    table.add(Row(name, "ratio", {"alkstore": ratio}, f">= {BOUNCER_TARGET}x", verdict))


def run(bench: Bench, table: Table) -> None:
    s = bench.sizes
    alk_url = bench.urls["alkstore"]
    pgb = bench.pgbench

    # -- enqueue: the median of `repeat` rounds, the systems taking turns ----------
    for batch, n in ((1, s.single), (100, s.batched), (1_000, s.batched)):
        runs: list[tuple[str, Callable[[], float]]] = [
            (
                "pgbench",
                lambda b=batch, k=n: (
                    b * pgb.tps(f"insert{b}", insert_script("pgbench", b), 1, k // b)
                ),
            ),
            ("alkstore", lambda b=batch, k=n: in_child(alk_enqueue, alk_url, k, b)),
            *(
                (peer, lambda f=enqueue, p=peer, b=batch, k=n: in_child(f, bench.urls[p], k, b))
                for peer, enqueue in (("PgQueuer", pgq_enqueue), ("procrastinate", proc_enqueue))
            ),
        ]
        samples: dict[str, list[float]] = {system: [] for system, _ in runs}
        for _ in range(s.repeat):
            for system, measure in runs:
                got = bench.measure(system, measure, reset=True)
                if got is not None:
                    samples[system].append(got)
        figures: dict[str, float | None] = {
            k: statistics.median(v) if v else None for k, v in samples.items()
        }
        if batch == 1:
            rate_row(table, "enqueue one by one", figures, vs_peer=1.5, vs_pgbench=0.5)
            enqueue_floor(bench, n, figures)
        elif batch == 1_000:
            rate_row(table, f"enqueue_many ({batch:,})", figures, vs_peer=1.5)
        else:
            rate_row(table, f"enqueue_many ({batch:,})", figures)

    # -- drains --------------------------------------------------------------
    n = s.drain
    for consumers in (1, 4, 16):
        figures = {}
        per_client = math.ceil(n / (BATCH * consumers))
        bench.reset("alkstore")
        # A margin, so that every claim finds a full batch despite SKIP LOCKED.
        sql(alk_url, fill_sql("pgbench", (per_client + 1) * BATCH * consumers), "VACUUM ANALYZE")
        figures["pgbench"] = bench.measure(
            "pgbench",
            lambda c=consumers, t=per_client: (
                BATCH * pgb.tps(f"claim{c}", claim_script("pgbench", BATCH), c, t)
            ),
        )
        bench.reset("alkstore")
        alk_fill(alk_url, "drain", n)
        sql(alk_url, "VACUUM ANALYZE")
        figures["alkstore"] = bench.measure(
            "alkstore", lambda c=consumers: in_child(alk_drain, alk_url, "drain", n, c)
        )
        for peer, fill, drain in (
            ("PgQueuer", pgq_fill, pgq_drain),
            ("procrastinate", proc_fill, proc_drain),
        ):

            def measure(f: Any = fill, d: Any = drain, p: str = peer, c: int = consumers) -> float:
                in_child(f, bench.urls[p], n)
                sql(bench.urls[p], "VACUUM ANALYZE")
                return in_child(d, bench.urls[p], n, c)

            figures[peer] = bench.measure(peer, measure, reset=True)
        name = f"drain {n:,}, concurrency {consumers}"
        if consumers == 16:
            rate_row(table, name, figures, vs_peer=1.5, vs_pgbench=0.5)
        else:
            rate_row(table, name, figures)

    pgbouncer_row(bench, table)

    # -- wake latency ----------------------------------------------------------
    warmup = 5
    lat: dict[str, list[float] | None] = {
        "alkstore": bench.measure("alkstore", lambda: in_child(alk_wake, alk_url, s.wake, warmup))
    }
    for peer, wake in (("PgQueuer", pgq_wake), ("procrastinate", proc_wake)):
        lat[peer] = bench.measure(
            peer, lambda w=wake, p=peer: in_child(w, bench.urls[p], s.wake, warmup), reset=True
        )
    for q, limit in ((50, 1.5), (99, 3.0)):
        figs = {k: percentile(v, q) for k, v in lat.items() if v}
        alk = figs.get("alkstore")
        verdict = "?" if alk is None else ("ok" if alk < limit else "MISS")
        table.add(Row(f"wake latency p{q}, commit to claim", "ms", figs, f"< {limit} ms", verdict))

    # -- claim cost with a backlog: the median of `repeat` rounds per size, in
    # which alkstore and pgbench take turns, each from a settled table ----------
    bench.reset("alkstore")
    cost: dict[int, dict[str, float]] = {}
    queued = 0
    for waiting in (s.small, s.big):
        # A round takes claims + 1 jobs (alkstore) and claims (pgbench):
        # `waiting` stay queued.
        want = waiting + s.repeat * (2 * s.claims + 1)
        alk_fill(alk_url, "backlog", want - queued, 20_000)
        rounds: dict[str, list[float]] = {"alkstore": [], "pgbench": []}
        for _ in range(s.repeat):
            settle(alk_url)
            got = bench.measure(
                "alkstore", lambda: in_child(alk_claim_cost, alk_url, "backlog", s.claims)
            )
            rounds["alkstore"].append(got)
            settle(alk_url)
            got = bench.measure(
                "pgbench",
                lambda w=waiting: (
                    1000 / pgb.tps(f"claim_one_{w}", claim_script("backlog", 1), 1, s.claims)
                ),
            )
            if got is not None:
                rounds["pgbench"].append(got)
        queued = waiting
        cost[waiting] = {k: statistics.median(v) for k, v in rounds.items() if v}
        table.add(Row(f"claim_one + ack, {waiting:,} waiting", "ms/job", cost[waiting]))
    ratio = {
        k: cost[s.big][k] / cost[s.small][k]
        for k in ("pgbench", "alkstore")
        if k in cost[s.big] and k in cost[s.small]
    }
    alk_ratio = ratio.get("alkstore")
    table.add(
        Row(
            f"claim cost at {s.big:,} / at {s.small:,} waiting",
            "ratio",
            ratio,
            "<= 1.2",
            "?" if alk_ratio is None else ("ok" if alk_ratio <= 1.2 else "MISS"),
        )
    )

    # -- claim cost with the xmin horizon pinned: on a throwaway cluster of
    # its own (bench/_horizon.py), never on this server ------------------------
    for row in horizon_rows(quick=s is QUICK, notes=bench.notes):
        table.add(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    add_url_option(
        parser, "a database to administer from; the role must be able to CREATE DATABASE"
    )
    args = parser.parse_args()
    began = time.perf_counter()
    server = Server(args.url)
    tmp = Path(tempfile.mkdtemp(prefix="alkstore-bench-pg-"))
    systems = ["pgbench", "alkstore", "alkstore/pgbench", *PEERS, "alkstore/best peer"]
    try:
        bench = Bench(server, QUICK if args.quick else FULL, tmp)
        versions = ", ".join(
            [f"pgbench {bench.pgbench.version}" if bench.pgbench.version else "no pgbench"]
            + [f"{k} {v}" for k, v in bench.versions.items()]
        )
        table = Table(
            f"PostgreSQL {server.version} ({server.settings}), {os.cpu_count()} cores,"
            f" Python {sys.version.split()[0]}; {versions}",
            systems,
        )
        run(bench, table)
        table.add(pool_wait_row(bench.urls["alkstore"], quick=args.quick))
        table.add(restart_recovery_row(quick=args.quick))
        bench.note_missing()
    finally:
        server.drop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    print(table.render())
    for note in bench.notes:
        print(note)
    print(f"\n(run took {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
