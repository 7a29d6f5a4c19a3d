"""The statements of a queue's operations (:mod:`alkstore_postgres._queue`):
enqueue, claim, ack, cancel, read, sweep and count, and the values they bind.

Every operation is one statement on an autocommit pool connection: one
round trip, one transaction. Each binds one reading of the store's clock as
``now``, so a statement never reads a clock of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import sql

from alkstore import Job, SweepResult
from alkstore.engine import EXPIRED, MAX_ATTEMPTS_EXCEEDED, EncodedPayload, Resolved, duration
from alkstore_postgres._connection import ByteaArray
from alkstore_postgres._rows import COMPLETED_COLUMNS, DEAD_COLUMNS, LIVE_COLUMNS, MOVED_COLUMNS
from alkstore_postgres._schema import Statement, numbered, render

__all__ = [
    "ACK_BATCH",
    "ACK_MANY",
    "CANCEL",
    "COMPLETE_BATCH",
    "COMPLETE_MANY",
    "CLAIM",
    "CLAIM_PARAMETERS",
    "DEADLOCK_ATTEMPTS",
    "GET_JOB",
    "INSERT",
    "INSERT_MANY",
    "INSERT_UNIQUE",
    "INT64_MAX",
    "INT64_MIN",
    "LAPSED_CLAIMS",
    "LITERAL_N_MAX",
    "POWER_OF_TWO_N_MAX",
    "STATS",
    "SWEEP_EXPIRED",
    "UNIQUE_ATTEMPTS",
    "claim_is_prepared",
    "claim_order",
    "claim_query",
    "insert",
    "insert_unique",
    "inserted_ids",
    "stamps",
    "sweep_params",
    "sweep_result",
]

#: Job ids are bigint: a larger int cannot name a job (and would not bind).
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: How many times an ack batch runs when PostgreSQL aborts it as a deadlock victim.
DEADLOCK_ATTEMPTS = 3

_COLUMNS = sql.SQL(
    "queue, state, payload, content_type, priority, run_at, expires_at, enqueued_at, "
    "max_attempts, visibility_timeout_s, backoff_base_s, backoff_cap_s"
)

# The wake is sent in the enqueueing transaction, so only a commit wakes
# anyone, and it carries no job body (docs/contract.md §3 "Wake"). The ``wake`` CTE has a
# volatile function, so PostgreSQL evaluates it exactly once. One statement
# on an autocommit connection: one round trip, and the commit is the
# statement's own (no BEGIN and COMMIT exchanges).
#
# The enqueue statements take positional ``%s`` parameters: the queue, the
# state, the payload(s), then :func:`stamps`, then the channel.
INSERT = Statement(
    sql.SQL("""
    WITH ins AS (
        INSERT INTO {jobs} ({columns})
        VALUES (%s, %s, %s, %s, %s, %s, %s::timestamptz, %s, %s, %s, %s, %s)
        RETURNING id
    ), wake AS (
        SELECT pg_notify(%s, '')
    )
    SELECT ins.id FROM ins, wake
