"""Time: the server's clock (tracked through an offset), the injected clock
never mixed with it within one store, and results independent of the
session's TimeZone and DateStyle (docs/contract.md §3 "Time")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from alkstore import QueueOpts
from alkstore_contract_tests import T0, ManualClock
from alkstore_postgres import PostgresStore
from alkstore_postgres._clock import RESAMPLE_AFTER_S, ServerClock

pytestmark = pytest.mark.postgres

# A quarter-hour offset, a half-hour negative offset with DST, and a zone
# whose historical offsets have seconds: none may change a result.
ZONES = ["Pacific/Chatham", "America/St_Johns", "Africa/Monrovia"]


def with_options(url: str, options: str) -> str:
    """``url`` with the libpq ``options`` parameter set."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options={quote(options, safe='')}"


def server_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT clock_timestamp()", binary=True).fetchone()
    assert row is not None
    instant: datetime = row[0]
    return instant.astimezone(UTC)


def test_the_server_clock_is_the_default(
    open_pg: Callable[..., PostgresStore], admin: psycopg.Connection[Any]
) -> None:
    store = open_pg(clock=None)
    tolerance = timedelta(milliseconds=200)  # far above a local round trip
    before = server_now(admin)
    now = store._now()
    job_id = store.queue("jobs").enqueue(1)
    after = server_now(admin)
    assert before - tolerance <= now <= after + tolerance
    job = store.queue("jobs").get_job(job_id)
    assert job is not None
    assert before - tolerance <= job.enqueued_at <= after + tolerance
    assert job.run_at == job.enqueued_at
    handle = store.queue("jobs").claim_one("w")
    assert handle is not None
    deadline = handle.claim_deadline - timedelta(seconds=30)
    assert before - tolerance <= deadline <= server_now(admin) + tolerance


def test_server_clock_offset_and_resampling() -> None:
    mono = [1000.0]
    samples: list[float] = []
    server_base = datetime(2026, 1, 1, tzinfo=UTC)

    def sample() -> tuple[datetime, float]:
        samples.append(mono[0])
        # The server runs 5 s ahead of what the local clock would say.
        return server_base + timedelta(seconds=mono[0] - 1000.0 + 5), mono[0]

    clock = ServerClock(sample, monotonic=lambda: mono[0])
    assert clock.now() == server_base + timedelta(seconds=5)
    mono[0] += 12.5
    assert clock.now() == server_base + timedelta(seconds=17.5)
    assert len(samples) == 1  # no round trip per reading
    mono[0] += RESAMPLE_AFTER_S
    clock.now()
    assert len(samples) == 2  # re-sampled once the sample is a minute old


def test_of_samples_taken_at_once_the_first_to_arrive_is_kept() -> None:
    """Operations holding connections each sample a due clock on their own;
    the first sample to arrive serves the next minute. A later one (which
    waited longer after its round trip, so estimates lower) would make the
    time read in one thread go back."""
    mono = [1000.0]
    server_base = datetime(2026, 1, 1, tzinfo=UTC)
    clock = ServerClock(lambda: (server_base, mono[0]), monotonic=lambda: mono[0])
    clock.now()
    mono[0] += RESAMPLE_AFTER_S  # due: every holder samples
    first = clock.set_sample(server_base + timedelta(seconds=60.010), mono[0])
    later = clock.set_sample(server_base + timedelta(seconds=60), mono[0])
    assert later == first == server_base + timedelta(seconds=60.010)
    mono[0] += 1.0
    assert clock.now() == first + timedelta(seconds=1)


