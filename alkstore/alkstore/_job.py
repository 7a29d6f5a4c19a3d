"""Read-only values the contract returns: :class:`Job`, :class:`SweepResult`,
:class:`QueueStats` (SPEC §2)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

__all__ = ["Job", "JobState", "QueueStats", "SweepResult"]

JobState = Literal["pending", "processing", "dead"]


@dataclass(frozen=True)
class Job:
    """A snapshot of one job, showing resolved values (SPEC §2 "Job").

    Every datetime is timezone-aware UTC with microsecond precision; every
    duration is seconds. ``died_at`` is ``None`` on live rows; a dead row
    keeps the ``attempts``, ``worker_id`` and ``claim_deadline`` of its last
    claim.
    """

    id: int
    queue: str
    state: JobState
    payload: Any
    payload_bytes: bytes
    content_type: str
    priority: int
    run_at: datetime
    expires_at: datetime | None
    enqueued_at: datetime
    attempts: int
    max_attempts: int
    visibility_timeout_s: float
    backoff_base_s: int
    backoff_cap_s: int
    worker_id: str | None
    claim_deadline: datetime | None
    last_error: str | None
    died_at: datetime | None


class SweepResult(NamedTuple):
    """What :meth:`Queue.sweep_expired` did: rows moved to the dead table as
    expired, and dead rows purged past their retention."""

    expired: int
    purged: int


class QueueStats(NamedTuple):
    """Row counts of one queue at one instant (SPEC §3 "stats()").

    ``pending``: pending with ``run_at <= now`` (expired but unswept
    included); ``scheduled``: pending with ``run_at > now``;
    ``processing``: claimed, lapsed included; ``dead``: dead-letter rows.
    """

    pending: int
    scheduled: int
    processing: int
    dead: int
