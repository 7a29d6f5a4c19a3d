"""Wakes through LISTEN/NOTIFY: the wake-driven claim loop end to end, the
listener dying (regression case 004), big jobs and NOTIFY's payload limit
(regression case 005), channel names, and transactional wakes."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from alkstore import Queue, Subscription
from alkstore.errors import StoreClosedError
from alkstore_postgres import MAX_CHANNEL_BYTES, PostgresStore, channel_name

pytestmark = pytest.mark.postgres


class Consumer:
    """The default consumption path: claim until empty, then wait on the
    subscription (re-polling every ``repoll_s`` at most); records when each
    job was taken."""

    def __init__(self, queue: Queue, subscription: Subscription, repoll_s: float) -> None:
        self.taken: dict[int, float] = {}
        self.doubles: list[int] = []
        self.errors: list[BaseException] = []
        self._queue = queue
        self._sub = subscription
        self._repoll_s = repoll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._taken_cond = threading.Condition()

    def __enter__(self) -> Consumer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sub.close()  # releases a blocked wait
        self._thread.join(10)
        assert not self._thread.is_alive()
        assert not self.errors, self.errors

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                handle = self._queue.claim_one("consumer")
                if handle is not None:
                    with self._taken_cond:
                        if handle.id in self.taken:
                            self.doubles.append(handle.id)
                        self.taken[handle.id] = time.monotonic()
                        self._taken_cond.notify_all()
                    handle.ack()
                    continue
                if self._stop.is_set():
                    return
                self._sub.wait(self._repoll_s)
        except StoreClosedError:
            if not self._stop.is_set():
                raise
        except BaseException as error:
            self.errors.append(error)

    def wait_taken(self, job_id: int, timeout_s: float) -> float:
        """Wait until ``job_id`` is taken; return when (monotonic seconds)."""
        with self._taken_cond:
            assert self._taken_cond.wait_for(lambda: job_id in self.taken, timeout_s), (
                f"job {job_id} not taken within {timeout_s} s"
            )
            return self.taken[job_id]


@pytest.fixture
def server_store(open_pg: Callable[..., PostgresStore]) -> PostgresStore:
    """A store on the server's clock (real-time tests)."""
    return open_pg(clock=None)


def listener_pid(store: PostgresStore) -> int:
    pid: int = store._listener.call(lambda conn: conn.info.backend_pid)
    return pid


def listening_channels(store: PostgresStore) -> set[str]:
    rows = store._listener.call(
        lambda conn: conn.execute("SELECT pg_listening_channels()").fetchall()
    )
    return {row[0] for row in rows}


def test_wake_driven_claim_loop_across_connections(
    open_pg: Callable[..., PostgresStore],
) -> None:
    producer = open_pg(clock=None).queue("loop")
    consumer_store = open_pg(clock=None)
    latencies = []
    with Consumer(consumer_store.queue("loop"), consumer_store.listen("loop"), 30) as consumer:
        for i in range(30):
            start = time.monotonic()
            job_id = producer.enqueue({"i": i})  # commit -> NOTIFY -> wake -> claim
            latencies.append(consumer.wait_taken(job_id, 5) - start)
    assert not consumer.doubles
    # Loose bounds: the benchmark measures the real figures.
    assert max(latencies) < 1.0, latencies
    assert statistics.median(latencies) < 0.2, latencies


