"""Failover (issue 13, item 2): a primary and a hot standby made with
``pg_basebackup -R``, both throwaway clusters of the test's own, and a
multi-host libpq URL naming both with ``target_session_attrs=read-write``.
The primary is stopped (``-m immediate``: it crashes, nothing is shipped at
shutdown), the standby promoted (``pg_ctl promote``), and the store follows
to the new primary.

What must hold (docs/deployment.md "Restarts and failover"):

* with synchronous replication (``synchronous_standby_names`` on the
  primary, ``synchronous_commit = on``), every job acknowledged as enqueued
  is on the standby, so a failover loses none; workers and the store's own
  operations work again within :data:`RECOVERY_BOUND_S` of the promotion;
* with asynchronous replication, what the standby had replayed is there,
  and what it had not received is lost, acknowledged or not: the trade-off
  the deployment guide states;
* a standby is never written to: ``target_session_attrs=read-write`` skips
  it, and a store whose URL reaches only a standby gets the server's
  ``ReadOnlySqlTransaction`` (SQLSTATE 25006) as a non-permanent
  ``EngineError``, so a worker retries until the standby is promoted.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from postgres_server import Cluster, fresh_schema_name, throwaway_cluster, throwaway_standby
from postgres_workers import QUEUE, AppProcess, counts_of, not_recorded, runs_of, write_app

import alkstore
from alkstore import QueueOpts
from alkstore.errors import EngineError

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

#: Seconds from the promotion until workers and operations work again.
RECOVERY_BOUND_S = 5.0
#: How long a test waits for anything else, seconds.
WAIT_S = 20.0
QUERY_TIMEOUT_S = 2.0
VISIBILITY_TIMEOUT_S = 5.0
#: Longer than the test: a job enqueued while every worker is idle runs
#: within the test only through its wake.
POLL_INTERVAL_S = 120.0


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll ``predicate`` until it returns something true (an error of the
    engine or the driver counts as not yet); return that, or fail after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(EngineError, psycopg.OperationalError):
            found = predicate()
            if found:
                return found
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)


def one(url: str, query: str) -> Any:
    """The first column of the first row of ``query``, on a new connection."""
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
        row = conn.execute(query).fetchone()  # type: ignore[arg-type]
        assert row is not None
        return row[0]


def both(first: Cluster, second: Cluster) -> str:
    """The multi-host URL naming ``first`` then ``second``, for writing."""
    hosts = f"127.0.0.1:{first.port},127.0.0.1:{second.port}"
    return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"


def replicating(primary: Cluster, state: str) -> bool:
    """Whether the standby streams from ``primary`` with ``sync_state``
    ``state`` (``sync`` or ``async``)."""
    return bool(
        one(
            primary.url(),
            "SELECT count(*) FROM pg_stat_replication"
            f" WHERE state = 'streaming' AND sync_state = '{state}'",
        )
    )


@contextlib.contextmanager
def replicated(synchronous: bool) -> Iterator[tuple[Cluster, Cluster]]:
    """A primary and its hot standby, streaming; with ``synchronous``, a
    commit on the primary waits until the standby has flushed it
    (``synchronous_standby_names = '*'``, ``synchronous_commit = on``)."""
    settings = {"synchronous_standby_names": "'*'"} if synchronous else {}
    with contextlib.ExitStack() as stack:
        primary = throwaway_cluster(stack, settings=settings)
        standby = throwaway_standby(primary, stack)
        wait_until(
            lambda: replicating(primary, "sync" if synchronous else "async"),
            "the standby to stream",
        )
        yield primary, standby


def replayed(primary: Cluster, standby: Cluster) -> None:
    """Wait until the standby has replayed everything ``primary`` wrote so far."""
    lsn = one(primary.url(), "SELECT pg_current_wal_lsn()")
    wait_until(
        lambda: one(standby.url(), f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
        "the standby to replay the primary's WAL",
    )


class Enqueuer:
    """Enqueues ``work(i)`` jobs one at a time on a thread, about a hundred a
    second, until stopped; records each ``i`` whose enqueue returned an id
    (acknowledged to the caller) with when, and counts the enqueues that
    raised (not acknowledged: they may or may not have committed)."""

    def __init__(self, queue: alkstore.Queue, first: int) -> None:
        self._queue = queue
        self._next = first
        self.acked: dict[int, tuple[int, float]] = {}
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01) and len(self.acked) < 5000:
            i = self._next
            try:
                job_id = self._queue.enqueue({"task": "work", "args": [i]})
            except EngineError:
                self.failed += 1
            else:
                self.acked[i] = (job_id, time.monotonic())
            self._next += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive()


def worker_args() -> list[str]:
    return ["worker", "jobs:app", "-q", QUEUE, "-c", "4", "--poll-interval", str(POLL_INTERVAL_S)]


def test_the_store_and_workers_follow_a_failover_and_lose_no_acknowledged_job(
    tmp_path: Path,
) -> None:
    with replicated(synchronous=True) as (primary, standby):
        url, schema = both(primary, standby), fresh_schema_name()
        env = write_app(
            tmp_path,
            url=url,
            schema=schema,
            query_timeout_s=QUERY_TIMEOUT_S,
            visibility_timeout_s=VISIBILITY_TIMEOUT_S,
        )
        with contextlib.ExitStack() as stack:
            store = stack.enter_context(
                alkstore.open(url, schema=schema, query_timeout_s=QUERY_TIMEOUT_S)
            )
            q = store.queue(QUEUE, QueueOpts(visibility_timeout_s=VISIBILITY_TIMEOUT_S))
            before = q.enqueue_many([{"task": "work", "args": [i]} for i in range(200)])
            workers = [
                stack.enter_context(AppProcess(tmp_path, env, *worker_args())) for _ in range(2)
            ]
            enqueuer = Enqueuer(q, first=1000)
            wait_until(lambda: len(runs_of(tmp_path)) >= 40, "jobs to run before the failover")
            wait_until(lambda: len(enqueuer.acked) >= 20, "enqueues before the failover")
            primary.stop("immediate")
            stopped = time.monotonic()
            promoted = standby.promote()
            first_run = wait_until(
                lambda: [run for run in runs_of(tmp_path) if run.started > promoted],
                "a job to run on the new primary",
            )[0]
            first_enqueue = wait_until(
                lambda: [at for _, at in enqueuer.acked.values() if at > promoted],
                "an enqueue on the new primary",
            )
            enqueuer.stop()
            acked = dict(enqueuer.acked)
            expected = set(range(200)) | set(acked)
            wait_until(
                lambda: expected <= set(counts_of(tmp_path)), "every acknowledged job to run"
            )
            wait_until(lambda: q.stats() == (0, 0, 0, 0), "every job to be acked")
            # The LISTEN connections followed too: idle workers run these
            # only through their wakes.
            enqueued = time.monotonic()
            later = q.enqueue_many([{"task": "work", "args": [i]} for i in range(5000, 5004)])
            wait_until(
                lambda: set(range(5000, 5004)) <= set(counts_of(tmp_path)),
                "the wakes after the failover",
            )
            woken_s = max(run.started for run in runs_of(tmp_path) if run.i >= 5000) - enqueued
            assert one(url, "SELECT inet_server_port()") == standby.port
            for worker in workers:
                assert worker.stop(WAIT_S) == 0, worker.log
            logs = "".join(worker.log for worker in workers)
    ids = dict(enumerate(before)) | {i: job_id for i, (job_id, _) in acked.items()}
    ids |= dict(zip(range(5000, 5004), later, strict=True))
    counts = counts_of(tmp_path)
    twice = {ids[i] for i, n in counts.items() if n > 1 and i in ids}
    lost = not_recorded(logs)
    resumed_s = first_run.started - promoted
    enqueue_s = min(first_enqueue) - promoted
    print(
        f"\nfailover: promoted {promoted - stopped:.3f} s after the primary stopped; workers "
        f"ran jobs again {resumed_s:.3f} s and the store enqueued {enqueue_s:.3f} s after the "
        f"promotion; a wake ran a job {woken_s:.3f} s after its enqueue; {len(acked)} "
        f"enqueues acknowledged, {enqueuer.failed} failed; {sum(counts.values())} runs, "
        f"{len(twice)} twice ({len(lost)} logged lost)"
    )
    assert resumed_s < RECOVERY_BOUND_S
    assert enqueue_s < RECOVERY_BOUND_S
    assert twice <= lost, (twice, lost)


def test_an_async_failover_loses_what_the_standby_had_not_received() -> None:
    with replicated(synchronous=False) as (primary, standby):
        url, schema = both(primary, standby), fresh_schema_name()
        with alkstore.open(url, schema=schema, query_timeout_s=QUERY_TIMEOUT_S) as store:
            q = store.queue("jobs")
            replicated_ids = q.enqueue_many(list(range(50)))
            replayed(primary, standby)
            # The standby falls behind (here: it is down); the primary
            # acknowledges commits without it.
            standby.stop("fast")
            unreplicated_ids = [q.enqueue(i) for i in range(5)]
            primary.stop("immediate")
            standby.start()
            promoted = standby.promote()
            wait_until(lambda: q.stats() is not None, "the store to reach the new primary")
            reached_s = time.monotonic() - promoted
            assert all(q.get_job(job_id) is not None for job_id in replicated_ids)
            assert [q.get_job(job_id) for job_id in unreplicated_ids] == [None] * 5
    print(f"\nasync failover: the store reached the new primary {reached_s:.3f} s after it")
    assert reached_s < RECOVERY_BOUND_S


def test_with_synchronous_replication_an_enqueue_is_acknowledged_only_once_on_the_standby() -> None:
    with replicated(synchronous=True) as (primary, standby):
        url, schema = both(primary, standby), fresh_schema_name()
        with alkstore.open(url, schema=schema, query_timeout_s=1) as store:
            q = store.queue("jobs")
            q.enqueue(0)
            standby.stop("fast")
            # The commit waits for a standby that is not there: the call
            # ends at query_timeout_s, unacknowledged, and retryable.
            started = time.monotonic()
            with pytest.raises(EngineError, match=r"query_timeout_s \(1 s\)") as caught:
                q.enqueue(1)
            waited_s = time.monotonic() - started
            assert not caught.value.permanent
            standby.start()
            wait_until(lambda: replicating(primary, "sync"), "the standby to stream again")
            job_id = wait_until(lambda: q.enqueue(2), "an enqueue with the standby back")
            assert q.get_job(job_id) is not None
    print(f"\nwith the synchronous standby down an enqueue failed after {waited_s:.3f} s")
    assert 1 <= waited_s < 1 + 3


def test_a_standby_is_never_written_to(tmp_path: Path) -> None:
    with replicated(synchronous=False) as (primary, standby):
        schema = fresh_schema_name()
        # The standby first: target_session_attrs=read-write passes it over.
        url = both(standby, primary)
        with alkstore.open(url, schema=schema, pool_min_size=3) as store:
            q = store.queue("jobs")
            q.enqueue(1)
            with contextlib.ExitStack() as held:
                conns = [held.enter_context(store._db.connection()) for _ in range(3)]
                seen = {
                    conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone()
                    for conn in conns
                }
            assert seen == {(primary.port, False)}
            store.listen("jobs")
            assert store._listener.call(
                lambda conn: conn.execute("SELECT inet_server_port()").fetchone()
            ) == (primary.port,)
        replayed(primary, standby)
        # A URL that reaches only the standby: every write is refused by
        # the server, as retryable.
        with alkstore.open(standby.url(), schema=schema) as on_standby:
            q = on_standby.queue("jobs")
            assert q.stats() == (1, 0, 0, 0)  # reads work
            writes: dict[str, Callable[[], object]] = {
                "enqueue": lambda: q.enqueue(2),
                "claim_batch": lambda: q.claim_batch("w", 1),
                "pause": q.pause,
                "schedule": lambda: on_standby.schedule("s", "@every 1s", "jobs", 1),
            }
            for name, write in writes.items():
                with pytest.raises(EngineError) as caught:
                    write()
                assert not caught.value.permanent, name
                cause = caught.value.__cause__
                assert isinstance(cause, psycopg.errors.ReadOnlySqlTransaction), (name, cause)
                assert cause.sqlstate == "25006"


class _ListenFailures(logging.Handler):
    """When each failure of the LISTEN connection was logged (monotonic)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.at: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("the LISTEN connection failed"):
            self.at.append(time.monotonic())


