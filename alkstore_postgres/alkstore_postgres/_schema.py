"""The PostgreSQL schema: DDL, versioned migrations and statement rendering
(docs/contract.md §3 "Schema").

Every table lives in the store's own schema (default ``alkstore``, engine
option ``schema=``), so none can collide with the application's tables:

``jobs``
    Live rows. The id is a ``bigint`` identity: a sequence never hands out
    a value twice, so ids are never reused, not after ack, cancel or purge.
``dead``
    Dead letters, keyed by the job's own id.
``meta``
    ``schema_version``.
``queues``
    One row per queue that was ever paused: ``paused`` is the durable pause
    flag every claim checks (a primary-key probe inside the claim).
``schedules``
    Named schedules (``alkstore.contract.schedule.SCHEDULE_COLUMNS``), keyed by
    name; ``schedules_due`` orders them by ``next_run_at`` for the ticks.
``maintenance``
    One row per maintenance task (the expiry sweep, ...): when its next
    turn may be taken, whoever takes it.

A live row's ``state`` is engine-private and finer than the public one
(the contract's ``pending``/``processing``), so that a claim never walks rows it
cannot hand out (the same five states as the SQLite engine's, D16 and D25):

==============  ==========  ================================================
state           public      meaning
==============  ==========  ================================================
``pending``     pending     due when it was set: the claim walks
                            ``jobs_pending`` in claim order
``scheduled``   pending     ``run_at`` was in the future when it was set
                            (enqueue, retry); ``jobs_scheduled`` holds them
                            in the order they come due
``processing``  processing  a claim that had not lapsed when it was set;
                            ``jobs_processing`` holds them in the order
                            they lapse
``lapsed``      processing  a claim found lapsed with attempts left:
                            reclaimable, walked in claim order in
                            ``jobs_lapsed`` like ``pending``
``expired``     (see note)  found expired while ``pending`` or ``lapsed``
                            (or when it came due or lapsed): waits for
                            ``sweep_expired``, never claimed
==============  ==========  ================================================

An ``expired`` row is publicly ``processing`` if it holds a claim
(``claim_deadline`` set) and ``pending`` otherwise. The claim
(:mod:`alkstore_postgres._queue`) moves the rows whose time-dependent
status changed since the last claim (``scheduled`` that came due,
``processing`` that lapsed, ``pending``/``lapsed`` that expired, and back
when an injected clock moved backwards), each from the due end of an index
range, so each row is moved once per change. Every statement still checks
the instants themselves (``run_at <= now``, ``claim_deadline <= now``,
expiry): the state says where to look, never what is true, so an injected
clock that moves backwards costs at most some skipped rows, never a wrong
answer. Rows that version 1 wrote as ``pending`` with a future ``run_at``
were only walked over; version 3's migration moves them to ``scheduled``.
Version 4 rewrote no row: claims that lapsed and rows that expired under
version 3 are moved by the first claim. A live row's ``unique_key`` is
unique within its queue (``jobs_unique``, a partial unique index over the
rows that have one); a dead row keeps its key, unindexed. ``completed``
holds the jobs an ack kept (docs/contract.md §3 "Completed jobs"), keyed by
the job's id, with ``finished_at`` and ``result``; ``completed_finished``
serves the retention purge and the queue listing.

Indexes keep the hot paths independent of the backlog: a claim walks
``jobs_pending`` and ``jobs_lapsed`` in claim order and stops after ``n``
rows of each, and takes the due end of ``jobs_scheduled``, the lapsed end of
``jobs_processing`` (claims that lapsed since the last claim: the exhausted
ones are dead-lettered, the others become ``lapsed``) and the expired end of
``jobs_expiry``'s ``pending`` and ``lapsed`` ranges; dead rows are in
another table. ``sweep_expired`` reads ``jobs_expiry`` (one range per
state) and the retention purge ``dead_died``; the dead-letter pages are
ranges of ``dead_queue`` (``queue, id``). The queue listing is a "loose
index scan" (a recursive CTE that jumps from one queue name to the next)
over ``jobs_pending``, ``jobs_scheduled``, ``jobs_processing``,
``jobs_lapsed`` (each partial index holds one state), ``jobs_expiry`` (every
``expired`` row has an ``expires_at``) and ``dead_queue``: one descent per
queue name and index, however many jobs wait.

Migrations run in one transaction under an advisory lock keyed by the
schema name, so when many processes open a store at once one of them
migrates and the others wait, then find the work done
(:mod:`alkstore_postgres._migrate`, which runs the statements of this
module: the DDL and the rendering of statements, shared by the sync and the
async engine).
"""

