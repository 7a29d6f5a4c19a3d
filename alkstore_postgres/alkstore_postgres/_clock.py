# WARNING: generated from _clock_async.py by tools/async_to_sync.py.
# Do not edit: change _clock_async.py, then run `python tools/async_to_sync.py`.
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

The arithmetic is :class:`~alkstore_postgres._clock_sample.ClockSample`,
shared; this module takes the samples, one at a time. It is one source for
two modules (docs/async.md "How the engines do it"): ``_clock_async`` is
written by hand, ``_clock`` is generated from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from alkstore.engine import Lock
from alkstore_postgres._clock_sample import RESAMPLE_AFTER_S, ClockSample

__all__ = ["RESAMPLE_AFTER_S", "Sample", "ServerClock"]

#: Reads the server's clock: returns its instant and the local monotonic
#: instant (seconds) at the middle of the round trip.
Sample = Callable[[], tuple[datetime, float]]


class ServerClock(ClockSample):
    """The server's current time, from a sample and the monotonic clock.

    Parameters
    ----------
    sample
        Reads the server's clock on a pooled connection (see
        :data:`Sample`); called at most once per
        :data:`RESAMPLE_AFTER_S` seconds, under a lock.
    monotonic
        The local monotonic clock, in seconds (tests pass a fake one).
    """

    def __init__(self, sample: Sample, monotonic: Callable[[], float] = time.monotonic) -> None:
        super().__init__(monotonic)
        self._sample = sample
        self._lock = Lock()

    def now(self, sample: Sample | None = None) -> datetime:
        """The server's current time, aware UTC.

        Parameters
        ----------
        sample
            Reads the server's clock if a re-sample is due, instead of the
            one given at construction (an operation passes one on the
            connection it holds). It runs at once, outside the lock: the
            lock's holder may be waiting for a pooled connection, this
            caller's (with ``pool_max_size=1`` both would wait out the
            pool's timeout). Concurrent holders may each sample once; the
            first sample to arrive wins (``ClockSample.set_sample``).

        Raises
        ------
        EngineError
            If a needed re-sample fails.
        """
        now = self.reading()
        if now is not None:
            return now
        if sample is not None:
            return self.set_sample(*sample())
        with self._lock:
            now = self.reading()
            if now is None:
                now = self.set_sample(*self._sample())
        return now