"""),
    columns=_COLUMNS,
)

# A job with a unique key (docs/contract.md §3 "Unique keys"): the partial
# unique index jobs_unique decides, so two enqueues of one key never both
# store a row; one whose key another transaction is inserting waits for
# that transaction's end. Stored nothing: the row holding the key, as the
# statement's snapshot shows it. A holder that committed after the snapshot
# was taken (the insert waited for it) is not in it, and nor is one deleted
# since: then no row comes back, and the caller runs the statement again,
# with a new snapshot (UNIQUE_ATTEMPTS). Parameters: as INSERT's, then the
# key, then the queue and the key again.
INSERT_UNIQUE = Statement(
    sql.SQL("""
    WITH ins AS (
        INSERT INTO {jobs} ({columns}, unique_key)
        VALUES (%s, %s, %s, %s, %s, %s, %s::timestamptz, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
        RETURNING id
    ), wake AS (
        SELECT pg_notify(%s, '') FROM ins
    )
    SELECT ins.id FROM ins, wake
    UNION ALL
    SELECT id FROM {jobs}
    WHERE queue = %s AND unique_key = %s AND NOT EXISTS (SELECT FROM ins)
"""),
    columns=_COLUMNS,
)
#: How many times :data:`INSERT_UNIQUE` runs before giving up: each run
#: after the first has a snapshot in which the holder it met is visible,
#: so a second run fails only when the key changed hands again in between.
UNIQUE_ATTEMPTS = 5

# One round trip for any number of jobs: the payloads travel as one bytea
# array, and their content types as one value when they share it (then the
# text array is empty, and unnest pads it with NULLs) or as a text array.
# The identity default is evaluated above the sort on the ordinality, so the
# ids increase in list order; they come back as one array.
INSERT_MANY = Statement(
    sql.SQL("""
    WITH ins AS (
        INSERT INTO {jobs} ({columns})
        SELECT %s, %s, p.payload, coalesce(p.content_type, %s), %s,
               %s, %s::timestamptz, %s, %s, %s, %s, %s
        FROM unnest(%s::bytea[], %s::text[]) WITH ORDINALITY AS p (payload, content_type, ord)
        ORDER BY p.ord
        RETURNING id
    ), wake AS (
        SELECT pg_notify(%s, '')
    )
    SELECT array_agg(ins.id) FROM ins, wake
"""),
    columns=_COLUMNS,
)

# One statement, in steps that each touch only rows they act on (none at
# all while the queue is paused: ``paused`` gates every step). Rows that are
# not claimable now live in private states of their own ('scheduled',
# 'processing', 'expired'; see _schema), so the two walks never pass over
# them, however many there are; time moves rows between states without a
# write, so the claim first takes the rows whose status changed since the
# last claim, each from the "now" end of an index range:
# (1) ``past_deadline`` locks this queue's claims that lapsed (the lapsed
#     end of ``jobs_processing``, one walk for both kinds, since each walk
#     costs the claim about 0.03 ms); the exhausted ones move to the dead
#     table;
# (2) ``came_due`` locks the scheduled rows that came due (``jobs_scheduled``),
#     ``newly_lapsed`` is the rest of (1), with attempts left, ``newly_expired``
#     the pending and lapsed rows that expired, and ``not_expired`` the
#     'expired' rows an injected clock moved back before their expiry (the
#     ranges of ``jobs_expiry``);
# (3) ``due`` walks ``jobs_pending`` and ``lapsed`` walks ``jobs_lapsed`` in
#     claim order, each locking up to n eligible rows and skipping rows
#     other claimers hold;
# (4) the best n of the walks and of the rows of (2) that are claimable
#     are claimed; ``moves`` gives the rows of (2) not claimed their new
#     state (as the SQLite engine's moves do), where later claims find them.
# Every CTE reads the statement's one snapshot, so a row a CTE modified is
# invisible to the others as modified (a second UPDATE of it would be
# silently skipped): the steps' row sets are disjoint by their state (and
# expiry) in that snapshot, and a row of (2) is claimed straight from its
# old state rather than moved first. The rows of (2) are few (those whose
# status changed since the last claim), so merging them into the sort costs
# what moving them does: each row is moved once per change. A walk in the
# snapshot still steps over the pending or lapsed rows that (2) moves out
# of its index in the same statement: once. Rows locked but not picked are
# released at commit. Row locks plus the re-check of the WHERE clause on the
# newest row version make the hand-out exactly-once.
#
# The moves' ranges are written as ranges with both ends, "now" behind a
# subquery: then PostgreSQL estimates each at half a percent of its index
# (a range with an unknown end), in the generic plan and in a custom one
# alike. With ``<= %(now)s`` a custom plan knows how few rows a range
# holds, the generic plan guesses a third of the index, its cost comes out
# above the custom plans', and every claim was planned afresh (1.1 ms
# against 0.5 ms for a claim of one due job); a third could even make a
# scan of the whole table look cheaper than the range.
#
# claim_query writes n into the text as a literal (``{limit}``), never as a
# parameter: a generic plan with a parameter LIMIT assumes it keeps a tenth
# of the table, which can make a whole-table scan look cheaper than the
# walk. The pool's connections run with plan_cache_mode =
# force_generic_plan (_connection), so each rendering that
# claim_is_prepared names is a prepared statement planned once per connection (about
# 330 kB of server memory each); 'auto' kept re-planning it at every call
# (0.5 ms) whenever stale statistics after a large drain made the generic
# plan look dearer than the custom ones. A larger batch is sent unprepared,
# planned at each call, a cost shared by its n jobs.
CLAIM = Statement(
    sql.SQL("""
    WITH paused AS (
        -- A paused queue hands out nothing and changes nothing: one
        -- primary-key probe, read once; every step below starts from a
        -- CTE gated by it, so no row is even read.
        SELECT 1 FROM {queues} WHERE name = %(queue)s AND paused
    ), past_deadline AS (
        -- Claims that lapsed: one walk for both kinds, exhausted or not.
        SELECT id, priority, run_at, expires_at, attempts >= max_attempts AS exhausted
        FROM {jobs}
        WHERE queue = %(queue)s AND state = 'processing'
          AND claim_deadline BETWEEN {past} AND {now}
          AND NOT EXISTS (SELECT FROM paused)
        FOR UPDATE SKIP LOCKED
    ), moved AS (
        DELETE FROM {jobs} WHERE id IN (SELECT id FROM past_deadline WHERE exhausted)
        RETURNING {moved}
    ), buried AS (
        INSERT INTO {dead} ({moved}, last_error, died_at)
        SELECT {moved}, {exceeded}, %(now)s FROM moved
    ), came_due AS (
        -- Expired ones too: they move to 'expired' (never claimed).
        SELECT id, priority, run_at, expires_at FROM {jobs}
        WHERE queue = %(queue)s AND state = 'scheduled' AND run_at BETWEEN {past} AND {now}
          AND NOT EXISTS (SELECT FROM paused)
        FOR UPDATE SKIP LOCKED
    ), newly_lapsed AS (
        -- Expired ones too: they move to 'expired' (never claimed).
        SELECT id, priority, run_at, expires_at FROM past_deadline WHERE NOT exhausted
    ), newly_expired AS (
        SELECT id FROM {jobs}
        WHERE queue = %(queue)s AND state IN ('pending', 'lapsed')
          AND expires_at BETWEEN {past} AND {now}
          AND NOT EXISTS (SELECT FROM paused)
        FOR UPDATE SKIP LOCKED
    ), not_expired AS (
        SELECT id, priority, run_at, claim_deadline, attempts, max_attempts FROM {jobs}
        WHERE queue = %(queue)s AND state = 'expired'
          AND expires_at > {now} AND expires_at <= 'infinity'
          AND NOT EXISTS (SELECT FROM paused)
        FOR UPDATE SKIP LOCKED
    ), due AS (
        -- run_at <= now still: version 1 rows, or an injected clock that
        -- moved backwards, may leave future rows here.
        SELECT id, priority, run_at FROM {jobs}
        WHERE queue = %(queue)s AND state = 'pending' AND run_at <= %(now)s
          AND (expires_at IS NULL OR expires_at > %(now)s)
          AND NOT EXISTS (SELECT FROM paused)
        ORDER BY priority DESC, run_at, id
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    ), lapsed AS (
        -- The deadline still: an injected clock that moved backwards (and
        -- a heartbeat then) may leave live claims here.
        SELECT id, priority, run_at FROM {jobs}
        WHERE queue = %(queue)s AND state = 'lapsed'
          AND claim_deadline <= %(now)s AND attempts < max_attempts
          AND (expires_at IS NULL OR expires_at > %(now)s)
          AND NOT EXISTS (SELECT FROM paused)
        ORDER BY priority DESC, run_at, id
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    ), picked AS (
        SELECT id FROM (
            SELECT * FROM due
            UNION ALL
            SELECT id, priority, run_at FROM came_due
            WHERE expires_at IS NULL OR expires_at > %(now)s
            UNION ALL
            SELECT id, priority, run_at FROM newly_lapsed
            WHERE expires_at IS NULL OR expires_at > %(now)s
            UNION ALL
            -- Those that move back to 'pending' or 'lapsed' (below).
            SELECT id, priority, run_at FROM not_expired
            WHERE (claim_deadline IS NULL AND run_at <= %(now)s)
               OR (claim_deadline <= %(now)s AND attempts < max_attempts)
            UNION ALL
            SELECT * FROM lapsed
        ) AS candidates
        ORDER BY priority DESC, run_at, id
        LIMIT {limit}
    ), moves AS (
        -- The SQLite engine's moves, on the newest version of each row
        -- (locked above). An array, so that the plan is primary-key probes
        -- whatever the generic plan guesses about the CTEs' sizes.
        UPDATE {jobs} SET state = CASE
            WHEN state = 'expired' THEN CASE
                WHEN claim_deadline IS NULL THEN
                    CASE WHEN run_at > %(now)s THEN 'scheduled' ELSE 'pending' END
                WHEN claim_deadline > %(now)s THEN 'processing'
                ELSE 'lapsed' END
            WHEN expires_at <= %(now)s THEN 'expired'
            WHEN state = 'scheduled' THEN 'pending'
            ELSE 'lapsed' END
        WHERE id = ANY(ARRAY(
            SELECT id FROM (
                SELECT id FROM came_due
                UNION ALL
                SELECT id FROM newly_lapsed
                UNION ALL
                SELECT id FROM newly_expired
                UNION ALL
                SELECT id FROM not_expired
            ) AS changed
            WHERE id NOT IN (SELECT id FROM picked)))
    )
    UPDATE {jobs}
    SET state = 'processing',
        attempts = attempts + 1,
        worker_id = %(worker_id)s,
        -- At least a microsecond, so that a claim never starts lapsed.
        claim_deadline = %(now)s + greatest(
            make_interval(secs => visibility_timeout_s), interval '1 microsecond')
    WHERE id IN (SELECT id FROM picked)
    RETURNING {live}
"""),
    moved=MOVED_COLUMNS,
    live=LIVE_COLUMNS,
    exceeded=sql.Literal(MAX_ATTEMPTS_EXCEEDED),
    # The bounds of the moves' ranges (see above).
    now=sql.SQL("(SELECT %(now)s::timestamptz)"),
    past=sql.SQL("'-infinity'"),
    # A parameter here, for inspection (EXPLAIN); claim_query renders n.
    limit=sql.SQL("%(n)s"),
)

# As the handle's validity test (_sql.handle._VALID) without the attempt count.
ACK_BATCH = sql.SQL("""
    DELETE FROM {jobs}
    WHERE id = ANY(%(ids)s::bigint[]) AND queue = %(queue)s
      AND state NOT IN ('pending', 'scheduled') AND claim_deadline > %(now)s
""")

# ACK_BATCH and ACK_MANY for a queue that keeps completed jobs: the rows
# move to the completed table in the same statement (docs/contract.md §3
# "Completed jobs"); the insert's row count is the deleted rows'.
COMPLETE_BATCH = Statement(
    sql.SQL("""
    WITH moved AS (
        DELETE FROM {jobs}
        WHERE id = ANY(%(ids)s::bigint[]) AND queue = %(queue)s
          AND state NOT IN ('pending', 'scheduled') AND claim_deadline > %(now)s
        RETURNING {moved}, last_error
    )
    INSERT INTO {completed} ({moved}, last_error, finished_at)
    SELECT {moved}, last_error, %(now)s FROM moved
"""),
    moved=MOVED_COLUMNS,
)
COMPLETE_MANY = Statement(
    sql.SQL("""
    WITH moved AS (
        DELETE FROM {jobs} j
        USING unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::bytea[])
            AS c(id, attempts, result)
        WHERE j.id = c.id AND j.attempts = c.attempts AND j.queue = %(queue)s
          AND j.state NOT IN ('pending', 'scheduled') AND j.claim_deadline > %(now)s
        RETURNING j.*, c.result
    )
    INSERT INTO {completed} ({moved}, last_error, finished_at, result)
    SELECT {moved}, last_error, %(now)s, result FROM moved
    RETURNING id, attempts
