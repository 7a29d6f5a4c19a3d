"""alkstore-sqlite: the embedded SQLite engine of alkstore.

Open a store with ``alkstore.open("sqlite:///jobs.db")`` (relative path) or
``alkstore.open("sqlite:////var/lib/app/jobs.db")`` (absolute path). The
engine registers the ``sqlite`` scheme under the ``alkstore.engines`` entry
point group; :func:`open_store` is that entry point. See the package README
for the engine options, the durability setting and the file layout.
"""

from __future__ import annotations

from alkstore_sqlite._handle import SqliteJobHandle
from alkstore_sqlite._queue import SqliteQueue
from alkstore_sqlite._schema import SCHEMA_VERSION
from alkstore_sqlite._store import (
    DEFAULT_BUSY_TIMEOUT_S,
    DEFAULT_POLL_INTERVAL_S,
    ENGINE_OPTIONS,
    SqliteStore,
    open_store,
)
from alkstore_sqlite._subscription import SqliteSubscription
from alkstore_sqlite._url import parse_url

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "DEFAULT_POLL_INTERVAL_S",
    "ENGINE_OPTIONS",
    "SCHEMA_VERSION",
    "SqliteJobHandle",
    "SqliteQueue",
    "SqliteStore",
    "SqliteSubscription",
    "open_store",
    "parse_url",
]

__version__ = "0.1.0"
