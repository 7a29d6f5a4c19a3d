"""The :class:`Schedule` value: a named, durable rule that enqueues a job on
every boundary of a cron or ``@every`` spec (docs/schedules.md).

Engines store a schedule as the flat columns of :data:`SCHEDULE_COLUMNS`
(:func:`schedule_to_values`, :func:`read_schedule`): the enqueue options
travel as one JSON text, so an engine needs no column per option.

Reading a stored row never raises: a row this version cannot fire as it
was written (its options, spec, zone, queue or payload refused here, or an
option it does not know, saved by a newer release) reads as an
:class:`UnreadableSchedule` naming the reason, so one bad row stops no
listing and no tick (regression case 014; docs/decisions.md D27). Options are
written sparsely for the same reason: a queue option at its default is
left out, so a release that adds an option makes no row unreadable to the
release before it unless a schedule sets that option.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from alkstore.logic import validation as v
from alkstore.logic.codec import JSON, OCTET_STREAM, decode_payload
from alkstore.logic.cron import parse_schedule
from alkstore.logic.options import QueueOpts
from alkstore.logic.resolution import enqueue_options

__all__ = [
    "CATCH_UP_POLICIES",
    "SCHEDULE_COLUMNS",
    "CatchUp",
    "Schedule",
    "UnreadableSchedule",
    "read_schedule",
    "same_jobs",
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
        ``@every 30s`` (see :func:`alkstore.logic.cron.parse_schedule`).
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
        """The decoded payload (docs/contract.md §3 "Payload")."""
        return decode_payload(self.payload_bytes, self.content_type)

    @property
    def options_json(self) -> str:
        """The enqueue options as one JSON text, as engines store them.

        The schedule's own options are always written (the release before
        this one reads each of them); of the queue options only those that
        differ from ``QueueOpts()``'s defaults, so a queue option added by
        a later release reaches the rows only of the schedules that set it
        (docs/decisions.md D27)."""
        return json.dumps(
            {
                "priority": self.priority,
                "max_attempts": self.max_attempts,
                "expires_s": self.expires_s,
                "catch_up": self.catch_up,
                "queue_opts": {
                    name: value
                    for name, value in _queue_opts_fields(self.queue_opts).items()
                    if value != _DEFAULT_QUEUE_OPTS[name]
                },
            },
            sort_keys=True,
        )


@dataclass(frozen=True)
class UnreadableSchedule:
    """A stored schedule this version cannot fire as it was written
    (docs/schedules.md "When a schedule cannot fire").

    Its row holds an option this version does not know (saved by a newer
    release), a value outside this version's rules, a spec or time zone
    this host cannot evaluate, a queue name it refuses or a payload it
    cannot decode. Ticks skip it (and log it once per revision);
    :meth:`Store.unschedule` deletes it and :meth:`Store.schedule` replaces
    it like any other.

    Attributes
    ----------
    name
        The schedule's name, as stored.
    revision
        The stored revision: saving the schedule again makes a new one.
    reason
        Why it cannot be read, for people.
    """

    name: str
    revision: int
    reason: str


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

#: The schedule options of the stored options text, and the value each
#: takes when a row leaves it out.
_OPTION_DEFAULTS: Mapping[str, object] = {
    "priority": None,
    "max_attempts": None,
    "expires_s": None,
    "catch_up": "latest",
    "queue_opts": {},
}
_DEFAULT_QUEUE_OPTS: Mapping[str, object] = {
    f.name: getattr(QueueOpts(), f.name) for f in fields(QueueOpts)
}
#: Payload content types this version decodes (docs/contract.md §3 "Payload").
_CONTENT_TYPES = (JSON, OCTET_STREAM)
#: Said of what this version does not know.
_NEWER = "saved by a newer alkstore?"


def _queue_opts_fields(opts: QueueOpts) -> dict[str, object]:
    return {name: getattr(opts, name) for name in _DEFAULT_QUEUE_OPTS}


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


class _Refused(Exception):
    """A stored value this version cannot use; the message says which."""


def read_schedule(values: Sequence[Any]) -> Schedule | UnreadableSchedule:
    """Read one stored row, in :data:`SCHEDULE_COLUMNS` order, the way every
    engine must: datetimes already aware UTC, the other columns as
    :func:`schedule_to_values` wrote them.

    Never raises for what the row's spec, zone, queue, payload, content
    type or options hold: a row this version cannot fire as written
    becomes an :class:`UnreadableSchedule` with the reason (regression case
    014; docs/decisions.md D27). A schedule option the row leaves out
    takes its default; an option this version does not know makes the row
    unreadable rather than being ignored, since firing without it would
    enqueue jobs other than the ones it asks for.
    """
    name, revision = values[0], values[7]
    try:
        return _decode(values)
    except Exception as exc:  # whatever a stored value does, one row only
        reason = str(exc) if isinstance(exc, (_Refused, ValueError)) else repr(exc)
        return UnreadableSchedule(name=name, revision=revision, reason=reason)


def schedule_from_values(values: Sequence[Any]) -> Schedule:
    """:func:`read_schedule` for a row that must be readable, such as the
    one an engine's write returned.

    Raises
    ------
    ValueError
        With the reason, if the row is unreadable here.
    """
    read = read_schedule(values)
    if isinstance(read, UnreadableSchedule):
        raise ValueError(f"schedule {read.name!r} cannot be read: {read.reason}")
    return read


def _decode(values: Sequence[Any]) -> Schedule:
    (
        name,
        spec,
        timezone,
        queue,
        payload_bytes,
        content_type,
        options_text,
        revision,
        created_at,
        next_run_at,
        last_run_at,
        last_job_id,
    ) = values
    options = _options(options_text)
    queue_opts = options["queue_opts"]
    if not isinstance(queue_opts, dict):
        raise _Refused(f"queue options must be a JSON object, got {queue_opts!r}")
    unknown = sorted(set(queue_opts) - set(_DEFAULT_QUEUE_OPTS))
    if unknown:
        raise _Refused(f"unknown queue option(s) {', '.join(map(repr, unknown))} ({_NEWER})")
    catch_up = options["catch_up"]
    if catch_up not in CATCH_UP_POLICIES:
        raise _Refused(f"unknown catch_up policy {catch_up!r} ({_NEWER})")
    overrides = enqueue_options(
        priority=options["priority"],
        max_attempts=options["max_attempts"],
        expires=options["expires_s"],
    )
    parsed = parse_schedule(spec, timezone)
    v.queue_name(queue)
    if content_type not in _CONTENT_TYPES:
        raise _Refused(f"unknown payload content type {content_type!r} ({_NEWER})")
    schedule = Schedule(
        name=name,
        spec=parsed.spec,
        timezone=parsed.timezone,
        queue=queue,
        payload_bytes=bytes(payload_bytes),
        content_type=content_type,
        priority=overrides.priority,
        max_attempts=overrides.max_attempts,
        expires_s=overrides.expires_s,
        queue_opts=QueueOpts(**queue_opts),
        catch_up=catch_up,
        revision=revision,
        created_at=created_at,
        next_run_at=next_run_at,
        last_run_at=last_run_at,
        last_job_id=last_job_id,
    )
    try:
        schedule.payload  # noqa: B018  # decoded once here, and kept
    except ValueError as exc:
        raise _Refused(f"the payload cannot be decoded: {exc}") from exc
    return schedule


def _options(text: object) -> dict[str, Any]:
    """The stored options text as a dict, every schedule option present."""
    try:
        options = json.loads(text)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise _Refused(f"the stored options are not JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise _Refused(f"the stored options must be a JSON object, got {text!r}")
    unknown = sorted(set(options) - set(_OPTION_DEFAULTS))
    if unknown:
        raise _Refused(f"unknown schedule option(s) {', '.join(map(repr, unknown))} ({_NEWER})")
    return {**_OPTION_DEFAULTS, **options}


def same_jobs(one: Schedule, other: Schedule) -> bool:
    """Whether two schedules enqueue the same jobs on the same boundaries:
    the same spec, zone, queue, policy and stamped options, the same
    payload value (JSON key order aside), and the same effective priority,
    attempts and expiry (``None`` meaning the queue options' value)."""

    def effective(s: Schedule) -> tuple[object, ...]:
        opts = s.queue_opts
        return (
            s.spec,
            s.timezone,
            s.queue,
            s.catch_up,
            opts,
            s.content_type,
            s.payload_bytes if s.content_type != JSON else json.dumps(s.payload, sort_keys=True),
            opts.priority if s.priority is None else s.priority,
            opts.max_attempts if s.max_attempts is None else s.max_attempts,
            opts.expires_s if s.expires_s is None else s.expires_s,
        )

    return effective(one) == effective(other)
