"""The SQLite schema: DDL and versioned, idempotent migrations (SPEC §3
"Schema").

Tables carry the ``_alkstore_`` prefix so they cannot collide with the
application's own tables in the same file:

``_alkstore_jobs``
    Live rows (``pending`` or ``processing``). ``INTEGER PRIMARY KEY
    AUTOINCREMENT``, so an id is never handed out twice, not even after the
    row with the largest id was deleted; ids grow in commit order, which
    the cross-process wake detector (:mod:`alkstore_sqlite._wake`) relies
    on instead of a table written by every enqueue.
``_alkstore_dead``
    Dead letters, keyed by the job's own id.
``_alkstore_meta``
    ``schema_version``.

Migrations run inside one ``BEGIN IMMEDIATE`` transaction, which SQLite
serialises across processes: when several processes open a new file at once,
one creates the schema and the others find it done.
"""

from __future__ import annotations

import sqlite3

from alkstore.engine import check_schema_version

__all__ = ["SCHEMA_VERSION", "migrate", "read_version"]

#: The newest schema version this code knows.
SCHEMA_VERSION = 1

_VERSION_KEY = "schema_version"

# Each entry upgrades from the version before it; entry ``i`` makes
# version ``i + 1``. Never edit a released entry: append a new one.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE _alkstore_jobs (
            id                   INTEGER PRIMARY KEY AUTOINCREMENT,
            queue                TEXT    NOT NULL,
            state                TEXT    NOT NULL CHECK (state IN ('pending', 'processing')),
            payload              BLOB    NOT NULL,
            content_type         TEXT    NOT NULL,
            priority             INTEGER NOT NULL,
            run_at               INTEGER NOT NULL,
            expires_at           INTEGER,
            enqueued_at          INTEGER NOT NULL,
            attempts             INTEGER NOT NULL,
            max_attempts         INTEGER NOT NULL,
            visibility_timeout_s REAL    NOT NULL,
            backoff_base_s       INTEGER NOT NULL,
            backoff_cap_s        INTEGER NOT NULL,
            worker_id            TEXT,
            claim_deadline       INTEGER,
            last_error           TEXT
        )
        """,
        # The claim walks this in claim order and stops after n rows.
        """
        CREATE INDEX _alkstore_jobs_pending
            ON _alkstore_jobs (queue, priority DESC, run_at, id)
            WHERE state = 'pending'
        """,
        # Lapsed claims (reclaims) and the processing count.
        """
        CREATE INDEX _alkstore_jobs_processing
            ON _alkstore_jobs (queue, claim_deadline)
            WHERE state = 'processing'
        """,
        # Claims on their last allowed attempt: the claim's dead-letter step
        # finds the lapsed ones without visiting retryable lapsed rows.
        """
        CREATE INDEX _alkstore_jobs_exhausted
            ON _alkstore_jobs (queue, claim_deadline)
            WHERE state = 'processing' AND attempts >= max_attempts
        """,
        # sweep_expired.
        """
        CREATE INDEX _alkstore_jobs_expiry
            ON _alkstore_jobs (queue, expires_at)
            WHERE expires_at IS NOT NULL
        """,
        """
        CREATE TABLE _alkstore_dead (
            id                   INTEGER PRIMARY KEY,
            queue                TEXT    NOT NULL,
            payload              BLOB    NOT NULL,
            content_type         TEXT    NOT NULL,
            priority             INTEGER NOT NULL,
            run_at               INTEGER NOT NULL,
            expires_at           INTEGER,
            enqueued_at          INTEGER NOT NULL,
            attempts             INTEGER NOT NULL,
            max_attempts         INTEGER NOT NULL,
            visibility_timeout_s REAL    NOT NULL,
            backoff_base_s       INTEGER NOT NULL,
            backoff_cap_s        INTEGER NOT NULL,
            worker_id            TEXT,
            claim_deadline       INTEGER,
            last_error           TEXT,
            died_at              INTEGER NOT NULL
        )
        """,
        # Retention purge and the dead count.
        "CREATE INDEX _alkstore_dead_died ON _alkstore_dead (queue, died_at)",
    ),
)

assert len(_MIGRATIONS) == SCHEMA_VERSION

_CREATE_META = """
    CREATE TABLE IF NOT EXISTS _alkstore_meta (
        key   TEXT    PRIMARY KEY,
        value INTEGER NOT NULL
    ) WITHOUT ROWID
"""


def read_version(conn: sqlite3.Connection) -> int | None:
    """Return the stored schema version, ``None`` when there is no schema.

    One statement, so it reads one consistent snapshot.
    """
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM sqlite_schema "
        "               WHERE type = 'table' AND name = '_alkstore_meta')"
    ).fetchone()
    if not row[0]:
        return None
    row = conn.execute("SELECT value FROM _alkstore_meta WHERE key = ?", (_VERSION_KEY,)).fetchone()
    return None if row is None else int(row[0])


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION`; run inside ``BEGIN
    IMMEDIATE``.

    Raises
    ------
    SchemaVersionError
        If the stored version is newer than this code's.
    """
    conn.execute(_CREATE_META)
    found = read_version(conn)
    check_schema_version(found, SCHEMA_VERSION, migrating=True)
    current = found or 0
    for statements in _MIGRATIONS[current:]:
        for statement in statements:
            conn.execute(statement)
    if current < SCHEMA_VERSION:
        conn.execute(
            "INSERT INTO _alkstore_meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (_VERSION_KEY, SCHEMA_VERSION),
        )
