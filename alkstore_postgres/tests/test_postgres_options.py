"""Opening a store: URLs, engine options and the entry points (SPEC §1, §2)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from urllib.parse import quote, urlsplit

import pytest
from postgres_helpers import in_threads

import alkstore
from alkstore.errors import ValidationError
from alkstore_postgres import PostgresStore, open_store
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
    store = open_pg(pool_min_size=0, pool_max_size=3, pool_timeout_s=5, repoll_interval_s=2.5)
    assert store.repoll_interval_s == 2.5
    q = store.queue("jobs")
    assert q.get_job(q.enqueue(1)) is not None