"""),
    moved=MOVED_COLUMNS,
)

# Each (id, attempts) pair as the handle's own validity test (_sql.handle._VALID).
ACK_MANY = sql.SQL("""
    DELETE FROM {jobs} j
    USING unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS c(id, attempts)
    WHERE j.id = c.id AND j.attempts = c.attempts AND j.queue = %(queue)s
      AND j.state NOT IN ('pending', 'scheduled') AND j.claim_deadline > %(now)s
    RETURNING j.id, j.attempts
""")

CANCEL = sql.SQL("DELETE FROM {jobs} WHERE id = %(id)s AND queue = %(queue)s")

# One statement, one snapshot: the job is in exactly one of the tables.
GET_JOB = Statement(
    sql.SQL("""
    SELECT {live} FROM {jobs} WHERE id = %(id)s AND queue = %(queue)s
    UNION ALL
    SELECT {dead_columns} FROM {dead} WHERE id = %(id)s AND queue = %(queue)s
    UNION ALL
    SELECT {completed_columns} FROM {completed} WHERE id = %(id)s AND queue = %(queue)s
"""),
    live=LIVE_COLUMNS,
    dead_columns=DEAD_COLUMNS,
    completed_columns=COMPLETED_COLUMNS,
)

# SKIP LOCKED on both steps: sweepers running at once split the rows
# between them and never wait for (or deadlock with) each other. Rows moved
# by this sweep have died_at = now; when the retention is zero they are
# purged at once (not inserted), as "move, then purge" would do.
SWEEP_EXPIRED = Statement(
    sql.SQL("""
    WITH expired AS (
        -- Every state, so that jobs_expiry answers with one range per state.
        SELECT id FROM {jobs}
        WHERE queue = %(queue)s AND expires_at <= %(now)s
          AND state IN ('pending', 'scheduled', 'processing', 'lapsed', 'expired')
        FOR UPDATE SKIP LOCKED
    ), moved AS (
        DELETE FROM {jobs} WHERE id IN (SELECT id FROM expired)
        RETURNING {moved}
    ), buried AS (
        INSERT INTO {dead} ({moved}, last_error, died_at)
        SELECT {moved}, {expired}, %(now)s FROM moved WHERE %(keep_moved)s
    ), old AS (
        SELECT id FROM {dead}
        WHERE queue = %(queue)s AND died_at <= %(cutoff)s::timestamptz
        FOR UPDATE SKIP LOCKED
    ), purged AS (
        DELETE FROM {dead} WHERE id IN (SELECT id FROM old)
        RETURNING 1
    ), finished AS (
        DELETE FROM {completed}
        WHERE queue = %(queue)s AND finished_at <= %(finished_before)s::timestamptz
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM moved),
           (SELECT count(*) FROM purged) + (SELECT count(*) FROM finished)
