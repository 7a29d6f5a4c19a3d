"""The PostgreSQL :class:`~alkstore.AsyncSubscription` (docs/contract.md §3 "Wake")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alkstore import AsyncSubscription
from alkstore_postgres._acompat import AWakeLatch
from alkstore_postgres._wake import channel_name

if TYPE_CHECKING:
    from alkstore_postgres._store_async import AsyncPostgresStore

__all__ = ["AsyncPostgresSubscription"]


class AsyncPostgresSubscription(AsyncSubscription):
    """Wakes for one queue, from the store's LISTEN connection.

    Level-triggered through a wake latch: the store's listener sets it for
    every NOTIFY on the queue's channel, and once after each reconnection of
    the LISTEN connection (wakes may have been lost meanwhile). :meth:`wait`
    returns ``True`` only then (so rarely spuriously), and waits for it
    without polling; re-polling on an interval is the consumer's job (see
    ``AsyncPostgresStore.repoll_interval_s``).

    Made by the store's ``listen``, which raises ``EngineError`` if the
    store's first LISTEN connection cannot be opened.
    """

    def __init__(self, store: AsyncPostgresStore, queue_name: str) -> None:
        super().__init__(store, queue_name)
        self._pg_store = store
        self._channel = channel_name(store.schema, queue_name)
        self._latch = AWakeLatch()

    @property
    def channel(self) -> str:
        """The NOTIFY channel this subscription listens on."""
        return self._channel

    async def _subscribe(self) -> None:
        await self._pg_store._listener.subscribe(self._channel, self._latch)

    async def _wait(self, timeout_s: float) -> bool:
        return await self._latch.wait(timeout_s)

    async def _close(self) -> None:
        await self._pg_store._listener.unsubscribe(self._channel, self._latch)
        # Release a waiter blocked elsewhere.
        self._latch.set()