from __future__ import annotations

import hashlib
import re

from psycopg import sql

from alkstore.errors import ValidationError

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "Statement",
    "StatementCache",
    "check_schema_name",
    "migration_lock_key",
    "numbered",
    "render",
]

#: The schema used when the ``schema=`` option is not given.
DEFAULT_SCHEMA = "alkstore"
#: The newest schema version this code knows.
SCHEMA_VERSION = 7

_VERSION_KEY = "schema_version"
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]*")
# PostgreSQL truncates identifiers longer than NAMEDATALEN - 1 bytes.
_MAX_IDENTIFIER_BYTES = 63
_RESERVED_SCHEMAS = frozenset({"public", "information_schema"})

# Each entry upgrades from the version before it; entry ``i`` makes version
# ``i + 1``. Never edit a released entry: append a new one.
_MIGRATIONS: tuple[tuple[sql.SQL, ...], ...] = (
    (
        sql.SQL("""
        CREATE TABLE {jobs} (
            id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            queue                text             NOT NULL,
            state                text             NOT NULL
                                 CHECK (state IN ('pending', 'processing')),
            payload              bytea            NOT NULL,
            content_type         text             NOT NULL,
            priority             integer          NOT NULL,
            run_at               timestamptz      NOT NULL,
            expires_at           timestamptz,
            enqueued_at          timestamptz      NOT NULL,
            attempts             integer          NOT NULL DEFAULT 0,
            max_attempts         integer          NOT NULL,
            visibility_timeout_s double precision NOT NULL,
            backoff_base_s       bigint           NOT NULL,
            backoff_cap_s        integer          NOT NULL,
            worker_id            text,
            claim_deadline       timestamptz,
            last_error           text
        )
        """),
        # The claim walks this in claim order and stops after n rows.
        sql.SQL("""
        CREATE INDEX jobs_pending ON {jobs} (queue, priority DESC, run_at, id)
            WHERE state = 'pending'
        """),
        # Lapsed claims (reclaims and the claim's dead-letter step) are a
        # range of this; also the processing count.
        sql.SQL("""
        CREATE INDEX jobs_processing ON {jobs} (queue, claim_deadline)
            WHERE state = 'processing'
        """),
        # sweep_expired.
        sql.SQL("""
        CREATE INDEX jobs_expiry ON {jobs} (queue, expires_at)
            WHERE expires_at IS NOT NULL
        """),
        sql.SQL("""
        CREATE TABLE {dead} (
            id                   bigint           PRIMARY KEY,
            queue                text             NOT NULL,
            payload              bytea            NOT NULL,
            content_type         text             NOT NULL,
            priority             integer          NOT NULL,
            run_at               timestamptz      NOT NULL,
            expires_at           timestamptz,
            enqueued_at          timestamptz      NOT NULL,
            attempts             integer          NOT NULL,
            max_attempts         integer          NOT NULL,
            visibility_timeout_s double precision NOT NULL,
            backoff_base_s       bigint           NOT NULL,
            backoff_cap_s        integer          NOT NULL,
            worker_id            text,
            claim_deadline       timestamptz,
            last_error           text,
            died_at              timestamptz      NOT NULL
        )
        """),
        # The retention purge and the dead count.
        sql.SQL("CREATE INDEX dead_died ON {dead} (queue, died_at)"),
    ),
    # Version 2: the private state 'scheduled' and claim-ordered indexes
    # (module docstring), so that neither future jobs nor lapsed claims are
    # in the claim's path. Existing rows keep their state: pending rows with
    # a future run_at stay correct, only walked over by claims until they
    # are claimed (retries and new enqueues use 'scheduled').
    (
        # Re-adding the CHECK scans the table once, under the migration's
        # lock; the constraint keeps the name version 1 gave it.
        sql.SQL("""
        ALTER TABLE {jobs}
            DROP CONSTRAINT jobs_state_check,
            ADD CONSTRAINT jobs_state_check
                CHECK (state IN ('pending', 'scheduled', 'processing'))
        """),
        # Future rows, in the order they come due: the claim takes the due
        # end of it (the rows it moves to pending, or claims at once).
        sql.SQL("""
        CREATE INDEX jobs_scheduled ON {jobs} (queue, run_at)
            WHERE state = 'scheduled'
        """),
        # Reclaims: every claim in claim order, the deadline a key column so
        # the "lapsed" test runs inside the index. The walk stops after n
        # lapsed rows and steps over live claims only (as many as the
        # workers hold), without visiting their heap rows.
        sql.SQL("""
        CREATE INDEX jobs_reclaim ON {jobs} (queue, priority DESC, run_at, id, claim_deadline)
            WHERE state = 'processing'
        """),
        # Claims on their last allowed attempt, in the order they lapse: the
        # claim's dead-letter step is the lapsed end of it, and moves every
        # row it finds.
        sql.SQL("""
        CREATE INDEX jobs_exhausted ON {jobs} (queue, claim_deadline)
            WHERE state = 'processing' AND attempts >= max_attempts
        """),
        # Replaced by the two above (it made the dead-letter step and the
        # reclaim walk every lapsed claim).
        sql.SQL("DROP INDEX {schema}.jobs_processing"),
    ),
    # Version 3: queue pause, dead-letter pages, schedules, maintenance
    # turns; and the leftover of version 2 (below).
    (
        # The claim probes this by primary key; a row stays (paused false)
        # after a resume.
        sql.SQL("""
        CREATE TABLE {queues} (
            name   text    PRIMARY KEY,
            paused boolean NOT NULL
        )
        """),
        # dead_jobs() pages (queue = ? AND id > ? ORDER BY id) and the
        # queue listing's loose scan of the dead table.
        sql.SQL("CREATE INDEX dead_queue ON {dead} (queue, id)"),
        sql.SQL("""
        CREATE TABLE {schedules} (
            name          text        PRIMARY KEY,
            spec          text        NOT NULL,
            timezone      text        NOT NULL,
            queue         text        NOT NULL,
            payload_bytes bytea       NOT NULL,
            content_type  text        NOT NULL,
            options       text        NOT NULL,
            revision      bigint      NOT NULL,
            created_at    timestamptz NOT NULL,
            next_run_at   timestamptz NOT NULL,
            last_run_at   timestamptz,
            last_job_id   bigint
        )
        """),
        # A tick reads the due end of this.
        sql.SQL("CREATE INDEX schedules_due ON {schedules} (next_run_at)"),
        sql.SQL("""
        CREATE TABLE {maintenance} (
            task        text        PRIMARY KEY,
            last_run_at timestamptz NOT NULL
        )
        """),
        # Rows version 1 wrote as 'pending' with a future run_at leave the
        # claim's path (version 2 left them there, walked over). "Future" is
        # the migrating store's clock (the server's unless one is injected);
        # any instant is correct, since every statement checks run_at itself
        # and the claim takes due 'scheduled' rows. Idempotent: a second run
        # finds none. One scan of the table, under the migration's lock.
        sql.SQL("""
        UPDATE {jobs} SET state = 'scheduled'
        WHERE state = 'pending'
          AND run_at > coalesce(%(now)s::timestamptz, statement_timestamp())
        """),
        # Every vacuum also cleans the indexes. By default PostgreSQL skips
        # that when under 2% of the pages hold dead rows, and on a big table
        # that leaves tens of thousands of acked jobs' entries in the claim
        # walk's indexes: a claim at a million waiting cost 1.2-1.3x the one
        # at ten thousand without this, 0.95-1.05x with it (bench/README.md).
        sql.SQL("ALTER TABLE {jobs} SET (vacuum_index_cleanup = on)"),
    ),
    # Version 4: the private states 'lapsed' and 'expired' (module
    # docstring), so that neither live claims nor expired rows are in the
    # claim's path (docs/decisions.md D25). No row is rewritten: the first
    # claim of each queue moves its lapsed claims and expired rows, as it
    # moves any that appear later.
    (
        # Widening only, so no row can fail it; the re-check scans the
        # table once, under the migration's lock.
        sql.SQL("""
        ALTER TABLE {jobs}
            DROP CONSTRAINT jobs_state_check,
            ADD CONSTRAINT jobs_state_check
                CHECK (state IN ('pending', 'scheduled', 'processing', 'lapsed', 'expired'))
        """),
        # Reclaimable claims, walked in claim order like jobs_pending.
        sql.SQL("""
        CREATE INDEX jobs_lapsed ON {jobs} (queue, priority DESC, run_at, id)
            WHERE state = 'lapsed'
        """),
        # Live claims in the order they lapse: the claim takes the lapsed
        # end of it (the claims that lapsed since the last claim, exhausted
        # or not), and the processing count is a range of it.
        sql.SQL("""
        CREATE INDEX jobs_processing ON {jobs} (queue, claim_deadline)
            WHERE state = 'processing'
        """),
        # The claim walk no longer steps over live claims, and the
        # dead-letter step is a part of jobs_processing's lapsed end, which
        # the claim empties at each run.
        sql.SQL("DROP INDEX {schema}.jobs_reclaim"),
        sql.SQL("DROP INDEX {schema}.jobs_exhausted"),
        # Rows that can expire, per state: the claim finds the newly expired
        # pending and lapsed rows (and 'expired' ones an injected clock
        # moved back before their expiry), sweep_expired every expired row
        # with one range per state, the queue listing every 'expired' row.
        sql.SQL("DROP INDEX {schema}.jobs_expiry"),
        sql.SQL("""
        CREATE INDEX jobs_expiry ON {jobs} (queue, state, expires_at)
            WHERE expires_at IS NOT NULL
        """),
    ),
    # Version 5: autovacuum settings for a queue's table (docs/decisions.md
    # D29, docs/operations.md "Long transactions"). Every job is inserted,
    # updated at least once and deleted, so the jobs table holds few live
    # rows and many dead ones: by default autovacuum waits for 20% of the
    # table to be dead (50 rows plus the scale factor times the live rows),
    # which on a table that is nearly empty between bursts and large during
    # them is either constantly or far too late. A fixed threshold, no
    # scale, and no cost delay: the table is small when it is clean, so an
    # unthrottled vacuum of it is short. No row is touched. None of this
    # helps while a transaction elsewhere holds the xmin horizon: vacuum
    # then cannot remove what that transaction might still see.
    (
        sql.SQL("""
        ALTER TABLE {jobs} SET (
            autovacuum_vacuum_scale_factor = 0,
            autovacuum_vacuum_threshold = 1000,
            autovacuum_vacuum_insert_scale_factor = 0,
            autovacuum_vacuum_insert_threshold = 1000,
            autovacuum_vacuum_cost_delay = 0
        )
        """),
    ),
    # Version 6: unique keys (docs/contract.md §3 "Unique keys") and
    # completed jobs ("Completed jobs"). A unique_key column on both tables
    # (a dead row keeps its key, and requeue brings it back), added without
    # a default, so no row is rewritten, and a partial unique index over the
    # live rows that have one: the index, not a check before the insert,
    # keeps two live jobs of a queue from sharing a key, and an enqueue of a
    # key another transaction is inserting waits for that transaction's end.
    # Rows without a key are not in it. Completed jobs, kept by an ack when
    # the queue keeps them, get a table of their own, as dead ones do: the
    # claim's indexes never hold them, however many are kept.
    (
        sql.SQL("ALTER TABLE {jobs} ADD COLUMN unique_key text"),
        sql.SQL("ALTER TABLE {dead} ADD COLUMN unique_key text"),
        sql.SQL("""
        CREATE UNIQUE INDEX jobs_unique ON {jobs} (queue, unique_key)
            WHERE unique_key IS NOT NULL
        """),
        sql.SQL("""
        CREATE TABLE {completed} (
            id                   bigint      PRIMARY KEY,
            queue                text        NOT NULL,
            payload              bytea       NOT NULL,
            content_type         text        NOT NULL,
            priority             integer     NOT NULL,
            run_at               timestamptz NOT NULL,
            expires_at           timestamptz,
            enqueued_at          timestamptz NOT NULL,
            attempts             integer     NOT NULL,
            max_attempts         integer     NOT NULL,
            visibility_timeout_s double precision NOT NULL,
            backoff_base_s       integer     NOT NULL,
            backoff_cap_s        integer     NOT NULL,
            worker_id            text,
            claim_deadline       timestamptz,
            last_error           text,
            unique_key           text,
            finished_at          timestamptz NOT NULL,
            result               bytea
        )
        """),
        # The retention purge, and the queue listing.
        sql.SQL("CREATE INDEX completed_finished ON {completed} (queue, finished_at)"),
    ),
    # Version 7: the workers registry and the per-minute throughput the
    # workers report (docs/contract.md §11). Both small: one row per live
    # worker (silent ones are deleted by the next refresh of any worker),
    # one per queue per minute for a day. expires_at is last_seen_at +
    # ttl_s, what the listing compares.
    (
        sql.SQL("""
        CREATE TABLE {workers} (
            id           text             PRIMARY KEY,
            host         text             NOT NULL,
            pid          integer          NOT NULL,
            queues       text[]           NOT NULL,
            concurrency  integer          NOT NULL,
            started_at   timestamptz      NOT NULL,
            last_seen_at timestamptz      NOT NULL,
            running      bigint[]         NOT NULL,
            ttl_s        double precision NOT NULL,
            expires_at   timestamptz      NOT NULL
        )
        """),
        sql.SQL("""
        CREATE TABLE {throughput} (
            queue     text        NOT NULL,
            minute    timestamptz NOT NULL,
            completed bigint      NOT NULL,
            retried   bigint      NOT NULL,
            dead      bigint      NOT NULL,
            PRIMARY KEY (queue, minute)
        )
        """),
    ),
)