"""),
    moved=MOVED_COLUMNS,
    expired=sql.Literal(EXPIRED),
)

# Four counts from one snapshot, each term one state's index range where
# possible. The public counts go by the instants, whatever the private state
# says (rows version 1 left pending with a future run_at; an injected clock
# that moved backwards), as the SQLite engine's do: an 'expired' row counts
# as processing if it holds a claim, else as pending (by its run_at); every
# 'expired' row has an expires_at, which lets jobs_expiry serve it.
STATS = sql.SQL("""
    SELECT
        (SELECT count(*) FROM {jobs}
         WHERE queue = %(queue)s AND state = 'pending' AND run_at <= %(now)s)
        + (SELECT count(*) FROM {jobs}
           WHERE queue = %(queue)s AND state = 'scheduled' AND run_at <= %(now)s)
        + (SELECT count(*) FROM {jobs}
           WHERE queue = %(queue)s AND state = 'expired' AND expires_at IS NOT NULL
             AND claim_deadline IS NULL AND run_at <= %(now)s),
        (SELECT count(*) FROM {jobs}
         WHERE queue = %(queue)s AND state = 'pending' AND run_at > %(now)s)
        + (SELECT count(*) FROM {jobs}
           WHERE queue = %(queue)s AND state = 'scheduled' AND run_at > %(now)s)
        + (SELECT count(*) FROM {jobs}
           WHERE queue = %(queue)s AND state = 'expired' AND expires_at IS NOT NULL
             AND claim_deadline IS NULL AND run_at > %(now)s),
        (SELECT count(*) FROM {jobs} WHERE queue = %(queue)s AND state = 'processing')
        + (SELECT count(*) FROM {jobs} WHERE queue = %(queue)s AND state = 'lapsed')
        + (SELECT count(*) FROM {jobs}
           WHERE queue = %(queue)s AND state = 'expired' AND expires_at IS NOT NULL
             AND claim_deadline IS NOT NULL),
        (SELECT count(*) FROM {dead} WHERE queue = %(queue)s)
