"""Opening a store: URLs, engine options and the entry points (docs/contract.md §1, §2)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
import pytest
from postgres_helpers import in_threads

import alkstore
from alkstore.errors import ValidationError
from alkstore_postgres import DEFAULT_QUERY_TIMEOUT_S, PostgresStore, open_store
from alkstore_postgres._url import parse_url

pytestmark = pytest.mark.postgres


def test_entry_points_name_both_schemes() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="alkstore.engines")}
    assert found["postgresql"] == "alkstore_postgres:open_store"
    assert found["postgres"] == "alkstore_postgres:open_store"


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "PostgreSQL"])
def test_both_schemes_open(postgres_url: str, schema: str, scheme: str) -> None:
    url = scheme + postgres_url[postgres_url.index("://") :]
    with alkstore.open(url, schema=schema) as store:
        assert isinstance(store, PostgresStore)
        assert store.schema == schema


@pytest.mark.parametrize(
    "url",
    ["mysql://x@y/z", "postgresql:/nohost", "postgresql://h/db?no_such_param=1", 42],
)
def test_bad_urls(url: object) -> None:
    with pytest.raises(ValidationError):
        parse_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:secret@h/db?no_such_param=1",
        "postgresql://u@h/db?password=secret&no_such_param=1",
        "postgres://u@h/db?no_such_param=1&sslpassword=secret",
    ],
)
def test_passwords_never_reach_the_error(url: str) -> None:
    with pytest.raises(ValidationError, match=r"no_such_param") as caught:
        parse_url(url)
    assert "secret" not in str(caught.value)
    assert "***" in str(caught.value)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"no_such_option": 1}, "unknown engine option"),
        ({"schema": "Alkstore"}, "schema"),
        ({"schema": "public"}, "reserved"),
        ({"schema": "pg_mine"}, "reserved"),
        ({"schema": "information_schema"}, "reserved"),
        ({"schema": "a" * 64}, "63-byte"),
        ({"schema": "has space"}, "schema"),
        ({"schema": 'x"; DROP SCHEMA public; --'}, "schema"),
        ({"schema": None}, "schema"),
        ({"pool_min_size": -1}, "pool_min_size"),
        ({"pool_max_size": 0}, "pool_max_size"),
        ({"pool_min_size": 5, "pool_max_size": 2}, "pool_max_size"),
        ({"pool_max_size": True}, "pool_max_size"),
        ({"pool_timeout_s": 0}, "pool_timeout_s"),
        ({"query_timeout_s": 0}, "query_timeout_s"),
        ({"query_timeout_s": -1}, "query_timeout_s"),
        ({"query_timeout_s": float("inf")}, "query_timeout_s"),
        ({"query_timeout_s": "15"}, "query_timeout_s"),
        ({"repoll_interval_s": -1}, "repoll_interval_s"),
        ({"migrate": "yes"}, "migrate"),
        ({"clock": 3}, "clock"),
    ],
)
def test_bad_options_fail_before_any_io(options: dict[str, object], match: str) -> None:
    # The port is closed: reaching the network would be an EngineError.
    with pytest.raises(ValidationError, match=match):
        open_store("postgresql://postgres@127.0.0.1:1/test", **options)


def test_a_query_string_password_is_masked_in_repr(
    postgres_url: str, open_pg: Callable[..., PostgresStore]
) -> None:
    # The server's own password (any one, under trust auth), in libpq's
    # query-string form: it connects, and repr shows only ***.
    parts = urlsplit(postgres_url)
    secret = parts.password or "s3cret-for-the-test"
    store = open_pg(f"{postgres_url}{'&' if parts.query else '?'}password={secret}")
    assert secret not in repr(store)
    assert "password=***" in repr(store)
    q = store.queue("jobs")
    assert q.get_job(q.enqueue(1)) is not None


def test_connections_force_the_engines_settings_and_keep_the_urls_options(
    postgres_url: str, open_pg: Callable[..., PostgresStore]
) -> None:
    sep = "&" if urlsplit(postgres_url).query else "?"
    asks = quote(
        r"-c work_mem=7MB -c default_transaction_isolation=repeatable\ read -c TimeZone=Asia/Tokyo"
    )
    store = open_pg(f"{postgres_url}{sep}options={asks}")
    settings = (
        "SELECT current_setting('plan_cache_mode'), current_setting('work_mem'),"
        " current_setting('default_transaction_isolation'), current_setting('TimeZone')"
    )
    expected = ("force_generic_plan", "7MB", "read committed", "UTC")
    with store._db.connection() as conn:
        assert conn.execute(settings).fetchone() == expected
    with store._db.connect() as direct:  # migrations
        assert direct.execute(settings).fetchone() == expected


def test_claims_race_under_a_url_asking_for_repeatable_read(
    postgres_url: str, open_pg: Callable[..., PostgresStore]
) -> None:
    """Under REPEATABLE READ a claim meeting a row another claim changed
    raised SerializationFailure; the engine's sessions use READ COMMITTED."""
    sep = "&" if urlsplit(postgres_url).query else "?"
    asks = quote(r"-c default_transaction_isolation=repeatable\ read")
    store = open_pg(f"{postgres_url}{sep}options={asks}", pool_max_size=8)
    q = store.queue("jobs")
    q.enqueue_many(list(range(400)))
    claimed: list[int] = []
    start = threading.Barrier(8)

    def drain(_: int) -> None:
        start.wait()
        while handles := q.claim_batch("w", 5):
            claimed.extend(h.id for h in handles)
            q.ack_batch([h.id for h in handles])

    in_threads(8, drain)  # asserts that no thread raised
    assert len(claimed) == len(set(claimed)) == 400