def test_the_listener_backs_off_on_a_standby_that_refuses_listen() -> None:
    # A hot standby accepts the connection and refuses LISTEN: the listener
    # retried at once, forever (300 connections a second), until the
    # pause between reconnections grew across such failures.
    failures = _ListenFailures()
    logger = logging.getLogger("alkstore.postgres")
    logger.addHandler(failures)
    try:
        with replicated(synchronous=False) as (primary, standby):
            schema = fresh_schema_name()
            alkstore.open(primary.url(), schema=schema).close()
            replayed(primary, standby)
            with alkstore.open(standby.url(), schema=schema) as store:
                store.listen("jobs")
                wait_until(lambda: len(failures.at) >= 7, "seven LISTEN failures")
    finally:
        logger.removeHandler(failures)
    gaps = [later - earlier for earlier, later in zip(failures.at, failures.at[1:7], strict=False)]
    print(f"\nthe pauses between LISTEN failures on a standby (s): {gaps}")
    # The pauses double from 0.05 s: 0.2, 0.4 and 0.8 s before the last
    # three (the subscription's own poke may cut an earlier one short).
    assert failures.at[6] - failures.at[3] >= 1.2


def test_a_worker_on_a_standby_retries_until_it_is_promoted(tmp_path: Path) -> None:
    with replicated(synchronous=False) as (primary, standby):
        schema = fresh_schema_name()
        with alkstore.open(primary.url(), schema=schema) as store:
            q = store.queue(QUEUE, QueueOpts(visibility_timeout_s=VISIBILITY_TIMEOUT_S))
            q.enqueue_many([{"task": "work", "args": [i]} for i in range(20)])
        replayed(primary, standby)
        env = write_app(
            tmp_path,
            url=standby.url(),
            schema=schema,
            query_timeout_s=QUERY_TIMEOUT_S,
            visibility_timeout_s=VISIBILITY_TIMEOUT_S,
        )
        args = ["worker", "jobs:app", "-q", QUEUE, "-c", "2"]
        with AppProcess(tmp_path, env, *args) as worker:
            # Its claims fail on the standby, round after round, and it
            # keeps trying.
            worker.wait_for_lines("claiming from queue 'drain' failed; retrying", 2, WAIT_S)
            assert worker.process.poll() is None, worker.log
            assert not runs_of(tmp_path)
            primary.stop("fast")
            promoted = standby.promote()
            wait_until(lambda: set(counts_of(tmp_path)) == set(range(20)), "every job to run")
            resumed_s = min(run.started for run in runs_of(tmp_path)) - promoted
            assert worker.stop(WAIT_S) == 0, worker.log
        assert "ReadOnlySqlTransaction" in worker.log
    print(f"\na worker on the standby ran jobs {resumed_s:.3f} s after its promotion")
    assert resumed_s < RECOVERY_BOUND_S