assert len(_MIGRATIONS) == SCHEMA_VERSION

_CREATE_SCHEMA = sql.SQL("CREATE SCHEMA {schema}")
_CREATE_META = sql.SQL("""
    CREATE TABLE IF NOT EXISTS {meta} (
        key   text    PRIMARY KEY,
        value integer NOT NULL
    )
""")
_READ_VERSION = sql.SQL("SELECT value FROM {meta} WHERE key = %s")
_WRITE_VERSION = sql.SQL("""
    INSERT INTO {meta} (key, value) VALUES (%s, %s)
    ON CONFLICT (key) DO UPDATE SET value = excluded.value
""")


def check_schema_name(name: object) -> str:
    """Check the ``schema=`` engine option.

    A schema name is ``[a-z_][a-z0-9_]*``, at most 63 bytes (longer names
    would be truncated by PostgreSQL), not ``public``,
    ``information_schema`` or ``pg_*`` (the application's and the system's).

    Raises
    ------
    ValidationError
        For any other value.
    """
    if not isinstance(name, str):
        raise ValidationError(f"schema must be a str, not {type(name).__name__}")
    if not _SCHEMA_NAME.fullmatch(name):
        raise ValidationError(
            f"schema {name!r} must match [a-z_][a-z0-9_]* (lower-case letters, digits, '_')"
        )
    if len(name.encode()) > _MAX_IDENTIFIER_BYTES:
        raise ValidationError(
            f"schema {name!r} is longer than PostgreSQL's {_MAX_IDENTIFIER_BYTES}-byte "
            "identifier limit"
        )
    if name in _RESERVED_SCHEMAS or name.startswith("pg_"):
        raise ValidationError(
            f"schema {name!r} is reserved; alkstore needs a schema of its own "
            f"(default {DEFAULT_SCHEMA!r})"
        )
    return name