def test_options_are_applied(open_pg: Callable[..., PostgresStore]) -> None:
    store = open_pg(
        pool_min_size=0, pool_max_size=3, pool_timeout_s=5, query_timeout_s=4, repoll_interval_s=2.5
    )
    assert store.repoll_interval_s == 2.5
    assert store.query_timeout_s == 4
    assert open_pg().query_timeout_s == DEFAULT_QUERY_TIMEOUT_S == 15
    # Up to the 100 years of every duration: each setting at its largest.
    q = open_pg(query_timeout_s=100 * 365 * 86400).queue("jobs")
    assert q.get_job(q.enqueue(1)) is not None
    q = store.queue("jobs")
    assert q.get_job(q.enqueue(1)) is not None


_LIBPQ_BOUNDS = (
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


def _bounds(conn: psycopg.Connection[Any]) -> dict[str, str | None]:
    params = conn.info.get_parameters()
    found: dict[str, str | None] = {name: params.get(name) for name in _LIBPQ_BOUNDS}
    row = conn.execute("SHOW statement_timeout").fetchone()
    found["statement_timeout"] = None if row is None else row[0]
    return found


def test_every_connection_is_bounded_by_query_timeout_s(
    postgres_url: str, open_pg: Callable[..., PostgresStore]
) -> None:
    """Keepalives find a dead peer in about query_timeout_s (12 s here: a
    probe after 4 s idle, then every 2 s, 3 probes); unacknowledged data
    fails after it; the server ends a statement at 90% of it."""
    store = open_pg(query_timeout_s=12)
    expected = {
        "connect_timeout": "12",
        "keepalives": "1",
        "keepalives_idle": "4",
        "keepalives_interval": "2",
        "keepalives_count": "3",
        "tcp_user_timeout": "12000",
        "statement_timeout": "10800ms",
    }
    with store._db.connection() as pooled:
        assert _bounds(pooled) == expected
    with store._db.connect() as direct:  # migrations, maintenance turns
        assert _bounds(direct) == expected
    store.listen("jobs")
    assert store._listener.call(_bounds) == expected


def test_the_urls_own_bounds_win(
    postgres_url: str, open_pg: Callable[..., PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    sep = "&" if urlsplit(postgres_url).query else "?"
    asks = quote("-c statement_timeout=5s")
    url = (
        f"{postgres_url}{sep}keepalives_idle=7&keepalives_count=9&tcp_user_timeout=1234"
        f"&options={asks}"
    )
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "17")
    with open_pg(url, query_timeout_s=12)._db.connection() as conn:
        assert _bounds(conn) == {
            "connect_timeout": "17",
            "keepalives": "1",
            "keepalives_idle": "7",
            "keepalives_interval": "2",
            "keepalives_count": "9",
            "tcp_user_timeout": "1234",
            "statement_timeout": "5s",
        }
