"""alkstore_postgres: the PostgreSQL engine of alkstore.

Open it through the core: ``alkstore.open("postgresql://user@host/db")``,
or ``alkstore.open_async(...)`` for the native asyncio store (the
``postgresql`` and ``postgres`` schemes of the ``alkstore.engines`` entry
points; the factory :func:`open_store` carries :func:`open_async_store` as
its ``open_async``). Engine options besides docs/contract.md §2's ``clock``,
``rng`` and ``migrate``: ``schema``, ``pool_min_size``, ``pool_max_size``,
``pool_timeout_s``, ``query_timeout_s``, ``repoll_interval_s``, ``pooler``
and ``listen_url`` (see :class:`PostgresStore`).
The package README explains the design: one statement per operation,
``FOR UPDATE SKIP LOCKED`` claims, LISTEN/NOTIFY wakes, the server's
clock, and the async engine (psycopg's ``AsyncConnection``), whose source
the sync modules are generated from.
"""

from __future__ import annotations

from alkstore_postgres._handle import PostgresJobHandle
from alkstore_postgres._handle_async import AsyncPostgresJobHandle
from alkstore_postgres._options import (
    DEFAULT_POOL_MAX_SIZE,
    DEFAULT_POOL_MIN_SIZE,
    DEFAULT_POOL_TIMEOUT_S,
    DEFAULT_QUERY_TIMEOUT_S,
    DEFAULT_REPOLL_INTERVAL_S,
    ENGINE_OPTIONS,
)
from alkstore_postgres._queue import PostgresQueue
from alkstore_postgres._queue_async import AsyncPostgresQueue
from alkstore_postgres._schema import DEFAULT_SCHEMA, SCHEMA_VERSION
from alkstore_postgres._store import PostgresStore, open_store
from alkstore_postgres._store_async import AsyncPostgresStore, open_async_store
from alkstore_postgres._subscription import PostgresSubscription
from alkstore_postgres._subscription_async import AsyncPostgresSubscription
from alkstore_postgres._wake import MAX_CHANNEL_BYTES, channel_name

# The entry point's factory opens the native async store for
# alkstore.open_async (docs/async.md, docs/engine-authors.md).
open_store.open_async = open_async_store  # type: ignore[attr-defined]

__all__ = [
    "DEFAULT_POOL_MAX_SIZE",
    "DEFAULT_POOL_MIN_SIZE",
    "DEFAULT_POOL_TIMEOUT_S",
    "DEFAULT_QUERY_TIMEOUT_S",
    "DEFAULT_REPOLL_INTERVAL_S",
    "DEFAULT_SCHEMA",
    "ENGINE_OPTIONS",
    "MAX_CHANNEL_BYTES",
    "SCHEMA_VERSION",
    "AsyncPostgresJobHandle",
    "AsyncPostgresQueue",
    "AsyncPostgresStore",
    "AsyncPostgresSubscription",
    "PostgresJobHandle",
    "PostgresQueue",
    "PostgresStore",
    "PostgresSubscription",
    "channel_name",
    "open_async_store",
    "open_store",
]

__version__ = "0.1.0"
