"""The SQLite schema: DDL and versioned, idempotent migrations (docs/contract.md §3
"Schema").

Tables carry the ``_alkstore_`` prefix so they cannot collide with the
application's own tables in the same file:

``_alkstore_jobs``
    Live rows. ``INTEGER PRIMARY KEY AUTOINCREMENT``, so an id is never
    handed out twice, not even after the row with the largest id was
    deleted; ids grow in commit order, which the cross-process wake detector
    (:mod:`alkstore_sqlite._wake`) relies on instead of a table written by
    every enqueue.
``_alkstore_dead``
    Dead letters, keyed by the job's own id.
``_alkstore_meta``
    ``schema_version``.
``_alkstore_queues``
    One row per queue ever paused: ``paused`` is 1 while it is paused
    (:mod:`alkstore_sqlite._operations`). The claim looks its queue up by
    primary key.
``_alkstore_wakes``
    The cross-process wake record of the operations that make work
    claimable without a new job id: ``resume`` and ``requeue``. One row
    per queue, replaced by each such operation, so its ``AUTOINCREMENT`` id
    grows in commit order as job ids do (:mod:`alkstore_sqlite._wake`).
    Enqueues never write it.
``_alkstore_schedules``
    Named schedules (:mod:`alkstore_sqlite._schedules`), found by name or
    in ``next_run_at`` order.
``_alkstore_maintenance``
    Per maintenance task, when its last turn was taken
    (:mod:`alkstore_sqlite._maintenance`).

A live row's ``unique_key`` is unique within its queue (a partial unique
index over the rows that have one); a dead row keeps its key, unindexed.
``_alkstore_completed`` holds the jobs an ack kept (docs/contract.md §3
"Completed jobs"), keyed by the job's id, with ``finished_at`` and
``result``.

A live row's ``state`` is engine-private and finer than the public one
(the contract's ``pending``/``processing``). Each value keeps the row in the one
partial index the claim needs to find it in, so that a claim never walks
rows it cannot hand out:

=============  ==========  ===================================================
state          public      meaning
=============  ==========  ===================================================
``pending``    pending     due (``run_at <= now`` when it was set): the claim
                           walks these in claim order
``scheduled``  pending     ``run_at`` was in the future when it was set
``processing`` processing  a claim that had not lapsed when it was set
``lapsed``     processing  a claim found lapsed, attempts left: reclaimable,
                           walked in claim order like ``pending``
``expired``    (see note)  found expired while ``pending`` or ``lapsed``:
                           waits for ``sweep_expired``, never claimed
=============  ==========  ===================================================

An ``expired`` row is publicly ``processing`` if it holds a claim
(``claim_deadline`` set) and ``pending`` otherwise. ``enqueue`` and
``retry`` choose ``pending`` or ``scheduled``; the claim
(:mod:`alkstore_sqlite._queue`) moves rows whose time-dependent status has
changed since (``scheduled`` that came due, ``processing`` that lapsed,
``pending``/``lapsed`` that expired, and back when an injected clock moved
backwards) before it walks, so each row pays for each move once. Every
statement still checks the instants themselves (``run_at <= now``,
``claim_deadline <= now``, expiry): the state says where to look, never
what is true, so a clock that moves backwards costs at most some skipped
rows, never a wrong answer.

Migrations run inside one ``BEGIN IMMEDIATE`` transaction, which SQLite
serialises across processes: when several processes open a new file at once,
one creates the schema and the others find it done.
"""

from __future__ import annotations

import sqlite3
import time

from alkstore.engine import check_schema_version

__all__ = ["SCHEMA_VERSION", "migrate", "read_version"]

#: The newest schema version this code knows.
SCHEMA_VERSION = 5

_VERSION_KEY = "schema_version"

