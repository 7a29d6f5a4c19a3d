"""A manual clock for tests: time moves only when the test says so."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

__all__ = ["T0", "ManualClock"]

#: The instant every contract test starts at (the regression cases' T0).
T0 = datetime(2030, 1, 1, tzinfo=UTC)


class ManualClock:
    """A thread-safe clock to pass as ``clock=``: calling it returns the
    current instant; :meth:`advance` and :meth:`set` move it.

    docs/contract.md §3 "Time": with an injected clock engines take every instant from it,
    so tests reach lapses, expiry, backoff and retention without sleeping.
    """

    def __init__(self, start: datetime = T0) -> None:
        self._lock = threading.Lock()
        self._now = start

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float | timedelta) -> datetime:
        """Move forward by ``seconds`` (or a ``timedelta``); return the new now."""
        step = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        with self._lock:
            self._now += step
            return self._now

    def set(self, instant: datetime) -> None:
        """Jump to ``instant`` (an aware datetime)."""
        with self._lock:
            self._now = instant
