"""The arithmetic of the server's clock (docs/contract.md §3 "Time"): a
sample of the server's ``clock_timestamp()`` paired with the local
monotonic clock, and the time read from it.

Shared by :mod:`alkstore_postgres._clock_async` and the sync
:mod:`alkstore_postgres._clock` generated from it, which take the samples
(the I/O); this module does no I/O, and keeps the first of the samples
offered at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = ["RESAMPLE_AFTER_S", "SAMPLE_CLOCK", "ClockSample"]

#: Seconds after which the server's clock is sampled again.
RESAMPLE_AFTER_S = 60.0
#: Reads the server's clock (binary results: independent of the session's
#: ``DateStyle`` and ``TimeZone``).
SAMPLE_CLOCK = "SELECT clock_timestamp()"


class ClockSample:
    """The latest sample of the server's clock and the time read from it.

    Parameters
    ----------
    monotonic
        The local monotonic clock, in seconds (tests pass a fake one).
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._base: tuple[datetime, float] | None = None
        # Held only to compare and set the sample, never across I/O.
        self._set_lock = threading.Lock()

    def set_sample(self, server: datetime, monotonic_s: float) -> datetime:
        """Offer a sample: the server's instant and the local monotonic
        instant (seconds) at the middle of its round trip. It is used when
        the current one is due for replacing (see :meth:`reading`);
        otherwise another caller's sample, taken meanwhile, is kept: of
        samples taken at once the first to arrive wins, so every reading
        in the next minute comes from one sample and time read in one
        thread never goes back (a later arrival, one that waited longer for
        the GIL after its round trip, would estimate lower). Returns the
        server's time now, from the sample in use."""
        offered = (server.astimezone(UTC), monotonic_s)
        with self._set_lock:
            if self.reading() is None:
                self._base = offered
            base = self._base
        assert base is not None
        return base[0] + timedelta(seconds=self._monotonic() - base[1])

    def reading(self) -> datetime | None:
        """The server's current time, aware UTC: ``sample + (monotonic() -
        midpoint)``; ``None`` when there is no sample yet or it is
        :data:`RESAMPLE_AFTER_S` old."""
        base = self._base
        now_s = self._monotonic()
        if base is None or now_s - base[1] >= RESAMPLE_AFTER_S:
            return None
        return base[0] + timedelta(seconds=now_s - base[1])
