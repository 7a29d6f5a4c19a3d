"""The statements and thresholds of compaction
(:mod:`alkstore_postgres._compact`; docs/decisions.md D29)."""

from __future__ import annotations

from psycopg import sql

__all__ = [
    "CHECK_INTERVAL_S",
    "COPY_IN",
    "COPY_OUT",
    "COUNTERS",
    "DEAD_MIN",
    "HORIZON_MIN_S",
    "LIVE",
    "LIVE_BYTES_MAX",
    "LIVE_MAX",
    "LOCK",
    "LOCK_TIMEOUT",
    "LOCK_TIMEOUT_MS",
    "SLOW_CLAIM_PER_JOB_S",
    "SLOW_CLAIM_S",
    "TAKE",
    "TRUNCATE",
]

#: Seconds between two looks at the counters by one store, and between two
#: compactions of one schema by all stores (the server's clock).
CHECK_INTERVAL_S = 0.5
#: Seconds of a claim, plus seconds per job it asked for, that make it
#: look at the counters (see Compactor).
SLOW_CLAIM_S = 0.001
SLOW_CLAIM_PER_JOB_S = 0.00005
#: Dead row versions (the server's count) that make compaction worth it.
DEAD_MIN = 2_000
#: Seconds a transaction holding the xmin horizon must have been open for
#: vacuum to be taken as held back: below it, vacuum is left to do the work.
HORIZON_MIN_S = 5.0
#: Live rows at most that are copied out and back under the lock.
LIVE_MAX = 2_000
#: Bytes of live rows at most (their stored size): they pass through this
#: process's memory while the lock is held.
LIVE_BYTES_MAX = 64 * 1024 * 1024
#: How long a compaction waits for any lock before giving up its turn.
LOCK_TIMEOUT_MS = 10

# The table's counters, and for how many seconds the oldest transaction
# of this database that holds the xmin horizon has been open (with vacuum
# able to work, transactions are short).
COUNTERS = sql.SQL("""
    SELECT pg_stat_get_live_tuples(%(jobs)s::regclass),
           pg_stat_get_dead_tuples(%(jobs)s::regclass),
           (SELECT coalesce(extract(epoch FROM clock_timestamp() - min(xact_start)), 0)::float8
            FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid()
              AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
              AND backend_type <> 'autovacuum worker')
""")

# The store-wide turn: a row only when the last one was long enough ago
# (server time: this is about the server's load, not about the jobs).
TAKE = sql.SQL("""
    INSERT INTO {maintenance} AS m (task, last_run_at) VALUES ('compact', statement_timestamp())
    ON CONFLICT (task) DO UPDATE SET last_run_at = excluded.last_run_at
    WHERE m.last_run_at <= statement_timestamp() - make_interval(secs => %(interval_s)s)
    RETURNING 1
""")

LOCK = sql.SQL("LOCK TABLE {jobs} IN ACCESS EXCLUSIVE MODE")
LIVE = sql.SQL("""
    SELECT count(*), coalesce(sum(pg_column_size(live.*)), 0)::bigint
    FROM (SELECT * FROM {jobs} LIMIT %(over)s) AS live
""")
COPY_OUT = sql.SQL("COPY {jobs} TO STDOUT (FORMAT BINARY)")
TRUNCATE = sql.SQL("TRUNCATE {jobs}")
# COPY writes the given ids into the identity column (as INSERT ...
# OVERRIDING SYSTEM VALUE would); the sequence is untouched.
COPY_IN = sql.SQL("COPY {jobs} FROM STDIN (FORMAT BINARY)")

#: The lock_timeout of a compaction's transaction.
LOCK_TIMEOUT = f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"
