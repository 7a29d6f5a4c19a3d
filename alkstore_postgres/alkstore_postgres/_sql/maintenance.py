"""The statements of maintenance turns (:mod:`alkstore_postgres._maintenance`)
and their lock keys."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from psycopg import sql

from alkstore.engine import duration

__all__ = [
    "BEGIN",
    "COMMIT",
    "LOCK",
    "READ",
    "TAKE",
    "TRANSACTION_LOCK",
    "UNLOCK",
    "advisory_key",
    "due_before",
]

_EARLIEST = datetime.min.replace(tzinfo=UTC)

READ = sql.SQL("SELECT last_run_at FROM {maintenance} WHERE task = %(task)s")

# Returns a row only when the turn was due (or the task new): the row lock
# of ON CONFLICT makes concurrent takers see each other's advance.
TAKE = sql.SQL("""
    INSERT INTO {maintenance} AS m (task, last_run_at) VALUES (%(task)s, %(now)s)
    ON CONFLICT (task) DO UPDATE SET last_run_at = excluded.last_run_at
    WHERE m.last_run_at <= %(due_before)s
    RETURNING 1
""")

#: The turn's lock, never waiting: session-level, or (behind a transaction
#: pooler, inside the turn's transaction) transaction-level.
LOCK = "SELECT pg_try_advisory_lock(%s)"
TRANSACTION_LOCK = "SELECT pg_try_advisory_xact_lock(%s)"
UNLOCK = "SELECT pg_advisory_unlock(%s)"
BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
COMMIT = "COMMIT"


def advisory_key(schema: str, task: str) -> int:
    """The advisory lock key of ``task`` in the store schema ``schema``: a
    64-bit hash of both (the migration's lock hashes another text)."""
    text = f"alkstore maintenance {schema}\x00{task}"
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def due_before(now: datetime, interval_s: float) -> datetime:
    """The instant a task's last turn must be at or before for a turn of
    ``interval_s`` seconds to be due at ``now``."""
    try:
        return now - duration(interval_s)
    except OverflowError:
        return _EARLIEST
