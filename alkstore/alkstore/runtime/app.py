"""The :class:`App`: a store opened on first use, its tasks and their queues
(docs/tasks-and-workers.md).

The shape is Celery's ``Celery`` app and huey's ``Huey`` object: created at
import time in the module that defines the tasks, so that a worker process
(``alkstore worker MODULE:APP``) imports the same module and finds the same
tasks by name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar, cast, overload

from alkstore._off_loop import on_thread
from alkstore.contract.registry import DEFAULT_URL, URL_ENV
from alkstore.contract.registry import open as open_store
from alkstore.contract.store import Store
from alkstore.errors import ValidationError
from alkstore.logic import validation as v
from alkstore.logic.callbacks import handler_kind
from alkstore.logic.options import QueueOpts
from alkstore.runtime.observe import Observer, Observers
from alkstore.runtime.outbox import Outbox, Send
from alkstore.runtime.task import Task, UniqueRule, check_unique_rule, default_task_name

if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Future

    from alkstore.contract.queue import Queue
    from alkstore.contract.queue_async import AsyncQueue
    from alkstore.contract.store_async import AsyncStore
    from alkstore.contract.threaded import ThreadedAsyncStore
    from alkstore.runtime.context import JobContext
    from alkstore.runtime.outbox_async import AsyncOutbox
    from alkstore.runtime.worker import Worker

__all__ = ["DEFAULT_QUEUE", "App"]

P = ParamSpec("P")
R = TypeVar("R")

#: The queue of a task registered without ``queue=`` (RQ's default name).
DEFAULT_QUEUE = "default"

log = logging.getLogger("alkstore")


#: :class:`AsyncOutbox`, once :func:`_async_outbox` has imported it.
_async_outbox_class: list[type[AsyncOutbox]] = []


async def _async_outbox() -> type[AsyncOutbox]:
    """:class:`AsyncOutbox`, imported off the event loop the first time:
    a module's first import reads (perhaps compiles) its files and its
    imports' (docs/async.md "Tasks and workers")."""
    if not _async_outbox_class:
        _async_outbox_class.append(await on_thread(_import_async_outbox, "alkstore-import"))
    return _async_outbox_class[0]


def _import_async_outbox() -> type[AsyncOutbox]:
    from alkstore.runtime.outbox_async import AsyncOutbox

    return AsyncOutbox


class _OpeningAbandoned(Exception):
    """The coroutine opening the app's async store was cancelled: another
    caller waiting for it opens it instead."""