def test_injected_and_server_clocks_are_never_mixed(
    open_pg: Callable[..., PostgresStore], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    clocked = open_pg()  # at T0 = 2030-01-01, years after the server's now
    on_server = open_pg(clock=None)

    def no_server_time() -> datetime:
        raise AssertionError("a store with an injected clock read the server's clock")

    monkeypatch.setattr(clocked._server_clock, "now", no_server_time)
    q_clocked, q_server = clocked.queue("jobs"), on_server.queue("jobs")

    # Enqueued at T0 by the clock: due at 2030, so the server (today) must
    # not see it as due; every instant on the row is the clock's.
    future = q_clocked.enqueue("from 2030")
    assert q_server.claim_one("server") is None
    assert q_server.stats() == (0, 1, 0, 0)  # scheduled, from the server's point of view
    assert q_clocked.stats() == (1, 0, 0, 0)

    # Enqueued by the server (today): due for the clocked store at 2030, and
    # its claim deadline comes from the clock, not from the server.
    today = q_server.enqueue("from today", priority=1)
    handle = q_clocked.claim_one("clocked")
    assert handle is not None
    assert handle.id == today
    assert handle.claim_deadline == T0 + timedelta(seconds=30)
    assert handle.heartbeat(10)
    job = q_clocked.get_job(today)
    assert job is not None
    assert job.claim_deadline == T0 + timedelta(seconds=10)
    # For the server the claim runs until 2030: a lapse is never seen early.
    assert q_server.claim_one("server") is None
    assert handle.retry("again", delay=5)
    job = q_clocked.get_job(today)
    assert job is not None
    assert job.run_at == T0 + timedelta(seconds=5)

    second = q_clocked.claim_one("clocked")
    assert second is not None
    assert second.id == future
    assert second.enqueued_at == T0
    assert second.fail("done")
    dead = q_clocked.get_job(future)
    assert dead is not None
    assert dead.died_at == T0
    clock.advance(60)
    assert q_clocked.sweep_expired() == (0, 0)


@pytest.mark.parametrize("zone", ZONES)
def test_results_do_not_depend_on_the_session_time_zone(
    postgres_url: str, open_pg: Callable[..., PostgresStore], clock: ManualClock, zone: str
) -> None:
    odd = open_pg(with_options(postgres_url, f"-c TimeZone={zone} -c DateStyle=SQL,DMY"))
    utc = open_pg(with_options(postgres_url, "-c TimeZone=UTC"))
    q_odd = odd.queue("tz", QueueOpts(visibility_timeout_s=90, expires_s=3600))
    q_utc = utc.queue("tz")
    local = timezone(timedelta(hours=-9, minutes=-30))
    run_at = datetime(2029, 12, 31, 15, 0, 0, 123456, tzinfo=local)  # T0 + 30 min
    job_id = q_odd.enqueue({"z": zone}, run_at=run_at)
    app_url = with_options(postgres_url, f"-c TimeZone={zone}")
    with psycopg.connect(app_url) as app, app.transaction():
        tx_id = q_odd.enqueue_tx(app, {"tx": zone}, delay=1850)  # due after job_id

    for q in (q_odd, q_utc):
        for one in (job_id, tx_id):
            job = q.get_job(one)
            assert job is not None
            for instant in (job.run_at, job.enqueued_at, job.expires_at):
                assert instant is not None
                assert instant.tzinfo is UTC
        job = q.get_job(job_id)
        assert job is not None
        assert job.run_at == run_at
        assert job.run_at == T0 + timedelta(minutes=30, microseconds=123456)
        assert job.expires_at == T0 + timedelta(hours=1)
    assert q_odd.get_job(job_id) == q_utc.get_job(job_id)

    assert q_odd.claim_one("w") is None  # not due before T0 + 30 min
    clock.advance(timedelta(minutes=30, microseconds=123456))
    handle = q_utc.claim_one("w")
    assert handle is not None
    assert handle.id == job_id
    assert handle.claim_deadline == clock() + timedelta(seconds=90)
    clock.advance(89.999999)
    assert q_odd.claim_batch("w", 5)[0].id == tx_id  # job_id's claim has not lapsed
    clock.advance(0.000001)
    again = q_odd.claim_one("w")  # now it has: now >= claim_deadline
    assert again is not None
    assert (again.id, again.attempts) == (job_id, 2)


def test_server_time_in_any_session_time_zone(
    postgres_url: str, open_pg: Callable[..., PostgresStore], admin: psycopg.Connection[Any]
) -> None:
    store = open_pg(with_options(postgres_url, "-c TimeZone=Pacific/Chatham"), clock=None)
    now = store._now()
    assert now.tzinfo is UTC
    assert abs(now - server_now(admin)) < timedelta(milliseconds=200)


def test_an_operation_holding_the_only_connection_never_waits_for_a_resample(
    open_pg: Callable[..., PostgresStore],
) -> None:
    """A re-sample of the server's clock borrows a pooled connection under
    the clock's lock; an operation that holds a connection samples on it
    without that lock. With a pool of one, a claim holding the connection
    while another call waits for it under the lock goes on, and then the
    waiting call gets the connection: neither waits out ``pool_timeout_s``."""
    store = open_pg(clock=None, pool_max_size=1, pool_timeout_s=10.0)
    lock = store._server_clock._lock
    outcome: list[object] = []
    store._server_clock._base = None  # as when the sample is a minute old
    with store._db.connection() as conn:
        waiter = threading.Thread(target=lambda: outcome.append(_now_or_error(store)))
        waiter.start()
        deadline = time.monotonic() + 10.0
        while not lock.locked():  # the waiter took the lock, and waits for `conn`
            assert time.monotonic() < deadline, "the waiter never took the clock's lock"
            time.sleep(0.001)
        held = store._now_on(conn)
        # The waiter still waits for `conn`: no pool timeout passed.
        assert lock.locked()
        assert waiter.is_alive()
    waiter.join(30.0)
    assert not waiter.is_alive()
    [now] = outcome
    assert isinstance(now, datetime), now
    assert held <= now < held + timedelta(seconds=5)


def _now_or_error(store: PostgresStore) -> object:
    try:
        return store._now()
    except Exception as error:
        return error
