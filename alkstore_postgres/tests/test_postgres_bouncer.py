"""The engine through a real PgBouncer (regression case 018).

Debian's ``pgbouncer`` (1.18: no prepared statements in transaction mode)
with stock settings, once in ``pool_mode = transaction`` and once in
``pool_mode = session`` (``conftest.py``'s ``bouncer_*`` fixtures); a store
opened on PgBouncer's port with ``pooler=`` set to that mode
(docs/deployment.md "PgBouncer").
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from postgres_bouncer import Bouncer, pgbouncer
from postgres_helpers import in_threads

import alkstore
from alkstore.errors import EngineError, ValidationError
from alkstore_postgres import PostgresStore, open_store
from alkstore_postgres._maintenance import advisory_key

pytestmark = pytest.mark.postgres

# Seconds any one wait of these tests may take at most.
_WAIT_S = 60.0
# A worker's own re-poll interval long enough that only a wake-up (a NOTIFY
# on the listen_url connection) can start its claims within _WAIT_S.
_NO_REPOLL_S = 600.0


@pytest.fixture(params=["transaction", "session"])
def mode(request: pytest.FixtureRequest) -> str:
    """PgBouncer's pool_mode, and the store's ``pooler``."""
    value: str = request.param
    return value


@pytest.fixture
def bouncer(mode: str, request: pytest.FixtureRequest) -> Bouncer:
    """The session's PgBouncer in ``mode``."""
    found: Bouncer = request.getfixturevalue(f"bouncer_{mode}")
    return found


@pytest.fixture
def open_bounced(
    open_pg: Callable[..., PostgresStore], bouncer: Bouncer, mode: str
) -> Callable[..., PostgresStore]:
    """Open stores on PgBouncer's port with ``pooler=mode`` (and the test's
    schema and clock, closed at teardown)."""

    def opener(**options: Any) -> PostgresStore:
        options.setdefault("pooler", mode)
        return open_pg(bouncer.url(), **options)

    return opener


@pytest.fixture
def open_transaction_pooled(
    open_pg: Callable[..., PostgresStore], bouncer_transaction: Bouncer
) -> Callable[..., PostgresStore]:
    """Open stores on the transaction-mode PgBouncer with
    ``pooler="transaction"`` (as ``open_bounced``)."""

    def opener(**options: Any) -> PostgresStore:
        return open_pg(bouncer_transaction.url(), pooler="transaction", **options)

    return opener


def _drain_with_a_worker(
    store: PostgresStore, count: int, *, poll_interval_s: float, concurrency: int = 8
) -> Counter[int]:
    """Start a worker (it claims nothing: the queue is empty), then enqueue
    ``count`` jobs in batches; return how often each ran once all ran."""
    app = alkstore.App(store=store)
    runs: Counter[int] = Counter()
    lock = threading.Lock()
    done = threading.Event()

    @app.task(queue="drain", name="record")
    def record(i: int) -> None:
        with lock:
            runs[i] += 1
            if sum(runs.values()) >= count:
                done.set()

    worker = app.worker(
        concurrency=concurrency,
        poll_interval_s=poll_interval_s,
        handle_signals=False,
        sweep_interval_s=None,
        tick_interval_s=None,
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        for start in range(0, count, 100):
            record.enqueue_many([(i,) for i in range(start, min(start + 100, count))])
        assert done.wait(_WAIT_S), f"{sum(runs.values())} of {count} ran"
    finally:
        worker.stop()
        thread.join(_WAIT_S)
    assert not thread.is_alive()
    return runs


def test_case_018_stock_pgbouncer(
    open_bounced: Callable[..., PostgresStore], postgres_url: str, mode: str
) -> None:
    # In transaction mode the LISTEN connection goes to the server itself;
    # session mode carries it through PgBouncer.
    listen = {"listen_url": postgres_url} if mode == "transaction" else {}
    store = open_bounced(clock=None, repoll_interval_s=_NO_REPOLL_S, **listen)
    q = store.queue("jobs")
    ids = q.enqueue_many(list(range(50)))
    assert len(set(ids)) == 50
    claimed: list[int] = []
    while handles := q.claim_batch("w", 7):
        for handle in handles:
            claimed.append(handle.id)
            assert handle.ack()
    assert sorted(claimed) == sorted(ids)  # exactly those, once each
    assert q.stats().pending == 0
    # A worker waiting on its subscription: only wake-ups start its claims.
    runs = _drain_with_a_worker(store, 1000, poll_interval_s=_NO_REPOLL_S)
    assert runs == Counter(range(1000))  # nothing lost, nothing doubled
    stats = store.queue("drain").stats()
    assert (stats.pending, stats.processing) == (0, 0)


def test_a_wake_up_through_listen_url_reaches_a_waiting_claimer(
    open_transaction_pooled: Callable[..., PostgresStore],
    postgres_url: str,
    admin: psycopg.Connection[Any],
) -> None:
    store = open_transaction_pooled(listen_url=postgres_url)
    subscription = store.listen("jobs")
    # The LISTEN is on a server session of its own, not a pooled one.
    (listening,) = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'alkstore-listener'"
        " AND query LIKE 'LISTEN%'"
    ).fetchone() or (0,)
    assert listening >= 1
    woken: list[bool] = []
    waiting = threading.Thread(target=lambda: woken.append(subscription.wait(_WAIT_S)))
    waiting.start()
    job_id = store.queue("jobs").enqueue("hello")
    waiting.join(_WAIT_S)
    assert woken == [True]
    handle = store.queue("jobs").claim_one("w")
    assert handle is not None
    assert handle.id == job_id


