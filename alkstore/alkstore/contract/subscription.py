# WARNING: generated from subscription_async.py by tools/async_to_sync.py.
# Do not edit: change subscription_async.py, then run `python tools/async_to_sync.py`.
"""The :class:`Subscription` ABC: wakes for one queue (docs/contract.md §3 "Wake")."""

from __future__ import annotations

import abc
import logging
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from alkstore.errors import StoreClosedError
from alkstore.logic import validation as v

if TYPE_CHECKING:
    from alkstore.contract.store import Store

__all__ = ["Subscription"]

log = logging.getLogger("alkstore")


class Subscription(abc.ABC):
    """Wakes for one queue, from :meth:`Store.listen`.

    Only committed enqueues wake (``enqueue``, ``enqueue_many``,
    ``enqueue_tx``). The subscription is level-triggered: :meth:`wait`
    returns ``True`` as soon as at least one wake has arrived since
    ``listen()`` or the previous ``True``, and one ``True`` consumes every
    pending wake. Rare spurious wakes are allowed; a wake is a hint, so
    consumers also re-poll on an interval. A context manager.

    Engine authors implement :meth:`_wait` and :meth:`_close`.
    """

    def __init__(self, store: Store, queue_name: str) -> None:
        self._store = store
        self._queue_name = queue_name
        self._closed = False
        self._close_lock = threading.Lock()

    @property
    def queue_name(self) -> str:
        """The queue this subscription listens to."""
        return self._queue_name

    def wait(self, timeout_s: float) -> bool:
        """Wait for a wake.

        Parameters
        ----------
        timeout_s
            Seconds, finite, ``>= 0``; ``0`` polls.

        Returns
        -------
        bool
            ``True`` when woken (consuming every pending wake), ``False``
            when the timeout passed first.

        Raises
        ------
        StoreClosedError
            If the store or this subscription is closed.
        ValidationError
            For a bad timeout.
        """
        self._check_open()
        woken = self._wait(v.duration_s(timeout_s, "timeout_s"))
        # A close from another thread releases a blocked wait: report it as
        # the closed state it is, not as a wake.
        self._check_open()
        return woken

    def _check_open(self) -> None:
        self._store._check_open()
        if self._closed:
            raise StoreClosedError("the subscription is closed")

    def close(self) -> None:
        """Stop listening. Idempotent; never raises."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._close()
        except Exception:
            log.warning("error while closing %r", self, exc_info=True)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._queue_name!r}>"

    @abc.abstractmethod
    def _wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds; see :meth:`wait`."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release what the subscription holds; called once."""
