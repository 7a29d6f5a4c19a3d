"""Rows to :class:`~alkstore.Job` snapshots, and the time encoding.

Instants are stored as INTEGER microseconds since the Unix epoch, UTC: exact
for every ``datetime`` (which has microsecond precision), ordered as
integers in the indexes, and compared in SQL without any date functions.
Durations given in seconds become whole microseconds the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from alkstore import Job
from alkstore.engine import job_from_values

__all__ = [
    "COMPLETED_COLUMNS",
    "COMPLETE_CLAIMS",
    "DEAD_COLUMNS",
    "LIVE_COLUMNS",
    "bury_sql",
    "complete_sql",
    "from_us",
    "job_from_row",
    "jobs_from_rows",
    "to_us",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = 1_000_000

#: The public state of each engine-private state of a live row
#: (:mod:`alkstore_sqlite._schema`); dead rows say ``'dead'``.
_PUBLIC_STATE = {
    "pending": "pending",
    "scheduled": "pending",
    "processing": "processing",
    "lapsed": "processing",
    "dead": "dead",
    "completed": "completed",
}

#: The columns :func:`job_from_row` reads, from the live table.
LIVE_COLUMNS = (
    "id, queue, state, payload, content_type, priority, run_at, expires_at, "
    "enqueued_at, attempts, max_attempts, visibility_timeout_s, backoff_base_s, "
    "backoff_cap_s, worker_id, claim_deadline, last_error, NULL, unique_key, NULL, NULL"
)
#: The same columns from the dead table, where the state is implied.
DEAD_COLUMNS = (
    "id, queue, 'dead', payload, content_type, priority, run_at, expires_at, "
    "enqueued_at, attempts, max_attempts, visibility_timeout_s, backoff_base_s, "
    "backoff_cap_s, worker_id, claim_deadline, last_error, died_at, unique_key, NULL, NULL"
)
#: The same columns from the completed table.
COMPLETED_COLUMNS = (
    "id, queue, 'completed', payload, content_type, priority, run_at, expires_at, "
    "enqueued_at, attempts, max_attempts, visibility_timeout_s, backoff_base_s, "
    "backoff_cap_s, worker_id, claim_deadline, last_error, NULL, unique_key, "
    "finished_at, result"
)

_MOVED_COLUMNS = (
    "id, queue, payload, content_type, priority, run_at, expires_at, "
    "enqueued_at, attempts, max_attempts, visibility_timeout_s, backoff_base_s, "
    "backoff_cap_s, worker_id, claim_deadline, unique_key"
)


def bury_sql(where: str) -> str:
    """The ``INSERT`` that copies the live rows matching ``where`` into the
    dead table, with ``last_error = :error`` and ``died_at = :now``.

    Every live-to-dead move runs it and then deletes the same rows in the
    same transaction, so a job is always in exactly one table (docs/contract.md §3
    "Dead letters").
    """
    return (
        f"INSERT INTO _alkstore_dead ({_MOVED_COLUMNS}, last_error, died_at) "
        f"SELECT {_MOVED_COLUMNS}, :error, :now FROM _alkstore_jobs WHERE {where}"
    )


def complete_sql(where: str) -> str:
    """The ``INSERT`` that copies the live rows matching ``where`` into the
    completed table, with ``finished_at = :now`` and ``result = :result``;
    every move runs it and deletes the same rows in the same transaction,
    as :func:`bury_sql` (docs/contract.md §3 "Completed jobs")."""
    return (
        f"INSERT INTO _alkstore_completed ({_MOVED_COLUMNS}, last_error, finished_at, result) "
        f"SELECT {_MOVED_COLUMNS}, last_error, :now, :result FROM _alkstore_jobs WHERE {where}"
    )


#: The copy of ``ack_many`` through a handle that keeps completed jobs: for
#: each claim of ``:claims``, a JSON array of ``[id, attempts, result]``
#: triples (the result as JSON text, or null), the live row still held by
#: that claim, with ``finished_at = :now``; it returns the ``(id, attempts)``
#: it took, whose rows the caller then deletes in the same transaction.
COMPLETE_CLAIMS = (
    f"INSERT INTO _alkstore_completed ({_MOVED_COLUMNS}, last_error, finished_at, result) "
    "SELECT "
    + ", ".join(f"j.{column.strip()}" for column in _MOVED_COLUMNS.split(","))
    + ", j.last_error, :now, CAST(json_extract(c.value, '$[2]') AS BLOB) "
    "FROM json_each(:claims) AS c "
    "JOIN _alkstore_jobs AS j ON j.id = json_extract(c.value, '$[0]') "
    "WHERE j.attempts = json_extract(c.value, '$[1]') AND j.queue = :queue "
    "AND j.state NOT IN ('pending', 'scheduled') AND j.claim_deadline > :now "
    "RETURNING id, attempts"
)


def to_us(instant: datetime) -> int:
    """Microseconds since the Unix epoch of an aware ``datetime``."""
    # Integer arithmetic on the timedelta: float timestamps lose microseconds
    # for instants far from 1970.
    delta = instant - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * _US + delta.microseconds


def from_us(us: int) -> datetime:
    """The aware UTC ``datetime`` of microseconds since the Unix epoch."""
    return _EPOCH + timedelta(microseconds=us)


def jobs_from_rows(rows: Sequence[Sequence[Any]]) -> list[Job]:
    """Build a :class:`~alkstore.Job` from each row of :data:`LIVE_COLUMNS` or
    :data:`DEAD_COLUMNS`.

    Rows of one batch share their instants (one claim deadline, often one
    enqueue time), so each distinct instant becomes one ``datetime`` object
    (immutable, so sharing is safe).
    """
    instants: dict[int, datetime] = {}

    def instant(us: int | None) -> datetime | None:
        if us is None:
            return None
        found = instants.get(us)
        if found is None:
            found = instants[us] = _EPOCH + timedelta(microseconds=us)
        return found

    jobs = []
    for row in rows:
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
        jobs.append(
            job_from_values(
                (
                    job_id,
                    queue,
                    public,
                    payload,
                    content_type,
                    priority,
                    instant(run_at),
                    instant(expires_at),
                    instant(enqueued_at),
                    attempts,
                    max_attempts,
                    # SQLite stores integral REALs as integers; UPDATE ...
                    # RETURNING can hand them back without the REAL affinity.
                    float(visibility_timeout_s),
                    backoff_base_s,
                    backoff_cap_s,
                    worker_id,
                    instant(claim_deadline),
                    last_error,
                    instant(died_at),
                    unique_key,
                    instant(finished_at),
                    result,
                )
            )
        )
    return jobs


def job_from_row(row: Sequence[Any]) -> Job:
    """:func:`jobs_from_rows` for one row."""
    return jobs_from_rows((row,))[0]
