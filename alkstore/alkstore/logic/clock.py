"""The injected clock (docs/contract.md §3 "Time")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from alkstore.errors import ValidationError
from alkstore.logic.callbacks import check_runs_when_called
from alkstore.logic.validation import aware_utc

__all__ = ["Clock", "check_clock", "read_clock"]

#: A callable returning the current instant as an aware ``datetime``.
Clock = Callable[[], datetime]


def read_clock(clock: Clock) -> datetime:
    """Read ``clock`` and return the instant in UTC.

    Raises
    ------
    ValidationError
        If the clock returns anything but an aware ``datetime``.
    """
    return aware_utc(clock(), "the clock's reading")


def check_clock(clock: object) -> Clock | None:
    """Check the ``clock=`` engine option: ``None`` or a callable returning an
    aware ``datetime`` (it is read once here).

    Raises
    ------
    ValidationError
        If it is not callable, is an ``async def`` (its call would return a
        coroutine, not an instant), or returns a naive datetime.
    """
    if clock is None:
        return None
    if not callable(clock):
        raise ValidationError(f"clock must be callable, not {type(clock).__name__}")
    check_runs_when_called(clock, "the clock")
    read_clock(clock)
    return clock