""")

# The processing rows whose claim has lapsed, in every private state that
# holds a claim (the claim moves lapsed ones to 'lapsed' and expired ones to
# 'expired' only when it next runs); each term by the instants, as STATS.
# 'processing' is a range of jobs_processing (queue, claim_deadline);
# 'lapsed' and 'expired' rows are counted from their own index ranges.
LAPSED_CLAIMS = sql.SQL("""
    SELECT
        (SELECT count(*) FROM {jobs}
         WHERE queue = %(queue)s AND state = 'processing' AND claim_deadline <= %(now)s)
        + (SELECT count(*) FROM {jobs}
           WHERE queue = %(queue)s AND state = 'lapsed' AND claim_deadline <= %(now)s)
        + (SELECT count(*) FROM {jobs}
           WHERE queue = %(queue)s AND state = 'expired' AND expires_at IS NOT NULL
             AND claim_deadline <= %(now)s)
""")


def stamps(resolved: Resolved) -> tuple[Any, ...]:
    """The row values every enqueue binds after the payload(s), in order."""
    return (
        resolved.priority,
        resolved.run_at,
        resolved.expires_at,
        resolved.enqueued_at,
        resolved.max_attempts,
        resolved.visibility_timeout_s,
        resolved.backoff_base_s,
        resolved.backoff_cap_s,
    )


#: The largest n whose claim has a rendering of its own, prepared (see
#: CLAIM), and the largest power of two that has one too; any other batch
#: is sent unprepared. A worker claims its free slots (at most its
#: concurrency's worth), and claims ahead in powers of two (its prefetch).
LITERAL_N_MAX = 16
POWER_OF_TWO_N_MAX = 1024


def claim_is_prepared(n: int) -> bool:
    """Whether the claim of ``n`` jobs runs as a prepared statement: ``n``
    up to :data:`LITERAL_N_MAX`, or a power of two up to
    :data:`POWER_OF_TWO_N_MAX` (planned once per connection, about 1 ms
    saved per claim)."""
    return n <= LITERAL_N_MAX or (n <= POWER_OF_TWO_N_MAX and n & (n - 1) == 0)


#: The claim's parameters, in the order the queue passes them (see numbered).
CLAIM_PARAMETERS = ("queue", "now", "worker_id")


@functools.lru_cache(maxsize=64)
def claim_query(schema: str, n: int) -> bytes:
    """:data:`CLAIM` for ``schema`` with ``n`` written in (a literal: see
    :data:`CLAIM`) and PostgreSQL's numbered parameters, in the order of
    :data:`CLAIM_PARAMETERS`: the queue, now, the worker id."""
    fragments = dict(CLAIM.fragments)
    fragments["limit"] = sql.Literal(n)
    return numbered(render(Statement(CLAIM.template, **fragments), schema), CLAIM_PARAMETERS)


def claim_order(job: Job) -> tuple[int, Any, int]:
    """The sort key of claim order: priority descending, run_at, id."""
    return (-job.priority, job.run_at, job.id)


def insert(
    queue: str, channel: str, resolved: Resolved, payloads: Sequence[EncodedPayload]
) -> tuple[Statement, tuple[Any, ...]]:
    """The enqueue of ``payloads`` (never empty) into ``queue``, its wake on
    ``channel``: :data:`INSERT` for one, :data:`INSERT_MANY` for more, and
    its parameters. Read the ids from its row with :func:`inserted_ids`."""
    # The claim's walk never sees a row that is not due yet.
    state = "scheduled" if resolved.run_at > resolved.enqueued_at else "pending"
    if len(payloads) == 1:
        data, content_type = payloads[0]
        return INSERT, (queue, state, data, content_type, *stamps(resolved), channel)
    content_types = {p.content_type for p in payloads}
    shared = content_types.pop() if len(content_types) == 1 else None
    return INSERT_MANY, (
        queue,
        state,
        shared,
        *stamps(resolved),
        ByteaArray([p.data for p in payloads]),
        [] if shared else [p.content_type for p in payloads],
        channel,
    )


def insert_unique(
    queue: str, channel: str, resolved: Resolved, payload: EncodedPayload, unique_key: str
) -> tuple[Statement, tuple[Any, ...]]:
    """The enqueue of one job with ``unique_key``: :data:`INSERT_UNIQUE` and
    its parameters; its row, if any, holds the id."""
    state = "scheduled" if resolved.run_at > resolved.enqueued_at else "pending"
    data, content_type = payload
    return INSERT_UNIQUE, (
        queue,
        state,
        data,
        content_type,
        *stamps(resolved),
        unique_key,
        channel,
        queue,
        unique_key,
    )


def inserted_ids(row: Sequence[Any] | None, count: int) -> list[int]:
    """The ids of an :func:`insert` of ``count`` payloads, in list order."""
    assert row is not None
    return [row[0]] if count == 1 else sorted(row[0])


def sweep_params(
    queue: str, now: datetime, retention_s: float | None, keep_completed_s: float | None
) -> dict[str, Any]:
    """:data:`SWEEP_EXPIRED`'s parameters: dead rows older than
    ``retention_s`` (``None``: kept) are purged, and completed rows that
    finished ``keep_completed_s`` ago or more (``None``: none)."""
    cutoff = _before(now, retention_s)
    return {
        "queue": queue,
        "now": now,
        "cutoff": cutoff,
        "keep_moved": cutoff is None or cutoff < now,
        "finished_before": _before(now, keep_completed_s),
    }


def _before(now: datetime, age_s: float | None) -> datetime | None:
    # The instant ``age_s`` before now; None for no age, or before year 1
    # (nothing can be that old).
    if age_s is None:
        return None
    try:
        return now - duration(age_s)
    except OverflowError:
        return None


def sweep_result(row: Sequence[Any] | None, params: dict[str, Any]) -> SweepResult:
    """The :class:`SweepResult` of :data:`SWEEP_EXPIRED`'s row."""
    assert row is not None
    expired, purged = row
    if not params["keep_moved"]:
        purged += expired
    return SweepResult(expired, purged)