def test_case_004_listener_dies(
    server_store: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    q = server_store.queue("jobs")
    sub = server_store.listen("jobs")
    channel = channel_name(server_store.schema, "jobs")
    with Consumer(q, sub, repoll_s=30) as consumer:
        start = time.monotonic()
        j1 = q.enqueue("J1")
        assert consumer.wait_taken(j1, 1) - start < 1

        old_pid = listener_pid(server_store)
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' AND pid = %s",
            [old_pid],
        ).fetchall()
        assert rows == [(old_pid,)]  # found by its LISTEN
        admin.execute("SELECT pg_terminate_backend(%s)", [old_pid])

        time.sleep(0.5)
        start = time.monotonic()
        j2 = q.enqueue("J2")
        assert consumer.wait_taken(j2, 5) - start < 5  # far under the 30 s re-poll

        time.sleep(5)
        start = time.monotonic()
        j3 = q.enqueue("J3")
        assert consumer.wait_taken(j3, 1) - start < 1  # the LISTEN is live again
        new_pid = listener_pid(server_store)
        assert new_pid != old_pid
        assert channel in listening_channels(server_store)
    assert not consumer.doubles
    assert set(consumer.taken) == {j1, j2, j3}
    assert q.stats() == (0, 0, 0, 0)


def test_case_005_big_jobs_and_the_notify_limit(postgres_url: str, store: PostgresStore) -> None:
    q = store.queue("big")
    small, big = {"blob": "x" * 10_000}, {"blob": "é" * 600_000}
    with psycopg.connect(postgres_url, autocommit=True) as side:
        side.execute(sql.SQL("LISTEN {}").format(sql.Identifier(q.channel)))  # type: ignore[attr-defined]
        ids = [q.enqueue(small), q.enqueue(big)]
        with psycopg.connect(postgres_url) as app, app.transaction():
            ids.append(q.enqueue_tx(app, small))
        received = list(side.notifies(timeout=5, stop_after=3))
    assert len(received) == 3
    assert all(n.channel == q.channel for n in received)  # type: ignore[attr-defined]
    assert all(len(n.payload.encode()) < 8000 for n in received)
    handles = q.claim_batch("w", 3)
    assert [h.id for h in handles] == ids
    assert [h.payload for h in handles] == [small, big, small]
    assert handles[1].payload_bytes.decode() == '{"blob":"' + "é" * 600_000 + '"}'


def test_enqueue_tx_wakes_on_commit_only(postgres_url: str, store: PostgresStore) -> None:
    q = store.queue("tx")
    sub = store.listen("tx")
    with psycopg.connect(postgres_url) as app:
        with app.transaction():
            q.enqueue_tx(app, 1)
            assert not sub.wait(0.3)  # not before commit
        assert sub.wait(5)
        app.execute("SELECT 1")  # psycopg opens the transaction implicitly
        q.enqueue_tx(app, 2)
        app.rollback()
    assert not sub.wait(0.5)  # a rollback wakes nobody
    assert q.stats().pending == 1


def test_wakes_are_level_triggered_and_shared(store: PostgresStore) -> None:
    q = store.queue("lvl")
    a, b = store.listen("lvl"), store.listen("lvl")
    assert not a.wait(0)
    q.enqueue(1)
    q.enqueue_many([2, 3])
    assert a.wait(5)
    assert not a.wait(0)  # one True consumed every pending wake
    assert b.wait(5)
    a.close()  # b's LISTEN stays: the channel is shared
    q.enqueue(4)
    assert b.wait(5)
    assert listening_channels(store) == {q.channel}  # type: ignore[attr-defined]
    b.close()
    deadline = time.monotonic() + 5
    while listening_channels(store) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert listening_channels(store) == set()


def test_closing_releases_waiters(store: PostgresStore) -> None:
    sub = store.listen("close")
    results: list[object] = []

    def waiter() -> None:
        try:
            results.append(sub.wait(60))
        except StoreClosedError as error:
            results.append(error)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.2)
    start = time.monotonic()
    store.close()
    thread.join(10)
    assert time.monotonic() - start < 5
    assert (results and results[0] in (True, False)) or isinstance(results[0], StoreClosedError)
    with pytest.raises(StoreClosedError):
        sub.wait(0)
    sub.close()  # idempotent, never raises


@pytest.fixture
def two_long_queues(store: PostgresStore) -> tuple[Queue, Queue]:
    """Two queues whose names share their first 63 characters."""
    shared = "q" * 63
    return store.queue(shared + "a" * 65), store.queue(shared + "b" * 65)