class App:
    """Tasks, their queues and the store they share.

    The store is opened lazily, on the first enqueue, worker or
    :attr:`store` access, so an ``App`` can be created at import time.
    Async code gets the app's :class:`AsyncStore` with ``await``
    :meth:`astore` (opened lazily too) and closes both with ``await``
    :meth:`aclose` or ``async with app`` (docs/async.md).

    Parameters
    ----------
    url
        The store's URL for :func:`alkstore.open`; ``None`` reads
        ``ALKSTORE_URL`` when the store opens, else the embedded
        ``sqlite:///alkstore.db``.
    store
        An already-open :class:`Store` to use instead of opening one (the
        caller keeps it and closes it; :meth:`close` does not). Excludes
        ``url`` and engine options.
    **engine_options
        Passed to :func:`alkstore.open` (``clock=``, ``rng=``,
        ``migrate=``, and the engine's own).

    Raises
    ------
    ValidationError
        If ``url`` is not a ``str``, or ``store`` is given together with
        ``url`` or engine options, or is not a :class:`Store`. (The URL's
        form and the engine options are checked when the store opens.)
    """

    def __init__(
        self, url: str | None = None, *, store: Store | None = None, **engine_options: Any
    ) -> None:
        if url is not None and not isinstance(url, str):
            raise ValidationError(f"url must be a str, not {type(url).__name__}")
        if store is not None:
            if url is not None or engine_options:
                raise ValidationError("give either store= or a url and engine options, not both")
            if not isinstance(store, Store):
                raise ValidationError(f"store must be a Store, not {type(store).__name__}")
        self._url = url
        self._engine_options = dict(engine_options)
        self._store = store
        self._owns_store = store is None
        # Two locks. _lock guards the app's state and is only ever held for
        # a few lines of bookkeeping, never across I/O or an import, so the
        # async methods may take it on an event loop. _store_lock orders the
        # sync store's opening and closing and is held across their I/O
        # (connect, migrate, close): only sync callers, on their threads,
        # take it, never an async method on a loop (docs/async.md).
        self._lock = threading.RLock()
        self._store_lock = threading.Lock()
        self._tasks: dict[str, Task[Any, Any]] = {}
        # Queue names in first-registration order; the options given for a
        # queue by any of its tasks (None: defaults, until a task gives some).
        self._queue_opts: dict[str, QueueOpts | None] = {}
        self._queues: dict[str, Queue] = {}
        # Outbox queues and their relays' send functions; their options live
        # in _relay_opts, apart from the task queues a worker claims from.
        self._relays: dict[str, Send] = {}
        self._relay_opts: dict[str, QueueOpts] = {}
        # The outbox queues whose send takes a JobContext first.
        self._relay_contexts: set[str] = set()
        # The async store (astore()), the opening under way, the loop a
        # native one belongs to (None: the thread adapter over the app's
        # store, which any loop may use), and its queue handles.
        self._astore: AsyncStore | None = None
        self._aopening: Future[AsyncStore] | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._aqueues: dict[str, AsyncQueue] = {}
        # The observers (add_observer), None when there is none: tasks and
        # workers test only that (docs/operations.md "Metrics and telemetry").
        self._observing: Observers | None = None

    def __repr__(self) -> str:
        return f"<App {self.url!r}, {len(self._tasks)} task(s)>"

    # -- the store -----------------------------------------------------------

    @property
    def url(self) -> str:
        """The URL the store is (or will be) opened with: the ``url`` given,
        else ``$ALKSTORE_URL``, else ``sqlite:///alkstore.db``. Empty for an
        app made with ``store=``."""
        if self._url is not None:
            return self._url
        if not self._owns_store:
            return ""
        return os.environ.get(URL_ENV) or DEFAULT_URL

    def configure(self, url: str | None = None, **engine_options: Any) -> None:
        """Change the URL or engine options before the store opens (a
        command-line ``--url`` overriding the one given at import time).

        Parameters
        ----------
        url
            The new URL; ``None`` keeps the current one.
        **engine_options
            Set over the current engine options (the others are kept).

        Raises
        ------
        RuntimeError
            If the store is already open, or the app was made with ``store=``.
        """
        with self._store_lock, self._lock:  # after an opening under way: it is then open
            if self._store is not None:
                raise RuntimeError("the app's store is already open; configure it before first use")
            if url is not None:
                self._url = url
            self._engine_options.update(engine_options)

    @property
    def store(self) -> Store:
        """The app's store, opened on first access (thread-safe: one opening,
        which other threads asking meanwhile wait for). Blocking while it
        opens (connecting, migrating): from async code, use :meth:`astore`.

        Raises
        ------
        UnknownEngineError, ValidationError, SchemaVersionError, EngineError
            As :func:`alkstore.open`.
        """
        store = self._store
        if store is not None:
            return store
        with self._store_lock:
            with self._lock:
                if self._store is not None:
                    return self._store
                url = self.url
                self._url = url  # resolved once: later env changes do not move the app
                options = dict(self._engine_options)
            opened = open_store(url, **options)  # I/O: under _store_lock only
            with self._lock:
                self._store = opened
            return opened

    def close(self) -> None:
        """Close the store if the app opened it; idempotent. Tasks stay
        registered, and the next use opens a new store.

        The async store (:meth:`astore`) is closed with it when it is the
        thread adapter, which needs no event loop to close. Any other needs
        its loop: it is left open (and a warning logged) for ``await``
        :meth:`aclose`.
        """
        from_sync: ThreadedAsyncStore | None = None
        with self._store_lock:  # after an opening under way: what it opened is closed
            with self._lock:
                store, self._queues = self._store, {}
                if self._owns_store:
                    self._store = None
                astore = self._astore
                if astore is not None and self._aloop is None:  # the thread adapter's
                    from_sync = cast("ThreadedAsyncStore", astore)
                    self._astore, self._aqueues = None, {}
            if from_sync is not None:
                from_sync._close_blocking()
            if store is not None and self._owns_store:
                store.close()
        if astore is not None and from_sync is None:
            log.warning(
                "app.close() leaves the app's async store open: close it with await app.aclose()"
            )

    def __enter__(self) -> App:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the async store (docs/async.md "Tasks and workers") ------------------

    async def astore(self) -> AsyncStore:
        """The app's :class:`AsyncStore`, opened on the first await (once,
        whatever the number of coroutines, threads and loops asking).

        When the engine has native async primitives (docs/async.md), it is
        ``await alkstore.open_async(app.url, **engine_options)``: a store of
        its own, bound to the event loop that opened it. Otherwise it is a
        :class:`~alkstore.contract.threaded.ThreadedAsyncStore` over the
        app's own :attr:`store` (opened if need be, off the loop), which it
        never closes; an app made with ``store=`` wraps that store. Either
        way nothing blocks the loop: engine lookup, opening and the thread
        starts run on a thread.

        Raises
        ------
        UnknownEngineError, ValidationError, SchemaVersionError, EngineError
            As :func:`alkstore.open_async` and :attr:`store`.
        RuntimeError
            For a native async store opened on another event loop that is
            still open (close it there with :meth:`aclose`). One whose loop
            has closed is dropped with a warning, and a new one opened.
        """
        import asyncio
        from concurrent.futures import Future

        while True:
            with self._lock:
                store, loop = self._astore, self._aloop
            if store is not None and await self._usable_here(loop):
                return store
            with self._lock:
                if self._astore is not None:
                    continue
                opening = self._aopening
                mine = opening is None
                if opening is None:
                    opening = self._aopening = Future()
            if not mine:
                # Shielded: a waiter's cancellation never cancels the opening.
                with contextlib.suppress(_OpeningAbandoned):  # then opened here
                    await asyncio.shield(asyncio.wrap_future(opening))
                # What it opened, checked above as any store: a native one may
                # belong to another loop.
                continue
            try:
                store, loop = await self._open_astore()
            except BaseException as error:
                with self._lock:
                    self._aopening = None
                opening.set_exception(
                    error if isinstance(error, Exception) else _OpeningAbandoned()
                )
                raise
            with self._lock:
                self._astore, self._aloop, self._aopening = store, loop, None
            opening.set_result(store)
            return store

    async def _open_astore(self) -> tuple[AsyncStore, asyncio.AbstractEventLoop | None]:
        """Open the async store; also the loop it belongs to (``None``: any)."""
        import asyncio

        from alkstore.contract.registry import ahas_native_async, open_async, open_async_over

        if self._owns_store:
            with self._lock:
                url, options = self.url, dict(self._engine_options)
            if await ahas_native_async(url):
                with self._lock:
                    self._url = url  # resolved once, as the store's is
                store: AsyncStore = await open_async(url, **options)
                return store, asyncio.get_running_loop()
        # Over the app's own store, opened if need be (off the loop, too).
        return await open_async_over(lambda: self.store), None

    async def _usable_here(self, loop: asyncio.AbstractEventLoop | None) -> bool:
        """Whether the async store that belongs to ``loop`` (``None``: the
        thread adapter's, any loop) may be used on the running loop: only
        its own for a native one. A native store whose loop is closed cannot
        be used or closed any more: it is dropped, with a warning, and
        ``False`` returned.

        Raises
        ------
        RuntimeError
            For a native store of another loop, still open.
        """
        if loop is None:
            return True
        import asyncio

        if asyncio.get_running_loop() is loop:
            return True
        if not loop.is_closed():
            raise RuntimeError(
                "the app's async store is native to another event loop, still open; "
                "close it there with await app.aclose() before using the app on this one"
            )
        with self._lock:
            if self._aloop is loop:
                self._astore, self._aloop, self._aqueues = None, None, {}
        # Logged from a thread, as every record of the runtime's: a
        # record's handlers write (to a terminal, a file, a socket).
        await on_thread(
            lambda: log.warning(
                "the app's async store belonged to an event loop that has closed, so it "
                "could not be closed: await app.aclose() before the loop ends"
            ),
            "alkstore-log",
        )
        return False

    async def aqueue(self, name: str) -> AsyncQueue:
        """The async store's handle on the queue ``name`` with
        :meth:`queue_opts`, as :meth:`queue` is the store's (cached; opens
        the async store).

        Raises
        ------
        ValidationError
            For a name outside docs/contract.md §3's rule.
        UnknownEngineError, SchemaVersionError, EngineError, RuntimeError
            As :meth:`astore`.
        """
        store = await self.astore()
        with self._lock:
            queue = self._aqueues.get(name)
            if queue is None or queue.store is not store:
                queue = store.queue(name, self.queue_opts(name))
                self._aqueues[name] = queue
            return queue

    async def aoutbox(self, queue: str) -> AsyncOutbox:
        """The :class:`~alkstore.AsyncOutbox` on the queue ``queue``, with
        the options its relay gave, as :meth:`outbox` (opens the async store).

        Raises
        ------
        ValidationError
            For a name outside docs/contract.md §3's rule.
        """
        outbox_queue = await self.aqueue(queue)
        return (await _async_outbox())(outbox_queue)

    async def aclose(self) -> None:
        """Close the async store, then the store, each if the app opened it;
        idempotent. The next use opens new ones. A :class:`ThreadedAsyncStore`
        over the app's store (or a ``store=`` given) ends its threads and
        leaves that store to :meth:`close`.

        Raises
        ------
        RuntimeError
            For a native async store opened on another event loop that is
            still open.
        """
        import asyncio

        with self._lock:
            opening = self._aopening
        if opening is not None:  # let it finish, then close what it opened
            with contextlib.suppress(Exception):  # the opener raised it already
                await asyncio.shield(asyncio.wrap_future(opening))
        astore = None
        with self._lock:
            loop = self._aloop
        if await self._usable_here(loop):
            with self._lock:
                astore, self._astore, self._aloop, self._aqueues = self._astore, None, None, {}
        if astore is not None:
            await astore.close()
        await on_thread(self.close, "alkstore-close")

    async def _aclose_loops_store(self) -> None:
        """Close the async store if it is native to the running event loop,
        and forget it; the sync store, and a thread adapter over it (which
        any loop may use), are left to :meth:`close`. For the owner of a
        loop about to end, on which the app's store was opened on the app's
        behalf (``Worker.run``'s own loop, where a task awaited
        ``aenqueue``): closed on its loop, not at the loop's end with a
        warning no one can act on."""
        import asyncio

        loop = asyncio.get_running_loop()
        with self._lock:
            astore = self._astore
            if astore is None or self._aloop is not loop:
                return
            self._astore, self._aloop, self._aqueues = None, None, {}
        await astore.close()

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- tasks and queues ----------------------------------------------------

    @property
    def tasks(self) -> Mapping[str, Task[Any, Any]]:
        """The registered tasks by name (a copy)."""
        with self._lock:
            return dict(self._tasks)

    @property
    def queue_names(self) -> list[str]:
        """The queues of the registered tasks, in first-registration order."""
        with self._lock:
            return list(self._queue_opts)

    def queue_opts(self, name: str) -> QueueOpts:
        """The :class:`QueueOpts` of the queue ``name``: those its tasks gave,
        else the defaults."""
        with self._lock:
            return self._queue_opts.get(name) or self._relay_opts.get(name) or QueueOpts()

    def queue(self, name: str) -> Queue:
        """The store's handle on the queue ``name`` with :meth:`queue_opts`
        (cached; opens the store).

        Raises
        ------
        ValidationError
            For a name outside docs/contract.md §3's rule.
        """
        while True:
            with self._lock:
                queue = self._queues.get(name)
            if queue is not None:
                return queue
            store = self.store  # opened, if need be, outside _lock
            with self._lock:
                if store is not self._store:  # closed meanwhile: the next use opens anew
                    continue
                queue = self._queues.get(name)
                if queue is None:
                    queue = store.queue(name, self.queue_opts(name))
                    self._queues[name] = queue
                return queue

    @overload
    def task(self, func: Callable[P, R], /) -> Task[P, R]: ...
    @overload
    def task(
        self,
        *,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
        takes_context: Literal[False] = False,
        unique_key: UniqueRule = None,
        **queue_opts: Any,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...
    @overload
    def task(
        self,
        *,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
        takes_context: Literal[True],
        unique_key: UniqueRule = None,
        **queue_opts: Any,
    ) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[P, R]]: ...
    def task(
        self,
        __func: Callable[P, R] | None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
        takes_context: bool = False,
        unique_key: UniqueRule = None,
        **queue_opts: Any,
    ) -> Task[P, R] | Callable[[Callable[..., R]], Task[P, R]]:
        """Register a function as a task: ``@app.task`` or
        ``@app.task(queue="emails", max_attempts=3)``.

        Parameters
        ----------
        queue
            The queue its jobs go to; default ``"default"``.
        name
            The name stored in payloads; default ``module.qualname``
            (:func:`default_task_name`). Name tasks explicitly when their
            module may move: a worker finds the function by this name.
        takes_context
            Pass the job's :class:`~alkstore.JobContext` as the function's
            first positional argument, before the enqueued ones (Django's
            Tasks convention; docs/tasks-and-workers.md "Job context").
            ``enqueue`` and its twins then take the arguments without it.
            The :class:`Task` is typed by those (the enqueue arguments), so
            a type checker wants a plain call as ``task.func(context, ...)``.
        unique_key
            The task's unique jobs (docs/tasks-and-workers.md "Unique
            jobs"): ``True`` keeps one live job per distinct call (a hash
            of the task's name and its bound arguments), a ``str`` one live
            job of the task, a function of the enqueue arguments returning
            a key (or ``None``) one per key; enqueueing a call whose key a
            live job holds stores nothing and returns that job's id
            (docs/contract.md §3 "Unique keys").
        **queue_opts
            :class:`QueueOpts` fields for the queue (``visibility_timeout_s``,
            ``max_attempts``, ``backoff_base_s`` ...), stamped on every job
            the app enqueues there. Tasks sharing a queue share its options.

        Returns
        -------
        Task
            The registered task (or a decorator that returns it).

        Raises
        ------
        ValidationError
            For a bad queue name or option, a name already registered,
            options that differ from those another task gave the same queue,
            or a generator or async generator function, whose call runs
            none of its body (:func:`~alkstore.logic.callbacks.handler_kind`).
            A coroutine function (``async def``) is an async task: a worker
            awaits it on its event loop (docs/tasks-and-workers.md). With
            ``takes_context``, a function without a positional first
            parameter; a ``takes_context`` that is not a bool; a
            ``unique_key`` that is none of those, or a bad key.
        """
        v.queue_name(queue)
        rule = check_unique_rule(unique_key)
        opts = self._check_queue_opts(queue_opts) if queue_opts else None
        if not isinstance(takes_context, bool):
            raise ValidationError(
                f"takes_context must be a bool, not {type(takes_context).__name__}"
            )

        def register(function: Callable[..., R]) -> Task[P, R]:
            if not callable(function):
                raise ValidationError(f"a task must be callable, not {type(function).__name__}")
            handler_kind(function, "a task")
            task_name = default_task_name(function) if name is None else name
            if not isinstance(task_name, str) or not task_name:
                raise ValidationError("a task name must be a non-empty str")
            # Made first: its checks (the context's parameter) change nothing.
            created: Task[P, R] = Task(
                self, function, task_name, queue, takes_context=takes_context, unique_key=rule
            )
            with self._lock:
                if task_name in self._tasks:
                    raise ValidationError(f"a task named {task_name!r} is already registered")
                if queue in self._relays:
                    raise ValidationError(
                        f"queue {queue!r} is an outbox with a relay; tasks need their own queue"
                    )
                known = self._queue_opts.get(queue)
                if opts is not None and known is not None and known != opts:
                    raise ValidationError(
                        f"queue {queue!r} already has options {known}; "
                        f"a task on it asked for {opts}"
                    )
                if opts is not None or queue not in self._queue_opts:
                    self._queue_opts[queue] = opts if opts is not None else known
                    self._queues.pop(queue, None)
                    self._aqueues.pop(queue, None)
                self._tasks[task_name] = created
                return created

        if __func is not None:
            return register(__func)
        return register

    # -- outboxes (docs/outbox.md) -------------------------------------------

    @property
    def relays(self) -> Mapping[str, Send]:
        """The registered relays' send functions by outbox queue name (a copy)."""
        with self._lock:
            return dict(self._relays)

    def outbox(self, queue: str) -> Outbox:
        """The :class:`Outbox` on the queue ``queue``, with the options its
        relay gave (opens the store).

        Raises
        ------
        ValidationError
            For a name outside docs/contract.md §3's rule.
        """
        return Outbox(self.queue(queue))

    def relay(
        self, queue: str, *, takes_context: bool = False, **queue_opts: Any
    ) -> Callable[[Send], Send]:
        """Register ``send`` as the relay of the outbox ``queue``: workers
        of this app run it on a thread of their own (``Worker(relays=True)``).

        Use as a decorator::

            @app.relay("outbox.orders", max_attempts=10)
            def publish(message): broker.publish("orders", message)

        Parameters
        ----------
        queue
            The outbox's queue; it may hold no tasks.
        takes_context
            Call ``send(context, message)``, ``context`` being the message's
            :class:`~alkstore.JobContext` (``context.job.id`` is a key the
            receiver can deduplicate by; docs/outbox.md "Deduplicating").
        **queue_opts
            :class:`QueueOpts` fields for the outbox queue (visibility
            timeout, ``max_attempts``, backoff).

        Returns
        -------
        Callable
            A decorator that registers and returns ``send`` unchanged.

        Raises
        ------
        ValidationError
            For a bad queue name or option, a queue that already has a relay
            or tasks, or a ``send`` that is not callable or is a generator or
            async generator function, or a ``takes_context`` that is not a
            bool. A coroutine function (``async def``) is awaited on the
            worker's event loop (docs/outbox.md).
        """
        v.queue_name(queue)
        opts = self._check_queue_opts(queue_opts)
        if not isinstance(takes_context, bool):
            raise ValidationError(
                f"takes_context must be a bool, not {type(takes_context).__name__}"
            )

        def register(send: Send) -> Send:
            if not callable(send):
                raise ValidationError(f"a relay must be callable, not {type(send).__name__}")
            handler_kind(send, "a relay's send")
            with self._lock:
                if queue in self._relays:
                    raise ValidationError(f"queue {queue!r} already has a relay")
                if queue in self._queue_opts:
                    raise ValidationError(
                        f"queue {queue!r} holds tasks; an outbox needs its own queue"
                    )
                self._relays[queue] = send
                self._relay_opts[queue] = opts
                if takes_context:
                    self._relay_contexts.add(queue)
                self._queues.pop(queue, None)
                self._aqueues.pop(queue, None)
            return send

        return register

    def _relay_takes_context(self, queue: str) -> bool:
        """Whether the relay of the outbox ``queue`` takes a :class:`JobContext`."""
        with self._lock:
            return queue in self._relay_contexts

    @staticmethod
    def _check_queue_opts(queue_opts: Mapping[str, Any]) -> QueueOpts:
        try:
            return QueueOpts(**queue_opts)
        except TypeError:
            fields = sorted(QueueOpts.__dataclass_fields__)
            unknown = sorted(set(queue_opts) - set(fields))
            raise ValidationError(
                f"unknown queue option(s) {', '.join(unknown)}; accepted: {', '.join(fields)}"
            ) from None

    # -- observers (docs/operations.md "Metrics and telemetry") ----------------

    @property
    def observers(self) -> tuple[Observer, ...]:
        """The observers added with :meth:`add_observer`, in order."""
        observing = self._observing
        return () if observing is None else observing.all

    def add_observer(self, observer: Observer) -> None:
        """Have ``observer`` see this app's task enqueues and the jobs its
        workers run from now on (a worker already running included, from
        its next job). :func:`alkstore.contrib.opentelemetry.instrument` and
        :func:`alkstore.contrib.prometheus.instrument` call this.

        Raises
        ------
        ValidationError
            If ``observer`` is not an :class:`~alkstore.runtime.observe.Observer`,
            or was already added.
        """
        if not isinstance(observer, Observer):
            raise ValidationError(
                "an observer must be an alkstore.runtime.observe.Observer, "
                f"not {type(observer).__name__}"
            )
        with self._lock:
            if observer in self.observers:
                raise ValidationError(f"observer {observer!r} was already added to this app")
            self._observing = Observers([*self.observers, observer])

    def remove_observer(self, observer: Observer) -> bool:
        """Stop ``observer`` seeing this app (jobs already started still
        report to it); return whether it had been added."""
        with self._lock:
            kept = [o for o in self.observers if o is not observer]
            if len(kept) == len(self.observers):
                return False
            self._observing = Observers(kept) if kept else None
            return True

    # -- workers -------------------------------------------------------------

    def worker(
        self, queues: Iterable[str] | None = None, concurrency: int = 1, **options: Any
    ) -> Worker:
        """Make a :class:`Worker` that runs this app's tasks.

        Parameters
        ----------
        queues
            Queue names to work, in priority order; ``None`` for every queue
            of the registered tasks.
        concurrency
            How many jobs run at once, ``>= 1``: sync tasks on threads,
            async tasks as coroutines on the worker's event loop.
        **options
            :class:`Worker`'s keyword options (``poll_interval_s``,
            ``grace_period_s`` ...).

        Raises
        ------
        ValidationError
            For a bad queue name or option, or no queue to work.
        """
        from alkstore.runtime.worker import Worker

        return Worker(self, queues, concurrency, **options)
