"""What a task handler raises to choose its job's outcome: :class:`Fail` and
:class:`Retry` (docs/tasks-and-workers.md "Outcomes").

A handler that returns has its job acked; one that raises any other
exception has it retried with the queue's backoff. These two exceptions are
the explicit choices, after Celery's ``Reject``/``Retry`` and Oban's
``{:cancel, reason}``/``{:snooze, seconds}`` return values.
"""

from __future__ import annotations

import traceback

from alkstore.errors import ValidationError
from alkstore.logic import validation as v
from alkstore.runtime.lease import retry_or_bury

__all__ = ["Fail", "Retry", "describe_exception", "retry_or_bury"]


class Fail(Exception):
    """Raise from a task to dead-letter its job at once, whatever attempts
    remain (the worker calls :meth:`JobHandle.fail`, docs/contract.md §3).

    Use it for errors that no retry can fix: a malformed argument, a record
    that no longer exists.

    Parameters
    ----------
    message
        Stored as the dead job's ``last_error``; ``None`` stores ``"failed"``.

    Raises
    ------
    ValidationError
        For a ``message`` that is neither a ``str`` nor ``None`` (checked
        here, as :class:`Retry` checks its own, so that a bad message can
        never reach :meth:`JobHandle.fail`). Raised inside a handler, that
        error is itself an unexpected exception, so the job is retried with
        backoff and its ``last_error`` names the mistake.
    """

    def __init__(self, message: str | None = None) -> None:
        if message is not None and not isinstance(message, str):
            raise ValidationError(
                f"Fail's message must be a str or None, not {type(message).__name__}"
            )
        super().__init__(*(() if message is None else (message,)))
        self.message = message


class Retry(Exception):
    """Raise from a task to put its job back to run again after ``delay``
    (the worker calls :meth:`JobHandle.retry`, docs/contract.md §3).

    The retry consumes the attempt the job was claimed with: at its
    ``max_attempts`` the job is dead-lettered instead, its ``last_error``
    ``"max attempts exceeded; last error: <message>"``
    (:func:`~alkstore.runtime.lease.retry_or_bury`),
    exactly as for any other retry.

    Parameters
    ----------
    message
        Stored as the job's ``last_error``.
    delay
        Seconds (``int``/``float``) or ``timedelta``, ``>= 0``; ``None``
        uses the queue's backoff (docs/contract.md §3 "Backoff"), as an unexpected
        exception does.

    Raises
    ------
    ValidationError
        For a ``delay`` outside docs/contract.md §2's duration rule, or a ``message``
        that is not a ``str``. Raised inside a handler, that error is itself
        an unexpected exception, so the job is retried with backoff.
    """

    def __init__(self, message: str = "retry requested", *, delay: object = None) -> None:
        v.error_text(message, "Retry's message")
        self.delay_s = None if delay is None else v.duration_s(delay, "delay")
        super().__init__(message)
        self.message = message


def describe_exception(exc: BaseException) -> str:
    """The ``last_error`` of a job whose handler raised ``exc``: the
    exception's type and message on the first line (``"ValueError: boom"``),
    then a blank line and the traceback."""
    head = "".join(traceback.format_exception_only(exc)).strip()
    trace = "".join(traceback.format_exception(exc)).rstrip()
    return f"{head}\n\n{trace}"
