"""alkstore_postgres: the PostgreSQL engine of alkstore.

Open it through the core: ``alkstore.open("postgresql://user@host/db")``
(the ``postgresql`` and ``postgres`` schemes of the ``alkstore.engines``
entry points). Engine options besides docs/contract.md §2's ``clock``, ``rng`` and
``migrate``: ``schema``, ``pool_min_size``, ``pool_max_size``,
``pool_timeout_s``, ``query_timeout_s``, ``repoll_interval_s``, ``pooler``
and ``listen_url`` (see
:class:`PostgresStore`).
The package README explains the design: one statement per operation,
``FOR UPDATE SKIP LOCKED`` claims, LISTEN/NOTIFY wakes and the server's
clock.
"""

from __future__ import annotations

from alkstore_postgres._handle import PostgresJobHandle
from alkstore_postgres._queue import PostgresQueue
from alkstore_postgres._schema import DEFAULT_SCHEMA, SCHEMA_VERSION
from alkstore_postgres._store import (
    DEFAULT_POOL_MAX_SIZE,
    DEFAULT_POOL_MIN_SIZE,
    DEFAULT_POOL_TIMEOUT_S,
    DEFAULT_QUERY_TIMEOUT_S,
    DEFAULT_REPOLL_INTERVAL_S,
    ENGINE_OPTIONS,
    PostgresStore,
    open_store,
)
from alkstore_postgres._subscription import PostgresSubscription
from alkstore_postgres._wake import MAX_CHANNEL_BYTES, channel_name

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
    "PostgresJobHandle",
    "PostgresQueue",
    "PostgresStore",
    "PostgresSubscription",
    "channel_name",
    "open_store",
]

__version__ = "0.1.0"
