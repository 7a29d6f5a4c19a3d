"""Rows to :class:`~alkstore.Job` snapshots, and the column lists the
statements share.

Instants are ``timestamptz``: PostgreSQL stores them as UTC microseconds,
the same precision as ``datetime``, so they round-trip exactly. psycopg
returns them in the session's ``TimeZone``; :func:`job_from_row` converts
them to UTC, so no result depends on the session's time zone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from alkstore import Job
from alkstore.engine import job_from_values

__all__ = ["COMPLETED_COLUMNS", "DEAD_COLUMNS", "LIVE_COLUMNS", "MOVED_COLUMNS", "job_from_row"]

#: The public state of each engine-private state of a live row
#: (:mod:`alkstore_postgres._schema`); dead rows say ``'dead'``. An
#: ``'expired'`` row's depends on whether it holds a claim (job_from_row).
_PUBLIC_STATE = {
    "pending": "pending",
    "scheduled": "pending",
    "processing": "processing",
    "lapsed": "processing",
    "dead": "dead",
    "completed": "completed",
}

#: The columns a live-to-dead move copies unchanged (a dead row keeps the
#: payload, the stamps and its last claim's attempts, worker and deadline).
MOVED_COLUMNS = sql.SQL(
    "id, queue, payload, content_type, priority, run_at, expires_at, enqueued_at, "
    "attempts, max_attempts, visibility_timeout_s, backoff_base_s, backoff_cap_s, "
    "worker_id, claim_deadline, unique_key"
)
#: The columns :func:`job_from_row` reads, from the live table.
LIVE_COLUMNS = sql.SQL(
    "id, queue, state, payload, content_type, priority, run_at, expires_at, "
    "enqueued_at, attempts, max_attempts, visibility_timeout_s, backoff_base_s, "
    "backoff_cap_s, worker_id, claim_deadline, last_error, NULL::timestamptz, unique_key, "
    "NULL::timestamptz, NULL::bytea"
)
#: The same columns from the dead table, where the state is implied.
DEAD_COLUMNS = sql.SQL(
    "id, queue, 'dead', payload, content_type, priority, run_at, expires_at, "
    "enqueued_at, attempts, max_attempts, visibility_timeout_s, backoff_base_s, "
    "backoff_cap_s, worker_id, claim_deadline, last_error, died_at, unique_key, "
    "NULL::timestamptz, NULL::bytea"
)
#: The same columns from the completed table.
COMPLETED_COLUMNS = sql.SQL(
    "id, queue, 'completed', payload, content_type, priority, run_at, expires_at, "
    "enqueued_at, attempts, max_attempts, visibility_timeout_s, backoff_base_s, "
    "backoff_cap_s, worker_id, claim_deadline, last_error, NULL::timestamptz, unique_key, "
    "finished_at, result"
)


def _opt_utc(instant: datetime | None) -> datetime | None:
    return None if instant is None else instant.astimezone(UTC)


def job_from_row(row: Sequence[Any]) -> Job:
    """Build a :class:`~alkstore.Job` from a row of :data:`LIVE_COLUMNS` or
    :data:`DEAD_COLUMNS`."""
    (
        job_id,
        queue,
        state,
        payload,
        content_type,
        priority,
        run_at,
        expires_at,
        enqueued_at,
        attempts,
        max_attempts,
        visibility_timeout_s,
        backoff_base_s,
        backoff_cap_s,
        worker_id,
        claim_deadline,
        last_error,
        died_at,
        unique_key,
        finished_at,
        result,
    ) = row
    public = _PUBLIC_STATE.get(state)
    if public is None:
        # 'expired': waiting for sweep_expired, with or without a claim.
        public = "pending" if claim_deadline is None else "processing"
    return job_from_values(
        (
            job_id,
            queue,
            public,
            bytes(payload),
            content_type,
            priority,
            run_at.astimezone(UTC),
            _opt_utc(expires_at),
            enqueued_at.astimezone(UTC),
            attempts,
            max_attempts,
            visibility_timeout_s,
            backoff_base_s,
            backoff_cap_s,
            worker_id,
            _opt_utc(claim_deadline),
            last_error,
            _opt_utc(died_at),
            unique_key,
            _opt_utc(finished_at),
            None if result is None else bytes(result),
        )
    )
