"""The :class:`Store` ABC: one database, its queues and subscriptions."""

from __future__ import annotations

import abc
import logging
import random
import threading
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING

from alkstore import _validation as v
from alkstore._backoff import Rng
from alkstore._clock import Clock, check_clock, read_clock
from alkstore._options import QueueOpts
from alkstore.errors import StoreClosedError, ValidationError

if TYPE_CHECKING:
    from alkstore._queue import Queue
    from alkstore._subscription import Subscription

__all__ = ["Store"]

log = logging.getLogger("alkstore")


class Store(abc.ABC):
    """A connection to one alkstore database (SPEC §2).

    Obtain one with :func:`alkstore.open`. A store, its queues and its
    subscriptions may be used from many threads at once. It is a context
    manager: leaving the ``with`` block closes it.

    Engine authors implement the underscore primitives (:meth:`_open_queue`,
    :meth:`_open_subscription`, :meth:`_migrate`, :meth:`_close`, and
    optionally :meth:`_engine_now`); the public methods here do the closed
    check and the argument validation for every engine.

    Parameters
    ----------
    clock
        ``None`` for the engine's own time source, or a callable returning an
        aware ``datetime`` from which every instant is then taken (SPEC §3
        "Time").
    rng
        The random source for backoff jitter (an object with
        ``randint(a, b)``); default a fresh ``random.Random``.

    Raises
    ------
    ValidationError
        For a clock that is not callable or returns a naive datetime, or an
        ``rng`` without ``randint``.
    """

    def __init__(self, *, clock: object = None, rng: object = None) -> None:
        self._clock: Clock | None = check_clock(clock)
        if rng is None:
            rng = random.Random()
        if not callable(getattr(rng, "randint", None)):
            raise ValidationError("rng must have a randint(a, b) method, like random.Random")
        self._rng: Rng = rng  # type: ignore[assignment]
        self._closed = False
        self._close_lock = threading.Lock()

    # -- public surface ------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    @property
    def rng(self) -> Rng:
        """The random source used for backoff jitter."""
        return self._rng

    def queue(self, name: str, opts: QueueOpts | None = None) -> Queue:
        """Return a handle on the queue ``name``; no I/O (SPEC §2).

        Queues are names, not registered objects: every handle on a name
        sees the same jobs; ``opts`` are stamped on the rows this handle
        enqueues.

        Raises
        ------
        StoreClosedError
            If the store is closed.
        ValidationError
            For a name outside SPEC §3's rule or ``opts`` not a ``QueueOpts``.
        """
        self._check_open()
        v.queue_name(name)
        if opts is None:
            opts = QueueOpts()
        elif not isinstance(opts, QueueOpts):
            raise ValidationError(f"opts must be a QueueOpts, not {type(opts).__name__}")
        return self._open_queue(name, opts)

    def listen(self, queue_name: str) -> Subscription:
        """Subscribe to wakes of the queue ``queue_name`` (SPEC §3 "Wake").

        Raises
        ------
        StoreClosedError
            If the store is closed.
        ValidationError
            For a name outside SPEC §3's rule.
        """
        self._check_open()
        v.queue_name(queue_name)
        return self._open_subscription(queue_name)

    def migrate(self) -> None:
        """Bring the schema to this code's version; idempotent and safe from
        many processes at once (SPEC §3 "Schema").

        Raises
        ------
        StoreClosedError
            If the store is closed.
        SchemaVersionError
            If the database's schema is newer than this code.
        """
        self._check_open()
        self._migrate()

    def close(self) -> None:
        """Release the store's connections. Idempotent; never raises."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._close()
        except Exception:
            log.warning("error while closing %r", self, exc_info=True)

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- for engines ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed")

    def _now(self) -> datetime:
        """The current instant, UTC: the injected clock's, else the engine's."""
        if self._clock is not None:
            return read_clock(self._clock)
        return self._engine_now()

    def _engine_now(self) -> datetime:
        """The engine's own time source; default the system clock."""
        return datetime.now(UTC)

    @property
    def _clock_injected(self) -> bool:
        return self._clock is not None

    @abc.abstractmethod
    def _open_queue(self, name: str, opts: QueueOpts) -> Queue:
        """Return the engine's :class:`Queue` for a checked name; no I/O."""

    @abc.abstractmethod
    def _open_subscription(self, queue_name: str) -> Subscription:
        """Return the engine's :class:`Subscription` for a checked name."""

    @abc.abstractmethod
    def _migrate(self) -> None:
        """Create or upgrade the schema; idempotent, multi-process safe."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release connections; called once."""