class Statement:
    """A statement template: SQL whose ``{jobs}``, ``{dead}``, ``{meta}``,
    ``{queues}``, ``{schedules}``, ``{maintenance}``, ``{workers}``,
    ``{throughput}`` and ``{schema}`` are the
    store's names, plus named fragments (column lists, literals) filled in
    at the same time.

    Parameters
    ----------
    template
        The SQL, with ``%(name)s`` parameters.
    **fragments
        Other ``{name}`` replacements.
    """

    __slots__ = ("fragments", "template")

    def __init__(self, template: sql.SQL, **fragments: sql.Composable) -> None:
        self.template = template
        self.fragments = fragments


def render(statement: Statement | sql.SQL, schema: str) -> bytes:
    """Render a statement for ``schema``.

    ``{schema}`` and the table names (``{jobs}``, ``{dead}``, ``{completed}``, ``{meta}``,
    ``{queues}``, ``{schedules}``, ``{maintenance}``, ``{workers}``,
    ``{throughput}``) become the quoted,
    schema-qualified names; the result is what psycopg sends (and keys its
    prepared statements by), so callers render each statement once.
    """
    if isinstance(statement, sql.SQL):
        statement = Statement(statement)
    return statement.template.format(
        schema=sql.Identifier(schema),
        jobs=sql.Identifier(schema, "jobs"),
        dead=sql.Identifier(schema, "dead"),
        completed=sql.Identifier(schema, "completed"),
        meta=sql.Identifier(schema, "meta"),
        queues=sql.Identifier(schema, "queues"),
        schedules=sql.Identifier(schema, "schedules"),
        maintenance=sql.Identifier(schema, "maintenance"),
        workers=sql.Identifier(schema, "workers"),
        throughput=sql.Identifier(schema, "throughput"),
        **statement.fragments,
    ).as_bytes(None)


