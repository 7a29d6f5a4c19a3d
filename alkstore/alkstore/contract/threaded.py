"""The async contract for any sync engine: an :class:`~alkstore.AsyncStore`
whose primitives run the sync store's primitives on threads it owns
(docs/async.md).

The async ABCs (``*_async.py``) do the closed check, the validation, the
option resolution and the backoff once, on the event loop (pure code, no
I/O); each primitive here then runs the sync engine's primitive of the
same name on the store's :class:`~concurrent.futures.ThreadPoolExecutor`,
so the engine's I/O never runs on the loop and nothing is validated
twice. An engine with native async primitives subclasses the async ABCs
itself instead, and :func:`alkstore.open_async` uses it (the factory's
``open_async`` attribute, docs/async.md).

Threads: the store's pool (``max_threads``, default
:data:`DEFAULT_MAX_THREADS`) runs every operation; each subscription has one
thread of its own for its waits, so waiting subscribers never take the pool
from claims and acks. A wait runs in slices of at most
:data:`WAIT_SLICE_S` seconds, so a wait cancelled by asyncio leaves its
thread busy for at most one slice, and a wake that slice consumed is handed
to the next wait, not lost.

An operation whose coroutine is cancelled after it started still completes
on its thread (a thread cannot be interrupted); its result is dropped. A
dropped claim is a claim whose worker vanished: it lapses after the
visibility timeout and is reclaimed (docs/contract.md §3 "Claim").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

# Loaded with the adapter, so that the async ABCs' lazy import of it (for
# their first-use work off the loop, AsyncStore.schedule) reads no file on
# an event loop.
import alkstore._acompat_async  # noqa: F401
from alkstore.contract.handle import JobHandle
from alkstore.contract.handle_async import AsyncJobHandle
from alkstore.contract.job import Job, ListedState, QueueStats, SweepResult
from alkstore.contract.queue import Queue
from alkstore.contract.queue_async import AsyncQueue
from alkstore.contract.schedule import Schedule, UnreadableSchedule
from alkstore.contract.store import Store, check_store
from alkstore.contract.store_async import AsyncStore
from alkstore.contract.subscription import Subscription
from alkstore.contract.subscription_async import AsyncSubscription
from alkstore.contract.workers import ThroughputPoint, WorkerInfo
from alkstore.errors import EngineError, StoreClosedError, ValidationError
from alkstore.logic import validation as v
from alkstore.logic.codec import EncodedPayload
from alkstore.logic.options import QueueOpts
from alkstore.logic.resolution import Resolved

__all__ = [
    "DEFAULT_MAX_THREADS",
    "WAIT_SLICE_S",
    "ThreadedAsyncJobHandle",
    "ThreadedAsyncQueue",
    "ThreadedAsyncStore",
    "ThreadedAsyncSubscription",
    "open_threaded",
    "threaded_over",
]

#: The default size of a threaded store's pool: how many of its operations
#: run at once; more wait for a free thread, off the loop.
DEFAULT_MAX_THREADS = 8
#: The longest one blocking wait of a subscription's thread, in seconds.
WAIT_SLICE_S = 1.0

P = ParamSpec("P")
T = TypeVar("T")


class ThreadedAsyncStore(AsyncStore):
    """An :class:`~alkstore.AsyncStore` on a sync :class:`~alkstore.Store`.

    Usually made by :func:`alkstore.open_async`; build one directly to give
    async code a store already open. By default the async store owns
    ``store``: ``await close()`` closes it, then ends the threads.

    Parameters
    ----------
    store
        An open sync store; its clock and random source are used.
    max_threads
        The pool's size, ``1 .. 1024``.
    owns_store
        ``False`` leaves ``store`` open on ``await close()``, which then
        closes only what the async store opened (its subscriptions) and ends
        its threads: for a sync store that others use and close, such as
        :class:`~alkstore.App`'s (aiohttp's ``connector_owner``). The async
        store counts as closed once ``store`` is.

    Raises
    ------
    ValidationError
        For a ``store`` that is not a :class:`~alkstore.Store` or a bad
        ``max_threads``.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_threads: int = DEFAULT_MAX_THREADS,
        owns_store: bool = True,
        _executor: ThreadPoolExecutor | None = None,
    ) -> None:
        store = check_store(store, "ThreadedAsyncStore")
        max_threads = v.int_in_range(max_threads, "max_threads", 1, 1024)
        if not isinstance(owns_store, bool):
            raise ValidationError(f"owns_store must be a bool, not {type(owns_store).__name__}")
        super().__init__(rng=store.rng)
        self._sync = store
        self._owns_store = owns_store
        self._executor = _executor or _pool(max_threads)
        # The engine's own clock may read the database (PostgreSQL samples
        # the server's): then even the clock read goes to a thread.
        self._now_is_pure = store._clock_injected or type(store)._engine_now is Store._engine_now
        self._subscriptions: weakref.WeakSet[ThreadedAsyncSubscription] = weakref.WeakSet()

    @property
    def closed(self) -> bool:
        """Whether this store or the sync store under it was closed (by
        its owner, for a store made with ``owns_store=False``): every
        operation then raises ``StoreClosedError``, and loops that stop on
        a closed store (``AsyncOutbox.relay``, ``AsyncScheduler.run``) stop."""
        return self._closed or self._sync.closed

    @property
    def sync_store(self) -> Store:
        """The sync store whose primitives this store runs."""
        return self._sync

    def __repr__(self) -> str:
        return f"<{type(self).__name__} on {self._sync!r}>"

    async def _run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` on the pool; the loop waits, unblocked."""
        return await _submit(self._executor, functools.partial(fn, *args, **kwargs))

    # -- the AsyncStore primitives -------------------------------------------

    def _check_open(self) -> None:
        if self._closed or self._sync.closed:
            raise StoreClosedError("the store is closed")

    async def _now(self) -> datetime:
        if self._now_is_pure:
            return self._sync._now()
        return await self._run(self._sync._now)

    @property
    def _clock_injected(self) -> bool:
        return self._sync._clock_injected

    def _open_queue(self, name: str, opts: QueueOpts) -> ThreadedAsyncQueue:
        return ThreadedAsyncQueue(self, name, opts, self._sync._open_queue(name, opts))

    async def _open_subscription(self, queue_name: str) -> ThreadedAsyncSubscription:
        sync, executor = await self._run(self._open_sync_subscription, queue_name)
        subscription = ThreadedAsyncSubscription(self, queue_name, sync, executor)
        self._subscriptions.add(subscription)
        return subscription

    def _open_sync_subscription(self, queue_name: str) -> tuple[Subscription, ThreadPoolExecutor]:
        # On the pool: the subscription's own thread starts here, not on
        # the loop at its first wait.
        sync = self._sync._open_subscription(queue_name)
        executor = ThreadPoolExecutor(1, thread_name_prefix="alkstore-listen")
        executor.submit(_nothing).result(10)
        return sync, executor

    async def _migrate(self) -> None:
        await self._run(self._sync._migrate)

    async def _schema_version(self) -> int | None:
        return await self._run(self._sync._schema_version)

    async def _close(self) -> None:
        try:
            await self._run(self._close_owned)
        finally:
            self._end_threads()

    def _close_blocking(self) -> None:
        """:meth:`close` for sync code (``App.close``): the same, on this
        thread, without an event loop; idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._close_owned()
        finally:
            self._end_threads()

    def _close_owned(self) -> None:
        """Close the sync store if this store owns it (which releases the
        subscriptions' blocked waits too), else the subscriptions it opened."""
        if self._owns_store:
            self._sync.close()
        else:
            for subscription in list(self._subscriptions):
                subscription._sync.close()

    def _end_threads(self) -> None:
        for subscription in list(self._subscriptions):
            subscription._executor.shutdown(wait=False)
        self._executor.shutdown(wait=False)

    async def _queue_names(self) -> list[str]:
        return await self._run(self._sync._queue_names)

    async def _put_worker(self, info: WorkerInfo) -> None:
        await self._run(self._sync._put_worker, info)

    async def _delete_worker(self, worker_id: str) -> bool:
        return await self._run(self._sync._delete_worker, worker_id)

    async def _list_workers(self, now: datetime) -> list[WorkerInfo]:
        return await self._run(self._sync._list_workers, now)

    async def _put_schedule(self, schedule: Schedule) -> Schedule:
        return await self._run(self._sync._put_schedule, schedule)

    async def _delete_schedule(self, name: str) -> bool:
        return await self._run(self._sync._delete_schedule, name)

    async def _list_schedules(
        self, due_at: datetime | None
    ) -> Sequence[Schedule | UnreadableSchedule]:
        return await self._run(self._sync._list_schedules, due_at)

    async def _fire_schedule(
        self,
        schedule: Schedule,
        boundary: datetime,
        next_run_at: datetime,
        resolved: Resolved,
        payload: EncodedPayload,
    ) -> int | None:
        return await self._run(
            self._sync._fire_schedule, schedule, boundary, next_run_at, resolved, payload
        )

    async def _skip_schedule(self, schedule: Schedule, next_run_at: datetime) -> bool:
        return await self._run(self._sync._skip_schedule, schedule, next_run_at)

    def _maintenance_turn(self, task: str, interval_s: float) -> AbstractAsyncContextManager[bool]:
        return self._turn(task, interval_s)

    @asynccontextmanager
    async def _turn(self, task: str, interval_s: float) -> AsyncIterator[bool]:
        turn = self._sync._maintenance_turn(task, interval_s)
        granted = await self._run(turn.__enter__)
        try:
            yield granted
        except BaseException as error:
            if not await self._run(turn.__exit__, type(error), error, error.__traceback__):
                raise
        else:
            await self._run(turn.__exit__, None, None, None)


class ThreadedAsyncQueue(AsyncQueue):
    """An :class:`~alkstore.AsyncQueue` running a sync queue's primitives."""

    def __init__(self, store: ThreadedAsyncStore, name: str, opts: QueueOpts, sync: Queue) -> None:
        super().__init__(store, name, opts)
        self._threaded = store
        self._sync = sync

    async def _insert(
        self,
        resolved: Resolved,
        payloads: Sequence[EncodedPayload],
        unique_keys: Sequence[str | None] | None,
    ) -> list[int]:
        return await self._threaded._run(self._sync._insert, resolved, payloads, unique_keys)

    async def _insert_tx(
        self, conn: Any, resolved: Resolved, payload: EncodedPayload, unique_key: str | None
    ) -> int:
        return await self._threaded._run(self._sync._insert_tx, conn, resolved, payload, unique_key)

    async def _claim(self, worker_id: str, n: int) -> list[AsyncJobHandle]:
        handles = await self._threaded._run(self._sync._claim, worker_id, n)
        return [ThreadedAsyncJobHandle(self, handle) for handle in handles]

    async def _ack_batch(self, job_ids: list[int]) -> int:
        return await self._threaded._run(self._sync._ack_batch, job_ids)

    async def _ack_many(self, handles: list[AsyncJobHandle]) -> list[bool]:
        # The sync queue's batch, on its own handles: one statement or one
        # transaction, as the engine wrote it.
        return await self._threaded._run(self._sync._ack_many, _sync_handles(handles))

    async def _complete_batch(self, job_ids: list[int]) -> int:
        return await self._threaded._run(self._sync._complete_batch, job_ids)

    async def _complete_many(
        self, handles: list[AsyncJobHandle], results: list[bytes | None]
    ) -> list[bool]:
        return await self._threaded._run(self._sync._complete_many, _sync_handles(handles), results)

    async def _cancel(self, job_id: int) -> bool:
        return await self._threaded._run(self._sync._cancel, job_id)

    async def _get_job(self, job_id: int) -> Job | None:
        return await self._threaded._run(self._sync._get_job, job_id)

    async def _sweep_expired(
        self, retention_s: float | None, keep_completed_s: float | None
    ) -> SweepResult:
        return await self._threaded._run(self._sync._sweep_expired, retention_s, keep_completed_s)

    async def _stats(self) -> QueueStats:
        return await self._threaded._run(self._sync._stats)

    async def _lapsed_claims(self) -> int:
        return await self._threaded._run(self._sync._lapsed_claims)

    async def _set_paused(self, paused: bool) -> bool:
        return await self._threaded._run(self._sync._set_paused, paused)

    async def _is_paused(self) -> bool:
        return await self._threaded._run(self._sync._is_paused)

    async def _dead_jobs(self, limit: int, after_id: int | None) -> list[Job]:
        return await self._threaded._run(self._sync._dead_jobs, limit, after_id)

    async def _requeue(self, job_id: int, now: datetime, run_at: datetime) -> bool:
        return await self._threaded._run(self._sync._requeue, job_id, now, run_at)

    async def _run_now(self, job_id: int, now: datetime) -> bool:
        return await self._threaded._run(self._sync._run_now, job_id, now)

    async def _purge_dead(self, cutoff: datetime | None) -> int:
        return await self._threaded._run(self._sync._purge_dead, cutoff)

    async def _jobs(
        self, state: ListedState, limit: int, after_id: int | None, now: datetime
    ) -> list[Job]:
        return await self._threaded._run(self._sync._jobs, state, limit, after_id, now)

    async def _completed_count(self) -> int:
        return await self._threaded._run(self._sync._completed_count)

    async def _add_throughput(
        self, minute: datetime, completed: int, retried: int, dead: int, prune_before: datetime
    ) -> None:
        await self._threaded._run(
            self._sync._add_throughput, minute, completed, retried, dead, prune_before
        )

    async def _throughput(self, since: datetime) -> list[ThroughputPoint]:
        return await self._threaded._run(self._sync._throughput, since)


def _sync_handles(handles: list[AsyncJobHandle]) -> list[JobHandle]:
    """The sync handles under this facade's handles (all of them are)."""
    sync = [handle._sync for handle in handles if isinstance(handle, ThreadedAsyncJobHandle)]
    assert len(sync) == len(handles), "a handle of another store passed the check"
    return sync


class ThreadedAsyncJobHandle(AsyncJobHandle):
    """An :class:`~alkstore.AsyncJobHandle` running a sync handle's
    primitives; the claim's identity is the sync handle's."""

    def __init__(self, queue: ThreadedAsyncQueue, sync: JobHandle) -> None:
        super().__init__(queue, sync.job)
        self._threaded = queue._threaded
        self._sync = sync

    async def _ack(self) -> bool:
        return await self._threaded._run(self._sync._ack)

    async def _complete(self, result: bytes | None) -> bool:
        return await self._threaded._run(self._sync._complete, result)

    async def _retry(self, error: str, delay_s: float) -> bool:
        return await self._threaded._run(self._sync._retry, error, delay_s)

    async def _dead_letter(self, error: str) -> bool:
        return await self._threaded._run(self._sync._dead_letter, error)

    async def _heartbeat(self, extend_s: float) -> bool:
        return await self._threaded._run(self._sync._heartbeat, extend_s)

    async def _release(self) -> bool:
        return await self._threaded._run(self._sync._release)


def _submit(executor: ThreadPoolExecutor, call: Callable[[], T]) -> asyncio.Future[T]:
    """``call()`` on ``executor``, as a future of the running loop.

    Raises
    ------
    StoreClosedError
        If the executor has shut down: the store or subscription closed
        while this operation was on its way (past its closed check).
    """
    loop = asyncio.get_running_loop()
    try:
        return loop.run_in_executor(executor, call)
    except RuntimeError as error:  # "cannot schedule new futures after shutdown"
        raise StoreClosedError("the store is closed") from error


def _nothing() -> None:
    pass


def _retrieve(future: asyncio.Future[Any]) -> None:
    # A wait whose waiter went away may end in an error nobody awaits:
    # reading it here keeps asyncio from logging it as never retrieved.
    if not future.cancelled():
        future.exception()


class ThreadedAsyncSubscription(AsyncSubscription):
    """An :class:`~alkstore.AsyncSubscription` waiting on a sync
    subscription from a thread of its own, in slices of at most
    :data:`WAIT_SLICE_S` seconds (see the module docstring)."""

    def __init__(
        self,
        store: ThreadedAsyncStore,
        queue_name: str,
        sync: Subscription,
        executor: ThreadPoolExecutor,
    ) -> None:
        super().__init__(store, queue_name)
        self._threaded = store
        self._sync = sync
        self._executor = executor
        # The blocking wait in progress, kept across waits: a wait that
        # times out or is cancelled leaves it running, and the next wait
        # takes its result (a wake it consumed) instead of starting another.
        self._inflight: asyncio.Future[bool] | None = None

    async def _wait(self, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            future = self._inflight
            if future is not None and future.get_loop() is not loop:
                future = None  # left by another event loop: it cannot be awaited here
            inherited = future is not None
            if future is None:
                slice_s = min(max(0.0, deadline - loop.time()), WAIT_SLICE_S)
                future = _submit(self._executor, functools.partial(self._sync._wait, slice_s))
                future.add_done_callback(_retrieve)
                self._inflight = future
            # A slice this call started ends by the deadline: await it
            # whole. An inherited one may run past it: wait only until then.
            timeout = max(0.0, deadline - loop.time()) if inherited else None
            done, _ = await asyncio.wait({future}, timeout=timeout)
            if not done:
                return False
            self._inflight = None
            if future.result():
                return True
            if loop.time() >= deadline:
                return False

    async def _close(self) -> None:
        try:
            # A closed store closed this subscription's sync half already
            # (_close_owned), and its pool takes no more work.
            if not self._threaded.closed:
                # On the store's pool: this subscription's thread may be
                # blocked in a wait, which the sync close releases.
                await self._threaded._run(self._sync.close)
        finally:
            self._executor.shutdown(wait=False)


def _pool(max_threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_threads, thread_name_prefix="alkstore-async")


def _start_threads(executor: ThreadPoolExecutor, n: int) -> None:
    """From a thread of ``executor``, start its other ``n - 1`` threads, so
    that no operation starts one on the event loop later (a thread start
    waits for the new thread). Best effort: gives up after 5 s."""
    barrier = threading.Barrier(n)
    for _ in range(n - 1):
        # Each finds every started thread busy at the barrier: a new one.
        executor.submit(_meet, barrier)
    _meet(barrier)


def _meet(barrier: threading.Barrier) -> None:
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(5)


def threaded_over(
    store: Store, *, owns_store: bool, max_threads: int = DEFAULT_MAX_THREADS
) -> ThreadedAsyncStore:
    """A :class:`ThreadedAsyncStore` on ``store`` whose pool's threads are
    already started, so that no operation starts one on the event loop.
    Blocking (a thread start waits for the thread): call it off the loop.

    Raises
    ------
    ValidationError
        As :class:`ThreadedAsyncStore`.
    """
    max_threads = v.int_in_range(max_threads, "max_threads", 1, 1024)
    executor = _pool(max_threads)
    try:
        threaded = ThreadedAsyncStore(
            store, max_threads=max_threads, owns_store=owns_store, _executor=executor
        )
    except BaseException:
        executor.shutdown(wait=False)
        raise
    _start_threads(executor, max_threads)
    return threaded


async def open_threaded(
    find: Callable[[str], tuple[str, Callable[..., Store]]],
    url: str,
    engine_options: dict[str, Any],
    *,
    max_threads: int = DEFAULT_MAX_THREADS,
) -> AsyncStore:
    """:func:`alkstore.open_async`'s work, off the event loop: on a new
    pool, ``find(url)`` the engine's factory (reading entry points,
    importing the engine), then open its sync store (connecting,
    migrating) and start the pool's threads; return the async store that
    owns both. A factory with an ``open_async`` attribute is awaited
    instead, for its native async store.

    Raises
    ------
    Exception
        Whatever ``find`` or the factory raises (``UnknownEngineError``,
        ``ValidationError`` for a bad option, ``SchemaVersionError`` ...),
        after ending the pool's threads; ``EngineError`` for a native
        ``open_async`` that returns no :class:`AsyncStore`. If the opening
        coroutine is cancelled, a store the factory still opens is closed.
    """
    max_threads = v.int_in_range(max_threads, "max_threads", 1, 1024)
    executor = _pool(max_threads)

    def find_and_open() -> Store | Callable[..., Awaitable[object]]:
        _, factory = find(url)
        native: Callable[..., Awaitable[object]] | None = getattr(factory, "open_async", None)
        if native is not None:
            return native
        store = factory(url, **engine_options)
        # RuntimeError: the pool was shut down, the opening cancelled
        # meanwhile; the store goes back all the same, to be closed
        # (_close_opened).
        with contextlib.suppress(RuntimeError):
            _start_threads(executor, max_threads)
        return store

    opening = executor.submit(find_and_open)
    waited = asyncio.wrap_future(opening)
    try:
        opened = await asyncio.shield(waited)
    except asyncio.CancelledError:
        waited.add_done_callback(_retrieve)  # nobody awaits it now
        opening.add_done_callback(_close_opened)
        executor.shutdown(wait=False)
        raise
    except BaseException:
        executor.shutdown(wait=False)
        raise
    if isinstance(opened, Store):
        return ThreadedAsyncStore(opened, _executor=executor)
    executor.shutdown(wait=False)
    native_store = await opened(url, **engine_options)
    if not isinstance(native_store, AsyncStore):
        raise EngineError(
            f"the engine's open_async returned a {type(native_store).__name__}, not an AsyncStore"
        )
    return native_store


def _close_opened(opening: Future[Store | Callable[..., Awaitable[object]]]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        return
    opened = opening.result()
    if isinstance(opened, Store):
        opened.close()