# Each entry upgrades from the version before it; entry ``i`` makes
# version ``i + 1``. Never edit a released entry: append a new one.
# Statements may use the parameter ``:now`` (microseconds since the epoch,
# from the store's clock).
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
    # Version 2: the engine-private states (module docstring), so that the
    # claim's cost does not grow with future, lapsed or expired rows. SQLite
    # cannot widen a CHECK constraint in place, so the table is rebuilt
    # (SQLite's documented procedure) inside the migration's transaction:
    # one copy of every live row, once. Pending rows whose run_at is still
    # ahead of the store's clock become 'scheduled'; lapsed claims and
    # expired rows are moved by the first claim, as any that appear later.
    # The new table keeps the filter columns in front and the payload last,
    # so reading a row's state and instants never reads its payload's
    # overflow pages. The CHECK says OR, not IN: with more than two values,
    # IN builds a temporary table for every row written.
    (
        """
        CREATE TABLE _alkstore_jobs_v2 (
            id                   INTEGER PRIMARY KEY AUTOINCREMENT,
            queue                TEXT    NOT NULL,
            state                TEXT    NOT NULL CHECK (
                state = 'pending' OR state = 'scheduled' OR state = 'processing'
                OR state = 'lapsed' OR state = 'expired'),
            priority             INTEGER NOT NULL,
            run_at               INTEGER NOT NULL,
            expires_at           INTEGER,
            claim_deadline       INTEGER,
            attempts             INTEGER NOT NULL,
            max_attempts         INTEGER NOT NULL,
            visibility_timeout_s REAL    NOT NULL,
            backoff_base_s       INTEGER NOT NULL,
            backoff_cap_s        INTEGER NOT NULL,
            enqueued_at          INTEGER NOT NULL,
            worker_id            TEXT,
            content_type         TEXT    NOT NULL,
            last_error           TEXT,
            payload              BLOB    NOT NULL
        )
        """,
        """
        INSERT INTO _alkstore_jobs_v2 (
            id, queue, state, priority, run_at, expires_at, claim_deadline,
            attempts, max_attempts, visibility_timeout_s, backoff_base_s,
            backoff_cap_s, enqueued_at, worker_id, content_type, last_error,
            payload)
        SELECT id, queue,
               CASE WHEN state = 'pending' AND run_at > :now THEN 'scheduled' ELSE state END,
               priority, run_at, expires_at, claim_deadline, attempts, max_attempts,
               visibility_timeout_s, backoff_base_s, backoff_cap_s, enqueued_at,
               worker_id, content_type, last_error, payload
        FROM _alkstore_jobs ORDER BY id
        """,
        # AUTOINCREMENT's high-water mark moves with the table: the copy set
        # the new table's to its largest id, the old one may be higher (the
        # newest job was acked). DROP TABLE forgets a table's entry and
        # RENAME carries it over.
        "DELETE FROM sqlite_sequence WHERE name = '_alkstore_jobs_v2'",
        "UPDATE sqlite_sequence SET name = '_alkstore_jobs_v2' WHERE name = '_alkstore_jobs'",
        "DROP TABLE _alkstore_jobs",
        # Legacy mode: the rename leaves the application's views on
        # _alkstore_jobs alone (they name the table the rename brings back)
        # instead of failing on them. migrate() turns it off again.
        "PRAGMA legacy_alter_table = ON",
        "ALTER TABLE _alkstore_jobs_v2 RENAME TO _alkstore_jobs",
        "PRAGMA legacy_alter_table = OFF",
        # The claim walks these two in claim order and stops after n rows;
        # every row in them is claimable but for an instant that moved
        # backwards.
        """
        CREATE INDEX _alkstore_jobs_pending
            ON _alkstore_jobs (queue, priority DESC, run_at, id)
            WHERE state = 'pending'
        """,
        """
        CREATE INDEX _alkstore_jobs_lapsed
            ON _alkstore_jobs (queue, priority DESC, run_at, id)
            WHERE state = 'lapsed'
        """,
        # Future rows, in the order they come due.
        """
        CREATE INDEX _alkstore_jobs_scheduled
            ON _alkstore_jobs (queue, run_at)
            WHERE state = 'scheduled'
        """,
        # Live claims, in the order they lapse.
        """
        CREATE INDEX _alkstore_jobs_processing
            ON _alkstore_jobs (queue, claim_deadline)
            WHERE state = 'processing'
        """,
        # Rows that can expire, per state: the claim finds the newly expired
        # pending and lapsed rows, sweep_expired every expired row.
        """
        CREATE INDEX _alkstore_jobs_expiry
            ON _alkstore_jobs (queue, state, expires_at)
            WHERE expires_at IS NOT NULL
        """,
    ),
    # Version 3: pause, requeue, schedules and maintenance turns. New tables
    # and one index on the dead table; the live table is left as it was, so
    # no enqueue writes more than before. Queue listing walks the indexes
    # that lead with the queue name: the live table's partial indexes
    # together cover every state (an 'expired' row always has an
    # expires_at), the dead table's, and the paused queues'.
    (
        """
        CREATE TABLE _alkstore_queues (
            name   TEXT    PRIMARY KEY,
            paused INTEGER NOT NULL CHECK (paused = 0 OR paused = 1)
        ) WITHOUT ROWID
        """,
        # Queue listing: the paused ones, without walking resumed ones.
        "CREATE INDEX _alkstore_queues_paused ON _alkstore_queues (name) WHERE paused = 1",
        """
        CREATE TABLE _alkstore_wakes (
            id    INTEGER PRIMARY KEY AUTOINCREMENT,
            queue TEXT    NOT NULL UNIQUE
        )
        """,
        # A dead-letter page (queue = ? AND id > ? ORDER BY id): an index
        # entry ends with the rowid, which is the job id.
        "CREATE INDEX _alkstore_dead_queue ON _alkstore_dead (queue)",
        """
        CREATE TABLE _alkstore_schedules (
            name          TEXT    PRIMARY KEY,
            spec          TEXT    NOT NULL,
            timezone      TEXT    NOT NULL,
            queue         TEXT    NOT NULL,
            content_type  TEXT    NOT NULL,
            options       TEXT    NOT NULL,
            revision      INTEGER NOT NULL,
            created_at    INTEGER NOT NULL,
            next_run_at   INTEGER NOT NULL,
            last_run_at   INTEGER,
            last_job_id   INTEGER,
            payload_bytes BLOB    NOT NULL
        )
        """,
        # A tick's due schedules, in the order it fires them.
        """
        CREATE INDEX _alkstore_schedules_due
            ON _alkstore_schedules (next_run_at, name)
        """,
        """
        CREATE TABLE _alkstore_maintenance (
            task        TEXT    PRIMARY KEY,
            last_run_at INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
    ),
    # Version 4: unique keys (docs/contract.md §3 "Unique keys") and
    # completed jobs ("Completed jobs"). A unique_key column on both tables
    # (a dead row keeps its key, and requeue brings it back) and a partial
    # unique index over the live rows that have one: the index, not a check
    # before the insert, keeps two live jobs of a queue from sharing a key.
    # Rows without a key are not in it, so a plain enqueue writes no more
    # than before. Adding a column rewrites no row. Completed jobs, kept by
    # an ack when the queue keeps them, get a table of their own, as dead
    # ones do: the claim's indexes never hold them, however many are kept.
    (
        "ALTER TABLE _alkstore_jobs ADD COLUMN unique_key TEXT",
        "ALTER TABLE _alkstore_dead ADD COLUMN unique_key TEXT",
        """
        CREATE UNIQUE INDEX _alkstore_jobs_unique
            ON _alkstore_jobs (queue, unique_key)
            WHERE unique_key IS NOT NULL
        """,
        """
        CREATE TABLE _alkstore_completed (
            id                   INTEGER PRIMARY KEY,
            queue                TEXT    NOT NULL,
            finished_at          INTEGER NOT NULL,
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
            unique_key           TEXT,
            content_type         TEXT    NOT NULL,
            payload              BLOB    NOT NULL,
            result               BLOB
        )
        """,
        # The retention purge, and the queue listing.
        """
        CREATE INDEX _alkstore_completed_finished
            ON _alkstore_completed (queue, finished_at)
        """,
    ),
    # Version 5: the workers registry and the per-minute throughput the
    # workers report (docs/contract.md §11). Both small: one row per live
    # worker (silent ones are deleted by the next refresh of any worker),
    # one per queue per minute for a day. Queues and running ids are JSON
    # arrays; expires_at is last_seen_at + ttl_s, what the listing compares.
    (
        """
        CREATE TABLE _alkstore_workers (
            id           TEXT    PRIMARY KEY,
            host         TEXT    NOT NULL,
            pid          INTEGER NOT NULL,
            queues       TEXT    NOT NULL,
            concurrency  INTEGER NOT NULL,
            started_at   INTEGER NOT NULL,
            last_seen_at INTEGER NOT NULL,
            running      TEXT    NOT NULL,
            ttl_s        REAL    NOT NULL,
            expires_at   INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE _alkstore_throughput (
            queue     TEXT    NOT NULL,
            minute    INTEGER NOT NULL,
            completed INTEGER NOT NULL,
            retried   INTEGER NOT NULL,
            dead      INTEGER NOT NULL,
            PRIMARY KEY (queue, minute)
        ) WITHOUT ROWID
        """,
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


def migrate(conn: sqlite3.Connection, now: int | None = None) -> None:
    """Bring the schema to :data:`SCHEMA_VERSION`; run inside ``BEGIN
    IMMEDIATE``.

    Parameters
    ----------
    now
        The store's clock, microseconds since the epoch (default: the system
        clock); migrations that sort rows by time use it.

    Raises
    ------
    SchemaVersionError
        If the stored version is newer than this code's.
    """
    conn.execute(_CREATE_META)
    found = read_version(conn)
    check_schema_version(found, SCHEMA_VERSION, migrating=True)
    current = found or 0
    params = {"now": time.time_ns() // 1000 if now is None else now}
    try:
        for statements in _MIGRATIONS[current:]:
            for statement in statements:
                conn.execute(statement, params)
    finally:
        # Also after a failure: the connection goes back to the pool.
        conn.execute("PRAGMA legacy_alter_table = OFF")
    if current < SCHEMA_VERSION:
        conn.execute(
            "INSERT INTO _alkstore_meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (_VERSION_KEY, SCHEMA_VERSION),
        )
