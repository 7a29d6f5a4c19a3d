"""The :class:`Schedule` value: a named, durable rule that enqueues a job on
every boundary of a cron or ``@every`` spec (docs/schedules.md).

Engines store a schedule as the flat columns of :data:`SCHEDULE_COLUMNS`
(:func:`schedule_to_values`, :func:`schedule_from_values`): the enqueue
options travel as one JSON text, so an engine needs no column per option.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from alkstore._codec import decode_payload
from alkstore._options import QueueOpts

__all__ = [
    "CATCH_UP_POLICIES",
    "SCHEDULE_COLUMNS",
    "CatchUp",
    "Schedule",
    "schedule_from_values",
    "schedule_to_values",
]

#: What a tick does with boundaries that passed while nobody ticked:
#: ``"latest"`` enqueues the latest of them once; ``"skip"`` enqueues none
#: of those older than the scheduler's misfire grace.
CatchUp = Literal["latest", "skip"]
CATCH_UP_POLICIES: tuple[CatchUp, ...] = ("latest", "skip")


@dataclass(frozen=True)
class Schedule:
    """A snapshot of one named schedule (docs/schedules.md).

    Every datetime is timezone-aware UTC; durations are seconds.

    Attributes
    ----------
    name
        Unique within the store; the rule of a queue name.
    spec
        A 5-field cron expression, an alias such as ``@hourly``, or
        ``@every 30s`` (see :func:`alkstore._cron.parse_schedule`).
    timezone
        The IANA zone the cron fields are read in.
    queue
        The queue each boundary's job is enqueued into.
    payload_bytes, content_type
        The job payload, encoded once when the schedule was saved.
    priority, max_attempts, expires_s
        Per-job enqueue overrides; ``None`` uses ``queue_opts``.
    queue_opts
        The options stamped on each job (visibility timeout, backoff, ...).
    catch_up
        :data:`CatchUp` policy for boundaries missed while nobody ticked.
    revision
        Bumped each time the schedule is replaced; a tick holding an older
        revision fires nothing.
    created_at
        When this revision was saved; no boundary at or before it fires.
    next_run_at
        The next boundary to fire.
    last_run_at, last_job_id
        The boundary fired last and the job it enqueued (``None`` before
        the first).
    """

    name: str
    spec: str
    timezone: str
    queue: str
    payload_bytes: bytes
    content_type: str
    priority: int | None
    max_attempts: int | None
    expires_s: float | None
    queue_opts: QueueOpts
    catch_up: CatchUp
    revision: int
    created_at: datetime
    next_run_at: datetime
    last_run_at: datetime | None
    last_job_id: int | None

    @cached_property
    def payload(self) -> Any:
        """The decoded payload (SPEC §3 "Payload")."""
        return decode_payload(self.payload_bytes, self.content_type)

    @property
    def options_json(self) -> str:
        """The enqueue options as one JSON text, as engines store them."""
        return json.dumps(
            {
                "priority": self.priority,
                "max_attempts": self.max_attempts,
                "expires_s": self.expires_s,
                "catch_up": self.catch_up,
                "queue_opts": asdict(self.queue_opts),
            },
            sort_keys=True,
        )


#: The columns an engine stores, in the order of :func:`schedule_to_values`.
SCHEDULE_COLUMNS = (
    "name",
    "spec",
    "timezone",
    "queue",
    "payload_bytes",
    "content_type",
    "options",
    "revision",
    "created_at",
    "next_run_at",
    "last_run_at",
    "last_job_id",
)


def schedule_to_values(schedule: Schedule) -> tuple[Any, ...]:
    """The schedule's column values in :data:`SCHEDULE_COLUMNS` order."""
    return (
        schedule.name,
        schedule.spec,
        schedule.timezone,
        schedule.queue,
        schedule.payload_bytes,
        schedule.content_type,
        schedule.options_json,
        schedule.revision,
        schedule.created_at,
        schedule.next_run_at,
        schedule.last_run_at,
        schedule.last_job_id,
    )


def schedule_from_values(values: Sequence[Any]) -> Schedule:
    """Build a :class:`Schedule` from column values in :data:`SCHEDULE_COLUMNS`
    order; datetimes must already be aware UTC."""
    (
        name,
        spec,
        timezone,
        queue,
        payload_bytes,
        content_type,
        options,
        revision,
        created_at,
        next_run_at,
        last_run_at,
        last_job_id,
    ) = values
    decoded = json.loads(options)
    return Schedule(
        name=name,
        spec=spec,
        timezone=timezone,
        queue=queue,
        payload_bytes=bytes(payload_bytes),
        content_type=content_type,
        priority=decoded["priority"],
        max_attempts=decoded["max_attempts"],
        expires_s=decoded["expires_s"],
        queue_opts=QueueOpts(**decoded["queue_opts"]),
        catch_up=decoded["catch_up"],
        revision=revision,
        created_at=created_at,
        next_run_at=next_run_at,
        last_run_at=last_run_at,
        last_job_id=last_job_id,
    )
