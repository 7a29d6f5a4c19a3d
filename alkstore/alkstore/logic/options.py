"""Per-queue options (docs/contract.md §2 "QueueOpts")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from alkstore.errors import ValidationError
from alkstore.logic import validation as v

__all__ = ["MAX_BACKOFF_CAP_S", "QueueOpts"]

#: The largest ``backoff_cap_s`` accepted: one hour (docs/contract.md §2).
MAX_BACKOFF_CAP_S = 3600


def _whole_seconds(value: object, what: str, high: float) -> int:
    # Any duration form (docs/contract.md §2), as long as it is a whole number of seconds.
    if isinstance(value, (timedelta, float)):
        seconds = v.duration_s(value, what)
        if seconds != int(seconds):
            raise ValidationError(f"{what} must be whole seconds, got {value!r}")
        value = int(seconds)
    return v.int_in_range(value, what, 0, int(high))


@dataclass(frozen=True)
class QueueOpts:
    """Options of a queue handle, validated on construction (docs/contract.md §2).

    Durations are seconds (``int``/``float``) or ``timedelta``; they are
    normalised to seconds, so the fields always read as numbers.

    Attributes
    ----------
    visibility_timeout_s
        How long a claim lasts before it lapses and the job may be
        reclaimed; ``> 0``. Stamped on each row at enqueue.
    max_attempts
        Claims a job may consume, ``1 .. 2**31-1``. Stamped; per-job override.
    priority
        Higher runs first, ``-2**31 .. 2**31-1``. Stamped; per-job override.
    backoff_base_s
        Whole seconds, ``>= 0``; the first retry waits about this long
        (0 retries at once). Stamped.
    backoff_cap_s
        Whole seconds, ``0 .. 3600``; larger is an error, never clamped. Stamped.
    expires_s
        ``None`` (never) or ``> 0``: a job expires this long after enqueue
        unless ``enqueue(expires=...)`` says otherwise.
    dead_letter_retention_s
        ``None`` (keep forever) or ``>= 0``: read by
        :meth:`Queue.sweep_expired` from the calling handle, not stamped.
    keep_completed_s
        ``None`` (an ack deletes the job) or ``>= 0``: an ack through this
        handle keeps the job as ``"completed"``, with ``finished_at`` and
        its result, and :meth:`Queue.sweep_expired` through this handle
        purges completed jobs this long after they finished
        (docs/contract.md §3 "Completed jobs"). Not stamped.

    Raises
    ------
    ValidationError
        On construction, for a value outside its rule.
    """

    visibility_timeout_s: float = 30
    max_attempts: int = 5
    priority: int = 0
    backoff_base_s: int = 4
    backoff_cap_s: int = 3600
    expires_s: float | None = None
    dead_letter_retention_s: float | None = None
    keep_completed_s: float | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        put(
            "visibility_timeout_s",
            v.duration_s(self.visibility_timeout_s, "visibility_timeout_s", positive=True),
        )
        put(
            "max_attempts",
            v.int_in_range(self.max_attempts, "max_attempts", 1, v.INT32_MAX),
        )
        put(
            "priority",
            v.int_in_range(self.priority, "priority", v.INT32_MIN, v.INT32_MAX),
        )
        put(
            "backoff_base_s",
            _whole_seconds(self.backoff_base_s, "backoff_base_s", v.MAX_DURATION_S),
        )
        put(
            "backoff_cap_s",
            _whole_seconds(self.backoff_cap_s, "backoff_cap_s", MAX_BACKOFF_CAP_S),
        )
        if self.expires_s is not None:
            put("expires_s", v.duration_s(self.expires_s, "expires_s", positive=True))
        if self.dead_letter_retention_s is not None:
            put(
                "dead_letter_retention_s",
                v.duration_s(self.dead_letter_retention_s, "dead_letter_retention_s"),
            )
        if self.keep_completed_s is not None:
            put("keep_completed_s", v.duration_s(self.keep_completed_s, "keep_completed_s"))