def test_channel_names() -> None:
    longest = "Q" * 128
    for schema in ("alkstore", "s" * 63):
        channel = channel_name(schema, longest)
        assert len(channel.encode()) <= MAX_CHANNEL_BYTES
        assert channel.startswith(schema[:40])
    shared = "q" * 63
    names = [shared, shared + "a", shared + "b", shared + "a" * 65, shared + "b" * 65, "Foo", "foo"]
    channels = {channel_name("alkstore", n) for n in names}
    assert len(channels) == len(names)  # distinct, even past 63 characters and by case
    assert channel_name("one", "jobs") != channel_name("two", "jobs")
    assert channel_name("alkstore", "jobs") == channel_name("alkstore", "jobs")


def test_long_names_wake_only_their_own_queue(
    store: PostgresStore, two_long_queues: tuple[Queue, Queue]
) -> None:
    qa, qb = two_long_queues
    sa, sb = store.listen(qa.name), store.listen(qb.name)
    job = qa.enqueue({"to": "a"})
    assert sa.wait(5)
    assert not sb.wait(0.3)
    assert qb.claim_one("w") is None
    handle = qa.claim_one("w")
    assert handle is not None
    assert handle.id == job
    qb.enqueue({"to": "b"})
    assert sb.wait(5)
    assert not sa.wait(0.3)


@pytest.mark.parametrize("name", ["image-worker-queue", "Foo", "q" * 63, "q" * 128, "a.b:c-d_e"])
def test_every_legal_name_gets_its_wake(store: PostgresStore, name: str) -> None:
    q = store.queue(name)
    sub = store.listen(name)
    job = q.enqueue({"name": name})
    assert sub.wait(1)
    handle = q.claim_one("w")
    assert handle is not None
    assert (handle.id, handle.payload) == (job, {"name": name})
    assert handle.ack()


def test_a_reconnection_wakes_every_subscription_once(
    server_store: PostgresStore, admin: psycopg.Connection[Any]
) -> None:
    a, b = server_store.listen("a"), server_store.listen("b")
    assert not a.wait(0)
    assert not b.wait(0)
    old_pid = listener_pid(server_store)
    admin.execute("SELECT pg_terminate_backend(%s)", [old_pid])
    # Wakes may have been lost while the connection was down: every
    # subscriber is woken once, with no enqueue at all.
    assert a.wait(5)
    assert b.wait(5)
    assert not a.wait(0.2)
    assert listener_pid(server_store) != old_pid
    assert listening_channels(server_store) == {
        channel_name(server_store.schema, "a"),
        channel_name(server_store.schema, "b"),
    }


def test_the_idle_listener_is_pinged(
    open_pg: Callable[..., PostgresStore], admin: psycopg.Connection[Any]
) -> None:
    store = open_pg(repoll_interval_s=0.05)
    sub = store.listen("jobs")
    pid = listener_pid(store)
    time.sleep(0.3)  # a few idle pings
    row = admin.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    assert row is not None
    assert row[0].startswith("LISTEN")  # the ping repeats a LISTEN
    store.queue("jobs").enqueue(1)
    assert sub.wait(5)
    assert listener_pid(store) == pid  # the pings did not disturb the connection


def test_a_close_while_another_thread_closes_returns_once_the_store_is_closed(
    open_pg: Callable[..., PostgresStore],
) -> None:
    """``close()`` is idempotent: a second call while the first is still
    stopping the listener returns once the first has closed the pool."""
    for _ in range(3):
        store = open_pg()
        store.listen("close")
        first = threading.Thread(target=store.close)
        first.start()
        deadline = time.monotonic() + 10
        while not store.closed:  # the first close() has begun
            assert time.monotonic() < deadline
        store.close()
        assert store._db._pool.closed
        first.join(10)
        assert not first.is_alive()
