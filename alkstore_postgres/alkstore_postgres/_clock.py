"""The database server's clock, tracked locally (docs/contract.md §3 "Time").

Without an injected ``clock=``, every instant the engine uses comes from the
PostgreSQL server, so workers on hosts with skewed clocks agree. Asking the
server on every operation would cost a round trip or tie each instant to
its statement; instead the store samples ``clock_timestamp()`` once, pairs
it with the midpoint of the round trip on the local monotonic clock, and
then reads ``sample + (monotonic() - midpoint)``. The sample is refreshed
after :data:`RESAMPLE_AFTER_S` seconds, so the local oscillator's drift and
server clock steps are followed within a minute.

Two hosts agree to within their round trips' half-widths (typically well
under a millisecond on a LAN). Every operation reads this clock once and
passes the instant to its statement as a parameter, exactly as with an
injected clock, so one store never mixes two time sources.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = ["RESAMPLE_AFTER_S", "ServerClock", "Sample"]

#: Seconds after which the server's clock is sampled again.
RESAMPLE_AFTER_S = 60.0

#: Reads the server's clock: returns its instant and the local monotonic
#: instant (seconds) at the middle of the round trip.
Sample = Callable[[], tuple[datetime, float]]


class ServerClock:
    """The server's current time, from a sample and the monotonic clock.

    Parameters
    ----------
    sample
        Reads the server's clock (see :data:`Sample`); called at most once
        per :data:`RESAMPLE_AFTER_S` seconds, under a lock.
    monotonic
        The local monotonic clock, in seconds (tests pass a fake one).
    """

    def __init__(self, sample: Sample, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._sample = sample
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._base: tuple[datetime, float] | None = None

    def set_sample(self, server: datetime, monotonic_s: float) -> None:
        """Use a sample taken elsewhere (at open, on a connection at hand)."""
        self._base = (server.astimezone(UTC), monotonic_s)

    def now(self, sample: Sample | None = None) -> datetime:
        """The server's current time, aware UTC.

        Parameters
        ----------
        sample
            Reads the server's clock if a re-sample is due, instead of the
            one given at construction (an operation passes one on the
            connection it holds).

        Raises
        ------
        EngineError
            If a needed re-sample fails.
        """
        base = self._base
        now_s = self._monotonic()
        if base is None or now_s - base[1] >= RESAMPLE_AFTER_S:
            with self._lock:
                base = self._base
                if base is None or self._monotonic() - base[1] >= RESAMPLE_AFTER_S:
                    server, mid_s = (sample or self._sample)()
                    base = self._base = (server.astimezone(UTC), mid_s)
            now_s = self._monotonic()
        server, mid_s = base
        return server + timedelta(seconds=now_s - mid_s)