def test_without_listen_url_a_transaction_pooled_store_repolls_and_says_so_once(
    open_transaction_pooled: Callable[..., PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    store = open_transaction_pooled(repoll_interval_s=0.2)
    with caplog.at_level(logging.WARNING, logger="alkstore.postgres"):
        first = store.listen("jobs")
        second = store.listen("other")
        store.queue("jobs").enqueue(1)
        # Nothing wakes a subscription: the consumer's re-poll finds the job.
        assert first.wait(0.05) is False
        second.close()
        third = store.listen("jobs")
        third.close()
    warnings = [r for r in caplog.records if "cannot LISTEN" in r.getMessage()]
    assert len(warnings) == 1
    assert "re-polling every repoll_interval_s (0.2 s)" in warnings[0].getMessage()
    # And a worker drains by its re-polls alone, nothing lost or doubled.
    runs = _drain_with_a_worker(store, 300, poll_interval_s=0.2)
    assert runs == Counter(range(300))


def test_transaction_mode_never_prepares_a_statement(
    postgres_url: str, schema: str, admin: psycopg.Connection[Any]
) -> None:
    # Two server connections for all of PgBouncer's clients: psycopg's
    # automatic prepare (after 5 runs of a statement) would collide with
    # 'prepared statement "_pg3_0" already exists' or miss with 'does not
    # exist' within the first few dozen operations.
    with pgbouncer(postgres_url, "transaction", {"default_pool_size": "2"}) as bouncer:
        store = open_store(bouncer.url(), schema=schema, pooler="transaction", pool_max_size=8)
        try:
            q = store.queue("jobs")

            def work(i: int) -> int:
                done = 0
                for n in range(25):
                    job = q.get_job(q.enqueue({"i": i, "n": n}))
                    # Another thread may have claimed and acked it already.
                    assert job is None or job.queue == "jobs"
                    for handle in q.claim_batch(f"w{i}", 2):
                        done += handle.ack()
                    done += q.ack_batch([])
                return done

            acked = sum(in_threads(8, work))
            while handles := q.claim_batch("rest", 50):
                acked += sum(handle.ack() for handle in handles)
            assert acked == 200
            # Both server connections at once (each client holds one in its
            # transaction): neither has a prepared statement.
            with (
                psycopg.connect(bouncer.url(), autocommit=True) as one,
                psycopg.connect(bouncer.url(), autocommit=True) as two,
            ):
                seen = {}
                for conn in (one, two):
                    conn.execute("BEGIN")
                    pid, prepared = conn.execute(
                        "SELECT pg_backend_pid(), count(*) FROM pg_prepared_statements"
                    ).fetchone() or (0, -1)
                    seen[pid] = prepared
                assert len(seen) == 2
                assert set(seen.values()) == {0}
                for conn in (one, two):
                    conn.execute("COMMIT")
        finally:
            store.close()


def test_session_settings_hold_without_startup_options(
    open_bounced: Callable[..., PostgresStore], bouncer: Bouncer, mode: str
) -> None:
    store = open_bounced(query_timeout_s=20)
    settings = (
        "SELECT current_setting('TimeZone'), current_setting('statement_timeout'),"
        " current_setting('plan_cache_mode'), current_setting('default_transaction_isolation')"
    )
    with store._db.connection() as conn:
        found = conn.execute(settings).fetchone()
    with psycopg.connect(bouncer.url(), autocommit=True) as other:
        # Another client of the same PgBouncer: the server's own settings.
        theirs = other.execute(settings).fetchone()
    assert theirs is not None
    assert theirs[0] != "UTC"
    if mode == "session":
        assert found == ("UTC", "18s", "force_generic_plan", "read committed")
    else:
        # Only TimeZone, which PgBouncer restores per client; a SET of the
        # others would leak to the pooler's other clients.
        assert found == ("UTC", *theirs[1:])


def test_maintenance_turns_and_migrations_leave_no_lock_behind(
    open_bounced: Callable[..., PostgresStore], admin: psycopg.Connection[Any], schema: str
) -> None:
    # Four stores migrate one new schema at once through the pooler.
    stores = in_threads(4, lambda _: open_bounced())
    first, second = stores[0], stores[1]
    with first._maintenance_turn("sweep", 60.0) as taken:
        assert taken
        # Held for the whole block: another store gets no turn.
        with second._maintenance_turn("sweep", 0.0) as rival:
            assert not rival
    # The lock went with the turn (none left on any server connection).
    key = advisory_key(schema, "sweep") & 0xFFFFFFFFFFFFFFFF
    locks = admin.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        " AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 1",
        [key >> 32, key & 0xFFFFFFFF],
    ).fetchone()
    assert locks == (0,)
    with second._maintenance_turn("sweep", 0.0) as again:
        assert again


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"pooler": "statement"}, "pooler"),
        ({"pooler": True}, "pooler"),
        ({"pooler": "Transaction"}, "pooler"),
        ({"listen_url": 5}, "url"),
        ({"listen_url": "mysql://x@y/z"}, "PostgreSQL URL"),
    ],
)
def test_bad_pooler_options_fail_before_any_io(options: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        open_store("postgresql://postgres@127.0.0.1:1/test", **options)


def test_a_store_without_pooler_names_the_option_pgbouncer_needs(
    bouncer_transaction: Bouncer, schema: str
) -> None:
    with pytest.raises(EngineError, match="pooler='transaction' or pooler='session'") as caught:
        open_store(bouncer_transaction.url(), schema=schema)
    assert caught.value.permanent


@pytest.fixture
def serializable_role(admin: psycopg.Connection[Any], schema: str) -> Iterator[str]:
    """A login role whose sessions default to SERIALIZABLE."""
    role = f"{schema}_ser"
    admin.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
    admin.execute(f"ALTER ROLE \"{role}\" SET default_transaction_isolation = 'serializable'")
    yield role
    admin.execute(f'DROP OWNED BY "{role}"')
    admin.execute(f'DROP ROLE "{role}"')


def test_transaction_mode_refuses_a_server_defaulting_to_another_isolation(
    postgres_url: str, schema: str, serializable_role: str
) -> None:
    parts = urlsplit(postgres_url)
    server = parts._replace(
        netloc=f"{serializable_role}@{parts.hostname}:{parts.port or 5432}"
    ).geturl()
    with pgbouncer(server, "transaction") as bouncer:
        with pytest.raises(EngineError, match="default_transaction_isolation") as caught:
            open_store(bouncer.url(), schema=schema, pooler="transaction")
        assert caught.value.permanent
        # Session mode sets it itself.
    with pgbouncer(server, "session") as bouncer:
        store = open_store(bouncer.url(), schema=schema, pooler="session")
        try:
            with store._db.connection() as conn:
                row = conn.execute("SELECT current_setting('transaction_isolation')").fetchone()
            assert row == ("read committed",)
        finally:
            store.close()


def test_behind_a_transaction_pooler_the_watchdog_still_bounds_a_slow_statement(
    open_transaction_pooled: Callable[..., PostgresStore],
) -> None:
    # The server keeps its own statement_timeout (none here): the engine's
    # watchdog ends the call at query_timeout_s instead, with its connection.
    store = open_transaction_pooled(query_timeout_s=1)
    with store._db.connection() as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
    with (
        pytest.raises(EngineError, match=r"query_timeout_s") as caught,
        store._db.connection() as conn,
    ):
        conn.execute("SELECT pg_sleep(5)")
    assert "statement timeout" not in str(caught.value)
    assert not caught.value.permanent
    # The store carries on, on a new connection.
    q = store.queue("jobs")
    assert q.get_job(q.enqueue(1)) is not None
