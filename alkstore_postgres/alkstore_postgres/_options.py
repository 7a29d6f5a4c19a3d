"""The engine's options (``alkstore.open(url, **options)`` and
``alkstore.open_async``): their defaults and their checks, before any I/O.

Shared by :class:`~alkstore_postgres.AsyncPostgresStore` and the sync
:class:`~alkstore_postgres.PostgresStore` generated from it, so both take
the same options and refuse the same values with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

from alkstore.engine import duration_s, int_in_range, redact_url
from alkstore.errors import ValidationError
from alkstore_postgres._connection import POOLERS
from alkstore_postgres._schema import check_schema_name
from alkstore_postgres._url import parse_url

__all__ = [
    "DEFAULT_POOL_MAX_SIZE",
    "DEFAULT_POOL_MIN_SIZE",
    "DEFAULT_POOL_TIMEOUT_S",
    "DEFAULT_QUERY_TIMEOUT_S",
    "DEFAULT_REPOLL_INTERVAL_S",
    "ENGINE_OPTIONS",
    "StoreOptions",
    "store_options",
]

#: Connections the pool keeps open when idle.
DEFAULT_POOL_MIN_SIZE = 1
#: The most connections the pool opens (operations running at once). The
#: pool opens one only when an operation would otherwise wait, and closes
#: those left unused for a minute, so a store holds about as many as its
#: threads use at once: 64 threads on one store get a connection each
#: instead of queueing for one of ten (bench_postgres.py's pool row).
DEFAULT_POOL_MAX_SIZE = 64
#: Seconds an operation waits for a pooled connection.
DEFAULT_POOL_TIMEOUT_S = 30.0
#: Seconds any one call to the server may wait for its answer. Under the
#: default visibility timeout (30 s, a heartbeat every 10 s), a heartbeat
#: stuck on a dead connection fails and is retried on a new one before the
#: claims it keeps lapse.
DEFAULT_QUERY_TIMEOUT_S = 15.0
#: Seconds between a consumer's safety-net re-polls; also the LISTEN
#: connection's idle time before it is checked with a ping.
DEFAULT_REPOLL_INTERVAL_S = 30.0
#: The engine options of this engine, besides docs/contract.md §2's common ones.
ENGINE_OPTIONS = frozenset(
    {
        "schema",
        "pool_min_size",
        "pool_max_size",
        "pool_timeout_s",
        "query_timeout_s",
        "repoll_interval_s",
        "pooler",
        "listen_url",
    }
)


@dataclass(frozen=True)
class StoreOptions:
    """A store's checked options (see :func:`store_options`)."""

    schema: str
    pool_min_size: int
    pool_max_size: int
    pool_timeout_s: float
    query_timeout_s: float
    repoll_interval_s: float
    pooler: str | None
    #: ``listen_url`` as a libpq connection string, or ``None``.
    listen_conninfo: str | None
    #: The URL, its password masked (for messages and ``repr``).
    url: str

    @property
    def listen_disabled(self) -> str | None:
        """Why the store cannot LISTEN (behind a transaction pooler without
        ``listen_url``), or ``None`` when it can."""
        if self.pooler != "transaction" or self.listen_conninfo is not None:
            return None
        return (
            "behind a transaction pooler (pooler='transaction') without listen_url the "
            "store cannot LISTEN: subscriptions never wake, consumers find new jobs by "
            f"re-polling every repoll_interval_s ({self.repoll_interval_s:g} s)"
        )


def _pooler(value: object) -> str | None:
    if value is None or (isinstance(value, str) and value in POOLERS):
        return value
    raise ValidationError(
        f"pooler must be None, 'session' or 'transaction' (PgBouncer's pool_mode), not {value!r}"
    )


def _pool_size(value: object, what: str, low: int) -> int:
    return int_in_range(value, what, low, 10_000)


def store_options(
    conninfo: str,
    *,
    schema: object,
    pool_min_size: object,
    pool_max_size: object,
    pool_timeout_s: object,
    query_timeout_s: object,
    repoll_interval_s: object,
    pooler: object,
    listen_url: object,
) -> StoreOptions:
    """Check the engine's own options (the store's parameters); no I/O.

    Raises
    ------
    ValidationError
        For the first bad one, in this order: ``pooler``, ``listen_url``,
        ``schema``, the pool's sizes, ``pool_timeout_s``,
        ``query_timeout_s``, ``repoll_interval_s``.
    """
    checked_pooler = _pooler(pooler)
    listen_conninfo = None if listen_url is None else parse_url(listen_url)
    checked_schema = check_schema_name(schema)
    min_size = _pool_size(pool_min_size, "pool_min_size", 0)
    max_size = _pool_size(pool_max_size, "pool_max_size", 1)
    if max_size < min_size:
        raise ValidationError(
            f"pool_max_size ({max_size}) must not be below pool_min_size ({min_size})"
        )
    return StoreOptions(
        schema=checked_schema,
        pool_min_size=min_size,
        pool_max_size=max_size,
        pool_timeout_s=duration_s(pool_timeout_s, "pool_timeout_s", positive=True),
        query_timeout_s=duration_s(query_timeout_s, "query_timeout_s", positive=True),
        repoll_interval_s=duration_s(repoll_interval_s, "repoll_interval_s", positive=True),
        pooler=checked_pooler,
        listen_conninfo=listen_conninfo,
        url=redact_url(conninfo),
    )
