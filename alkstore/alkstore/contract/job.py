"""Read-only values the contract returns: :class:`Job`, :class:`SweepResult`,
:class:`QueueStats` (docs/contract.md §2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from functools import cached_property
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar, overload

from alkstore.logic.codec import decode_payload, decode_result

__all__ = [
    "FAILED",
    "JOB_FIELDS",
    "MAX_ATTEMPTS_EXCEEDED",
    "Job",
    "JobState",
    "ListedState",
    "QueueStats",
    "SweepResult",
    "job_from_values",
]

JobState = Literal["pending", "processing", "dead", "completed"]
#: The states :meth:`Queue.jobs` lists by: :data:`JobState`'s, with
#: ``"pending"`` split as :class:`QueueStats` splits it (due now, or
#: ``"scheduled"`` for later).
ListedState = Literal["pending", "scheduled", "processing", "completed", "dead"]


@dataclass(frozen=True)
class Job:
    """A snapshot of one job, showing resolved values (docs/contract.md §2 "Job").

    Every datetime is timezone-aware UTC with microsecond precision; every
    duration is seconds. ``died_at`` is ``None`` on live rows; a dead row
    keeps the ``attempts``, ``worker_id`` and ``claim_deadline`` of its last
    claim. ``unique_key`` is the key it was enqueued with, or ``None``
    (docs/contract.md §3 "Unique keys"). A ``"completed"`` job (kept by an
    ack through a queue with ``keep_completed_s``) has ``finished_at`` and
    its ``result_bytes`` (JSON, or ``None``); both are ``None`` on the others
    (docs/contract.md §3 "Completed jobs").
    """

    id: int
    queue: str
    state: JobState
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
    unique_key: str | None
    finished_at: datetime | None
    result_bytes: bytes | None

    @cached_property
    def payload(self) -> Any:
        """The decoded payload: ``bytes`` for ``application/octet-stream``,
        else the JSON value (docs/contract.md §3 "Payload"). Decoded on first read, so a
        claim of many jobs does not pay for payloads nobody reads."""
        return decode_payload(self.payload_bytes, self.content_type)

    @cached_property
    def result(self) -> Any:
        """The decoded result of a completed job: the JSON value its ack
        stored, ``None`` when it stored none (and on every other state)."""
        return decode_result(self.result_bytes)


#: :class:`Job`'s dataclass fields in order (``payload`` is derived, not a field).
JOB_FIELDS = tuple(f.name for f in fields(Job))
_new = object.__new__


def job_from_values(values: Sequence[Any]) -> Job:
    """Build a :class:`Job` from values in :data:`JOB_FIELDS` order.

    For engines turning rows into jobs: equal to ``Job(*values)`` but about
    three times faster, because the frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``; a batch claim builds one per row.
    """
    job: Job = _new(Job)
    job.__dict__.update(zip(JOB_FIELDS, values, strict=True))
    return job


class SweepResult(NamedTuple):
    """What :meth:`Queue.sweep_expired` did: rows moved to the dead table as
    expired, and rows purged past their retention (dead rows, and completed
    ones when the handle keeps them)."""

    expired: int
    purged: int


class QueueStats(NamedTuple):
    """Row counts of one queue at one instant (docs/contract.md §3 "stats()").

    ``pending``: pending with ``run_at <= now`` (expired but unswept
    included); ``scheduled``: pending with ``run_at > now``;
    ``processing``: claimed, lapsed included; ``dead``: dead-letter rows.
    """

    pending: int
    scheduled: int
    processing: int
    dead: int


#: ``last_error`` of a job that ran out of attempts.
MAX_ATTEMPTS_EXCEEDED = "max attempts exceeded"
#: ``last_error`` of ``fail()`` called without an error.
FAILED = "failed"

T = TypeVar("T")


class _HasJob(Protocol):
    """A job handle, sync or async: what :class:`_JobField` reads from."""

    @property
    def job(self) -> Job: ...


class _JobField(Generic[T]):
    """Reads one field of the handle's claim-time :class:`Job` snapshot."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._field = name

    @overload
    def __get__(self, handle: None, owner: type) -> _JobField[T]: ...
    @overload
    def __get__(self, handle: _HasJob, owner: type) -> T: ...
    def __get__(self, handle: _HasJob | None, owner: type) -> _JobField[T] | T:
        if handle is None:
            return self
        value: T = getattr(handle.job, self._field)
        return value