class StatementCache:
    """The engine's statements rendered for one store's schema, each once
    (``PostgresStore.sql``)."""

    __slots__ = ("_rendered", "_schema")

    def __init__(self, schema: str) -> None:
        self._schema = schema
        self._rendered: dict[int, bytes] = {}

    def __call__(self, statement: Statement | sql.SQL) -> bytes:
        """The statement rendered for the schema (cached by the statement
        object's identity: statements are module constants)."""
        key = id(statement)
        rendered = self._rendered.get(key)
        if rendered is None:
            rendered = self._rendered[key] = render(statement, self._schema)
        return rendered


_NAMED_PARAMETER = re.compile(rb"%\((\w+)\)s|%%")


def numbered(query: bytes, names: tuple[str, ...]) -> bytes:
    """``query`` (a :func:`render` result) with PostgreSQL's own numbered
    parameters, for a ``psycopg.RawCursor``: ``%(name)s`` becomes ``$k``,
    ``k`` its 1-based place in ``names``, and ``%%`` becomes ``%``.

    psycopg parses a named-parameter query at every call when its text is
    over 4 kB (``MAX_CACHED_STATEMENT_LENGTH``), which cost the claim
    0.06 ms per call; a raw query is sent as it is. The parameters are then
    passed as a sequence in the order of ``names``.

    Raises
    ------
    KeyError
        If ``query`` names a parameter missing from ``names``.
    """
    places = {name.encode(): b"$%d" % place for place, name in enumerate(names, 1)}

    def replace(match: re.Match[bytes]) -> bytes:
        return b"%" if match[1] is None else places[match[1]]

    return _NAMED_PARAMETER.sub(replace, query)


def migration_lock_key(schema: str) -> int:
    """The advisory lock key of migrations of the store schema ``schema``."""
    digest = hashlib.blake2b(f"alkstore migrate {schema}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)
