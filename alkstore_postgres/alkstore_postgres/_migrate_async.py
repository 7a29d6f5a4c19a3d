"""Schema migrations (docs/contract.md §3 "Schema"): reading the stored
version and bringing the schema to this code's.

The DDL, the versions and the statements' rendering are in
:mod:`alkstore_postgres._schema`, shared; this module runs them. One source
for two modules (docs/async.md "How the engines do it"): ``_migrate_async``
is written by hand, ``_migrate`` is generated from it.
"""

from __future__ import annotations

import contextlib
from datetime import datetime

import psycopg
from psycopg import sql

from alkstore.engine import check_schema_version
from alkstore_postgres._database_async import AsyncConn
from alkstore_postgres._schema import (
    _CREATE_META,
    _CREATE_SCHEMA,
    _MIGRATIONS,
    _READ_VERSION,
    _VERSION_KEY,
    _WRITE_VERSION,
    SCHEMA_VERSION,
    migration_lock_key,
    render,
)

__all__ = ["migrate", "read_version"]


async def read_version(conn: AsyncConn, schema: str) -> int | None:
    """Return the stored schema version, ``None`` when there is no schema.

    Raises
    ------
    psycopg.Error
        If the database fails.
    """
    meta = sql.Identifier(schema, "meta").as_string(None)
    row = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL", [meta])).fetchone()
    if row is None or not row[0]:
        return None
    row = await (await conn.execute(render(_READ_VERSION, schema), [_VERSION_KEY])).fetchone()
    return None if row is None else int(row[0])


async def migrate(
    conn: AsyncConn, schema: str, now: datetime | None = None, *, transaction_lock: bool = False
) -> None:
    """Bring ``schema`` to :data:`~alkstore_postgres._schema.SCHEMA_VERSION`;
    idempotent and safe when many processes run it at once.

    ``conn`` is an autocommit connection; the migration runs in its own
    transaction under a session-level advisory lock, released at the end. A
    schema already at this version costs one read and takes no lock (nor
    needs ``CREATE`` privileges). ``now`` is the store's injected clock's
    reading, if it has one (statements that sort rows by time use it; the
    server's time otherwise). With ``transaction_lock`` (behind a
    transaction pooler, where two statements outside a transaction may run
    on two server connections) the lock is transaction-level instead, the
    transaction's first statement: under READ COMMITTED every later
    statement takes a new snapshot, and the next statement opens a catalog
    table, which makes the session read the catalog changes committed
    meanwhile.

    Raises
    ------
    SchemaVersionError
        If the stored version is newer than this code's.
    psycopg.Error
        If the database fails.
    """
    found = await read_version(conn, schema)
    check_schema_version(found, SCHEMA_VERSION, migrating=True)
    if found == SCHEMA_VERSION:
        return
    key = migration_lock_key(schema)
    # A session-level lock, taken before the migration's transaction begins:
    # a transaction that starts after the lock is granted sees every change
    # the previous holder committed, catalog caches included. (Under a
    # transaction-level lock the transaction would already be open, and a
    # name looked up earlier in this session could still resolve from a
    # stale cache entry.)
    if not transaction_lock:
        await conn.execute("SELECT pg_advisory_lock(%s)", [key])
    try:
        async with conn.transaction():
            if transaction_lock:
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", [key])
                # The lock itself reads no catalog change committed since the
                # transaction began; a relation's first lock in a transaction
                # does, so a name this session looked up before (a missing
                # schema, say) no longer resolves from its stale cache entry.
                await conn.execute("SELECT FROM pg_catalog.pg_namespace LIMIT 0")
            found = await read_version(conn, schema)
            check_schema_version(found, SCHEMA_VERSION, migrating=True)
            current = found or 0
            if current == SCHEMA_VERSION:
                return
            if found is None:
                # Only when missing: CREATE SCHEMA checks the database's
                # CREATE privilege even with IF NOT EXISTS, and a DBA may
                # have made the schema for a less privileged role.
                row = await (
                    await conn.execute(
                        "SELECT to_regnamespace(%s) IS NULL",
                        [sql.Identifier(schema).as_string(None)],
                    )
                ).fetchone()
                if row is not None and row[0]:
                    await conn.execute(render(_CREATE_SCHEMA, schema))
                await conn.execute(render(_CREATE_META, schema))
            params = {"now": now}
            for statements in _MIGRATIONS[current:]:
                for statement in statements:
                    query = render(statement, schema)
                    await conn.execute(query, params if b"%(" in query else None)
            await conn.execute(render(_WRITE_VERSION, schema), [_VERSION_KEY, SCHEMA_VERSION])
    finally:
        # On a broken connection the lock went with the session; keep the
        # original error.
        if not transaction_lock:
            with contextlib.suppress(psycopg.Error):
                await conn.execute("SELECT pg_advisory_unlock(%s)", [key])
