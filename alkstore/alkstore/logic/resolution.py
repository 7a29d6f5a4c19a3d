"""Option resolution for enqueue (docs/contract.md §3 "Option resolution").

Two pure steps that every engine shares: :func:`enqueue_options` checks the
per-call arguments before anything else happens, and :func:`resolve` turns
them, the queue handle's :class:`QueueOpts` and one clock reading into the
values stamped on the new rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from alkstore.errors import ValidationError
from alkstore.logic import validation as v
from alkstore.logic.duration import duration
from alkstore.logic.options import QueueOpts

__all__ = ["EnqueueOptions", "Resolved", "enqueue_options", "resolve"]


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-call enqueue options, checked and normalised (seconds, UTC)."""

    delay_s: float | None = None
    run_at: datetime | None = None
    priority: int | None = None
    max_attempts: int | None = None
    expires_s: float | None = None


@dataclass(frozen=True)
class Resolved:
    """The values stamped on every row of one enqueue call.

    All items of one ``enqueue_many`` share them (one clock read).
    """

    enqueued_at: datetime
    run_at: datetime
    expires_at: datetime | None
    priority: int
    max_attempts: int
    visibility_timeout_s: float
    backoff_base_s: int
    backoff_cap_s: int


def enqueue_options(
    *,
    delay: object = None,
    run_at: object = None,
    priority: object = None,
    max_attempts: object = None,
    expires: object = None,
) -> EnqueueOptions:
    """Check enqueue's keyword arguments (docs/contract.md §2, §3 "Validation").

    Parameters
    ----------
    delay
        Seconds or ``timedelta`` from now, ``>= 0``; wins over ``run_at``.
    run_at
        A timezone-aware ``datetime`` in any zone.
    priority
        ``int`` in ``-2**31 .. 2**31-1``; overrides the queue's.
    max_attempts
        ``int`` in ``1 .. 2**31-1``; overrides the queue's.
    expires
        Seconds or ``timedelta`` after the enqueue instant, ``> 0``;
        overrides ``QueueOpts.expires_s``.

    Raises
    ------
    ValidationError
        For any argument outside its rule.
    """
    return EnqueueOptions(
        delay_s=None if delay is None else v.duration_s(delay, "delay"),
        run_at=None if run_at is None else v.aware_utc(run_at, "run_at"),
        priority=None
        if priority is None
        else v.int_in_range(priority, "priority", v.INT32_MIN, v.INT32_MAX),
        max_attempts=None
        if max_attempts is None
        else v.int_in_range(max_attempts, "max_attempts", 1, v.INT32_MAX),
        expires_s=None if expires is None else v.duration_s(expires, "expires", positive=True),
    )


def resolve(now: datetime, opts: QueueOpts, options: EnqueueOptions) -> Resolved:
    """Resolve one enqueue call's row values from one clock reading.

    ``delay`` wins over ``run_at``; neither means ``now``. ``expires`` is
    relative to ``now`` and falls back to ``opts.expires_s``. The
    visibility timeout and backoff stamps always come from ``opts``.

    Parameters
    ----------
    now
        The store's clock reading, timezone-aware.
    opts
        The enqueueing queue handle's options.
    options
        The call's checked options (:func:`enqueue_options`).

    Raises
    ------
    ValidationError
        If the resolved ``expires_at`` is at or before the resolved ``run_at``.
    """
    if options.delay_s is not None:
        run_at = now + duration(options.delay_s)
    elif options.run_at is not None:
        run_at = options.run_at
    else:
        run_at = now
    expires_s = options.expires_s if options.expires_s is not None else opts.expires_s
    expires_at = None if expires_s is None else now + duration(expires_s)
    if expires_at is not None and expires_at <= run_at:
        raise ValidationError(
            f"the job would expire at {expires_at.isoformat()}, not after it "
            f"becomes due at {run_at.isoformat()}"
        )
    return Resolved(
        enqueued_at=now,
        run_at=run_at,
        expires_at=expires_at,
        priority=opts.priority if options.priority is None else options.priority,
        max_attempts=opts.max_attempts if options.max_attempts is None else options.max_attempts,
        visibility_timeout_s=opts.visibility_timeout_s,
        backoff_base_s=opts.backoff_base_s,
        backoff_cap_s=opts.backoff_cap_s,
    )
