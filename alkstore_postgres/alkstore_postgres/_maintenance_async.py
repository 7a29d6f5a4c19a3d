"""Maintenance turns (``AsyncStore._maintenance_turn``): which process runs a
store-wide chore such as the expiry sweep, and when.

A turn is given to at most one caller at a time and at most once per
interval:

* the ``maintenance`` table keeps, per task, the instant its last turn was
  taken; a turn is due for a caller when that is at least the caller's own
  interval ago (so a sweeper with a long interval never holds back one with
  a short interval), and taking it sets it to ``now`` in one conditional
  upsert, so two takers can never both see it due;
* for the whole ``with`` block the taker holds a session-level advisory
  lock (``pg_try_advisory_lock``, never waiting) keyed by the store's
  schema and the task (:func:`advisory_key`), so a turn that outlasts its
  interval still has no rival, and two stores in different schemas of one
  database never block each other.

The lock lives on a direct connection opened for the turn, not on a pool
connection: the block itself runs queue operations through the pool, and
with ``pool_max_size=1`` a held pool connection would starve them. The
connection is opened only when the turn looks due (one pooled read of the
task's row first), so a process asks for it about once per interval.
Behind a transaction pooler, where a session-level lock could be taken on
one server connection and released on another, the direct connection
holds a transaction open for the turn instead, and the lock is
transaction-level (``pg_try_advisory_xact_lock``); the turn is taken (the
row advanced) on a pooled connection, so that the open transaction writes
nothing, has no transaction id and, under READ COMMITTED, holds no
snapshot between statements: it pins no row version for VACUUM.
Leaving the block unlocks and closes it, on an exception too; if the
connection dies meanwhile the server drops the lock with it. Each call on
it is bounded by ``query_timeout_s`` (not the turn, which runs through the
pool, each of its operations bounded in turn).

The statements are in :mod:`alkstore_postgres._sql.maintenance`
(``advisory_key`` is re-exported here).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import psycopg

from alkstore.errors import EngineError
from alkstore_postgres._connection import wrap_errors
from alkstore_postgres._database_async import AsyncConn
from alkstore_postgres._sql.maintenance import (
    BEGIN,
    COMMIT,
    LOCK,
    READ,
    TAKE,
    TRANSACTION_LOCK,
    UNLOCK,
    advisory_key,
    due_before,
)

if TYPE_CHECKING:
    from alkstore_postgres._store_async import AsyncPostgresStore

__all__ = ["advisory_key", "maintenance_turn"]


async def _release(conn: AsyncConn, key: int, in_transaction: bool) -> None:
    # Ending the turn's transaction ends its lock. (A connection closed
    # inside one would cost the pooler its server connection.)
    if in_transaction:
        await conn.execute(COMMIT)
    else:
        await conn.execute(UNLOCK, [key])


@contextlib.asynccontextmanager
async def maintenance_turn(
    store: AsyncPostgresStore, task: str, interval_s: float
) -> AsyncIterator[bool]:
    """``AsyncStore._maintenance_turn`` (module docstring).

    Raises
    ------
    EngineError
        If the database fails (before the block runs).
    """
    async with store._db.connection() as pooled:
        row = await (await pooled.execute(store.sql(READ), {"task": task}, binary=True)).fetchone()
    if row is not None and row[0] > due_before(await store._now(), interval_s):
        yield False
        return
    key = advisory_key(store.schema, task)
    in_transaction = store._db.pooler == "transaction"
    conn = await store._db.connect(application_name="alkstore-maintenance")
    try:
        with wrap_errors():
            async with store._db.guard(conn):
                if in_transaction:
                    await conn.execute(BEGIN)
                    locked = await (await conn.execute(TRANSACTION_LOCK, [key])).fetchone()
                else:
                    locked = await (await conn.execute(LOCK, [key])).fetchone()
        taken = False
        if locked is not None and locked[0]:
            # Read after the lock: a holder that just finished has advanced
            # the row.
            now = await store._now()
            params = {"task": task, "now": now, "due_before": due_before(now, interval_s)}
            if in_transaction:
                # Not under the direct connection's guard: the pool's wait
                # has its own bound.
                async with store._db.connection() as pooled:
                    cur = await pooled.execute(store.sql(TAKE), params)
                    taken = await cur.fetchone() is not None
            else:
                with wrap_errors():
                    async with store._db.guard(conn):
                        cur = await conn.execute(store.sql(TAKE), params)
                        taken = await cur.fetchone() is not None
            if not taken:
                with wrap_errors():
                    async with store._db.guard(conn):
                        await _release(conn, key, in_transaction)
        elif in_transaction:
            with wrap_errors():
                async with store._db.guard(conn):
                    await _release(conn, key, in_transaction)
        if not taken:
            await conn.close()
            yield False
            return
        try:
            yield True
        finally:
            # On a broken connection the lock went with the session; keep
            # the block's own error.
            with contextlib.suppress(psycopg.Error, EngineError):
                async with store._db.guard(conn):
                    await _release(conn, key, in_transaction)
    finally:
        await conn.close()
