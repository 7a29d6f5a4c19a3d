"""The statements of a claim's handle (:mod:`alkstore_postgres._handle`).

Each carries the whole validity predicate in its ``WHERE`` clause (a row
holding a claim, this claim's attempt count, not lapsed at ``now``), so a
stale handle can never touch a newer claim.
"""

from __future__ import annotations

from datetime import timedelta

from psycopg import sql

from alkstore_postgres._rows import MOVED_COLUMNS
from alkstore_postgres._schema import Statement

__all__ = ["ACK", "COMPLETE", "DEAD_LETTER", "HEARTBEAT", "MICROSECOND", "RELEASE", "RETRY"]

#: The shortest extension of a claim (a heartbeat never leaves it lapsed).
MICROSECOND = timedelta(microseconds=1)

_VALID = "id = %(id)s AND state NOT IN ('pending', 'scheduled') "
_VALID += "AND attempts = %(attempts)s AND claim_deadline > %(now)s"

ACK = sql.SQL("DELETE FROM {jobs} WHERE " + _VALID)

# A retry with a delay goes to 'scheduled', out of the claim's walk until due
# (see _schema).
RETRY = sql.SQL(
    "UPDATE {jobs} SET state = %(state)s, run_at = %(run_at)s, last_error = %(error)s, "
    "worker_id = NULL, claim_deadline = NULL WHERE " + _VALID
)

# The delete and the insert are one statement, so one transaction: if the
# insert fails the delete is undone, and the job is always in exactly one of
# the two tables (docs/contract.md §3 "Dead letters").
DEAD_LETTER = Statement(
    sql.SQL(
        "WITH moved AS (DELETE FROM {jobs} WHERE " + _VALID + " RETURNING {moved}) "
        "INSERT INTO {dead} ({moved}, last_error, died_at) "
        "SELECT {moved}, %(error)s, %(now)s FROM moved"
    ),
    moved=MOVED_COLUMNS,
)

# As DEAD_LETTER, to the completed table (docs/contract.md §3 "Completed jobs").
COMPLETE = Statement(
    sql.SQL(
        "WITH moved AS (DELETE FROM {jobs} WHERE " + _VALID + " RETURNING {moved}, last_error) "
        "INSERT INTO {completed} ({moved}, last_error, finished_at, result) "
        "SELECT {moved}, last_error, %(now)s, %(result)s::bytea FROM moved"
    ),
    moved=MOVED_COLUMNS,
)

HEARTBEAT = sql.SQL("UPDATE {jobs} SET claim_deadline = %(deadline)s WHERE " + _VALID)

# Claims only count up (attempts kept, so no claim identity repeats); the
# budget grows by the claim given back. The wake is sent in the same
# statement, so only its commit wakes anyone; its one row (none when the
# claim was not valid) is the rowcount the handle reads.
RELEASE = sql.SQL(
    "WITH released AS (UPDATE {jobs} SET state = %(state)s, worker_id = NULL, "
    "claim_deadline = NULL, max_attempts = least(max_attempts::bigint + 1, 2147483647) "
    "WHERE " + _VALID + " RETURNING 1), "
    "wake AS (SELECT pg_notify(%(channel)s, '') FROM released) "
    "SELECT 1 FROM wake"
)
