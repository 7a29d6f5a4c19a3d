"""The :class:`Task`: a registered function and the payload that names it
(docs/tasks-and-workers.md "Tasks").

A task's job payload is the JSON object ``{"task": NAME, "args": [...],
"kwargs": {...}}``; the payload codec (docs/contract.md §3 "Payload") encodes it, so
arguments that are not strict JSON raise ``ValidationError`` at enqueue.
When the app has observers (:meth:`App.add_observer`), it may also hold
``"trace"``: the context carried from the enqueue to the job
(:data:`~alkstore.runtime.observe.TRACE_KEY`).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, ParamSpec, TypeVar

from alkstore.errors import ValidationError
from alkstore.logic import validation as v
from alkstore.logic.callbacks import handler_kind
from alkstore.logic.resolution import enqueue_options

if TYPE_CHECKING:
    from alkstore.runtime.app import App

__all__ = [
    "Task",
    "TaskCall",
    "UniqueRule",
    "check_unique_rule",
    "default_task_name",
    "parse_task_payload",
    "task_payload",
]

P = ParamSpec("P")
R = TypeVar("R")

#: The keywords of :meth:`Task.options` (and of :meth:`Queue.enqueue`).
ENQUEUE_OPTIONS = ("delay", "run_at", "priority", "max_attempts", "expires", "unique_key")

#: The context of an enqueue no observer sees (reusable: it holds nothing).
_UNOBSERVED = nullcontext()

#: A task's rule for its jobs' unique keys (:meth:`App.task`'s ``unique_key``):
#: ``True`` (one live job per distinct call), a key (one live job of the
#: task), or a function of the call's arguments returning a key or ``None``.
UniqueRule = bool | str | Callable[..., str | None] | None


def check_unique_rule(rule: object) -> UniqueRule:
    """Check :meth:`App.task`'s ``unique_key``: ``None`` or ``False`` (no
    key), ``True``, a key (``str``, docs/contract.md §3 "Unique keys") or a
    callable.

    Raises
    ------
    ValidationError
        Otherwise.
    """
    if rule is None or rule is False:
        return None
    if rule is True or callable(rule):
        return rule
    if isinstance(rule, str):
        return v.unique_key(rule)
    raise ValidationError(
        "a task's unique_key must be True, a key (str) or a function of the task's "
        f"arguments returning one, not {type(rule).__name__}"
    )


def task_payload(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON payload of one call of the task ``name``.

    Tuples among ``args`` at the top level become a list; nested values are
    left to the payload codec, which refuses anything but strict JSON.
    """
    return {"task": name, "args": list(args), "kwargs": dict(kwargs)}


class TaskCall(NamedTuple):
    """A task payload, parsed: the task's name and its arguments."""

    name: str
    args: list[Any]
    kwargs: dict[str, Any]


def parse_task_payload(payload: object) -> TaskCall:
    """Read a job payload written by :func:`task_payload`.

    ``"args"`` and ``"kwargs"`` may be missing (no arguments), so a payload
    enqueued by hand as ``{"task": "send_report"}`` runs too. Other keys
    are ignored, among them ``"trace"`` (the context an observer carries,
    :data:`~alkstore.runtime.observe.TRACE_KEY`; read by
    :func:`~alkstore.runtime.observe.payload_trace`).

    Raises
    ------
    ValueError
        Naming what is wrong, for any other payload.
    """
    expected = 'expected a JSON object {"task": name, "args": [...], "kwargs": {...}}'
    if not isinstance(payload, dict):
        raise ValueError(f"not a task payload ({type(payload).__name__}); {expected}")
    name = payload.get("task")
    args = payload.get("args", [])
    kwargs = payload.get("kwargs", {})
    if not isinstance(name, str) or not name:
        raise ValueError(f'not a task payload: "task" is missing or not a str; {expected}')
    if not isinstance(args, list):
        raise ValueError(f'task payload for {name!r}: "args" must be a list')
    if not isinstance(kwargs, dict):
        raise ValueError(f'task payload for {name!r}: "kwargs" must be an object')
    return TaskCall(name, args, kwargs)


def _script_module_name(path: str) -> str:
    """The dotted name ``python -m`` would import the script at ``path`` as:
    its stem, preceded by each enclosing folder that holds an
    ``__init__.py`` (a regular package), outermost first.

    ``proj/jobs.py`` with ``proj/__init__.py`` is ``proj.jobs``; a script
    outside any package is its stem; ``proj/__init__.py`` itself is
    ``proj``. Namespace packages (folders without ``__init__.py``) cannot be
    told from plain folders, so they end the walk.
    """
    folder, filename = os.path.split(os.path.abspath(path))
    stem = os.path.splitext(filename)[0]
    parts = [] if stem == "__init__" else [stem]
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        folder, package = os.path.split(folder)
        if not package.isidentifier():
            break
        parts.insert(0, package)
    return ".".join(parts) or stem


def default_task_name(func: Callable[..., Any]) -> str:
    """``module.qualname`` of ``func``, as Celery names tasks.

    A function defined in a script run as ``python path/to/jobs.py`` lives in
    ``__main__``; it is named after the module the script would be imported
    as, so that the script and an ``alkstore worker MODULE:app`` that imports
    it agree on the name: the ``-m`` module name (``python -m proj.jobs``),
    else the script's stem preceded by its enclosing packages (the folders
    holding an ``__init__.py``): ``python proj/jobs.py`` gives
    ``proj.jobs.func`` when ``proj/__init__.py`` exists, ``jobs.func``
    otherwise.
    """
    module = getattr(func, "__module__", None) or "__main__"
    if module == "__main__":
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        spec_name = getattr(spec, "name", None)
        path = getattr(main, "__file__", None)
        if isinstance(spec_name, str) and spec_name and spec_name != "__main__":
            module = spec_name
        elif isinstance(path, str) and path:
            module = _script_module_name(path)
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    return f"{module}.{qualname}"


def _less_context(signature: inspect.Signature, name: str, func: object) -> inspect.Signature:
    """The signature enqueueing checks a ``takes_context`` task's arguments
    against: the function's less its first parameter, which takes the
    context (a ``*args`` first takes it and the rest alike).

    Raises
    ------
    ValidationError
        If the function has no positional first parameter.
    """
    parameters = list(signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if parameters and parameters[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return signature
    if not parameters or parameters[0].kind not in positional:
        raise ValidationError(
            f"task {name!r} has takes_context=True, so a worker passes the job context as "
            f"its first positional argument, but its function {signature} has no positional "
            "first parameter to take it (add one: def task(context, ...))"
        )
    return signature.replace(parameters=parameters[1:])


class Task(Generic[P, R]):
    """A function registered with :meth:`App.task` (docs/tasks-and-workers.md).

    Calling the task runs the function in this process, as a plain call.
    :meth:`enqueue` stores a job that a :class:`Worker` runs later;
    :meth:`options` returns a copy that enqueues with per-job options.
    Async code enqueues with ``await`` :meth:`aenqueue`,
    :meth:`aenqueue_many` and :meth:`aenqueue_tx` (Django's ``a`` prefix
    for the async twins of a shared object's methods), through
    :meth:`App.aqueue`: the same checks, errors and results.

    Attributes
    ----------
    app
        The :class:`App` the task is registered with.
    name
        The name stored in its payloads; workers find the function by it.
    queue
        The name of the queue its jobs go to.
    func
        The function itself.
    is_async
        Whether ``func`` is a coroutine function (``async def``, a
        ``functools.partial`` of one, an object whose ``__call__`` is one):
        a worker awaits its jobs on its event loop instead of calling them
        on a thread (docs/tasks-and-workers.md "Async tasks").
    takes_context
        Whether a worker passes the job's :class:`~alkstore.JobContext` to
        ``func`` as its first positional argument, before the enqueued
        ones (docs/tasks-and-workers.md "Job context"). Enqueueing then
        takes the arguments without it, checked against the function's
        signature less its first parameter.
    unique_key
        The rule giving each job a unique key (docs/tasks-and-workers.md
        "Unique jobs"): ``None``; ``True``, one live job per distinct call
        (the key is the SHA-256 of the task's name and its arguments bound
        to the signature, defaults applied, as canonical JSON); a ``str``,
        one live job of the task at a time; or a function called with the
        enqueue arguments, returning the key or ``None``.

    Raises
    ------
    ValidationError
        For a generator or async generator function
        (:func:`~alkstore.logic.callbacks.handler_kind`); with
        ``takes_context``, for a function that has no positional first
        parameter to take the context.
    """

    def __init__(
        self,
        app: App,
        func: Callable[P, R],
        name: str,
        queue: str,
        enqueue_opts: Mapping[str, object] | None = None,
        *,
        takes_context: bool = False,
        unique_key: object = None,
    ) -> None:
        if not isinstance(takes_context, bool):
            raise ValidationError(
                f"takes_context must be a bool, not {type(takes_context).__name__}"
            )
        self.app = app
        self.func = func
        self.name = name
        self.queue = queue
        self.is_async = handler_kind(func, "a task") == "async"
        self.takes_context = takes_context
        self.unique_key: UniqueRule = check_unique_rule(unique_key)
        self._enqueue_opts: dict[str, object] = dict(enqueue_opts or {})
        try:
            self._signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):  # some builtins have none: calls go unchecked
            self._signature = None
        if takes_context and self._signature is not None:
            self._signature = _less_context(self._signature, name, func)
        functools.update_wrapper(self, func)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self._enqueue_opts.items())
        return f"<Task {self.name!r} on queue {self.queue!r}{extra}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function now, in this process (no job is stored); for an
        async task, this returns the coroutine to await. A plain call: for a
        ``takes_context`` task, pass a context first yourself (typed by the
        enqueue arguments, a type checker wants ``task.func(context, ...)``)."""
        return self.func(*args, **kwargs)

    @property
    def enqueue_options(self) -> Mapping[str, object]:
        """The per-job options set with :meth:`options` (empty by default)."""
        return dict(self._enqueue_opts)

    def options(
        self,
        *,
        delay: object = None,
        run_at: object = None,
        priority: object = None,
        max_attempts: object = None,
        expires: object = None,
        unique_key: object = None,
    ) -> Task[P, R]:
        """Return a copy whose :meth:`enqueue` and :meth:`enqueue_tx` use
        these per-job options (Celery's ``apply_async`` options, RQ's
        ``enqueue_in``). Options left ``None`` keep this task's.

        Parameters
        ----------
        delay
            Seconds or ``timedelta`` from the enqueue instant until the job
            is due; wins over ``run_at`` (docs/contract.md §3 "Option resolution").
        run_at
            A timezone-aware ``datetime`` at which the job is due.
        priority
            ``int``, higher is claimed first; overrides the queue's.
        max_attempts
            How many claims the job may consume; overrides the queue's.
        expires
            Seconds or ``timedelta`` after the enqueue instant at which the
            job expires unrun.
        unique_key
            A ``str`` of 1 to 255 characters: while a live job of the queue
            holds it, enqueueing stores nothing and returns that job's id
            (docs/contract.md §3 "Unique keys"). Wins over the task's rule.

        Returns
        -------
        Task
            A new task object with the same name, queue and function.

        Raises
        ------
        ValidationError
            For an option outside its rule (checked now, before any I/O).
        """
        given = {
            "delay": delay,
            "run_at": run_at,
            "priority": priority,
            "max_attempts": max_attempts,
            "expires": expires,
        }
        if unique_key is not None:
            given["unique_key"] = v.unique_key(unique_key)
        merged = {**self._enqueue_opts, **{k: v for k, v in given.items() if v is not None}}
        enqueue_options(**{k: v for k, v in merged.items() if k != "unique_key"})
        return Task(
            self.app,
            self.func,
            self.name,
            self.queue,
            merged,
            takes_context=self.takes_context,
            unique_key=self.unique_key,
        )

    def check_call(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Check that ``func(*args, **kwargs)`` matches the function's
        signature, as a call would, without calling it.

        Enqueueing checks this first, so a mistyped keyword fails in the
        enqueueing process instead of in every attempt on a worker.

        Raises
        ------
        ValidationError
            Naming the task and what is wrong (an unexpected or missing
            argument, too many positional arguments); for an unexpected
            keyword that is a per-job option (or close to one), saying that
            those go through :meth:`options`.
        """
        if self._signature is None:
            return
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            message = f"task {self.name!r} cannot be called with these arguments: {exc}"
            accepted = set(self._signature.parameters)
            for keyword in kwargs:
                if keyword in accepted:
                    continue
                close = difflib.get_close_matches(keyword, ENQUEUE_OPTIONS, n=1)
                if close:
                    message += (
                        f"; {keyword!r} is not an argument of the task (per-job options such "
                        f"as {close[0]!r} go through task.options({close[0]}=...).enqueue(...))"
                    )
                    break
            raise ValidationError(message) from None

    def payload(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """The job payload of this call, as :meth:`enqueue` would store it.

        Raises
        ------
        ValidationError
            If the arguments do not fit the function's signature
            (:meth:`check_call`).
        """
        self.check_call(args, kwargs)
        return task_payload(self.name, args, kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Store a job that runs ``func(*args, **kwargs)`` on a worker.

        Returns
        -------
        int
            The job's id.

        Raises
        ------
        ValidationError
            If the arguments do not fit the function's signature (a
            mistyped keyword, a missing argument: :meth:`check_call`) or an
            argument is not strict JSON (docs/contract.md §3 "Payload"); nothing is
            stored.
        StoreClosedError, EngineError
            As :meth:`Queue.enqueue`.
        """
        payload = self.payload(*args, **kwargs)
        options = self._options_for(args, kwargs)
        queue = self.app.queue(self.queue)
        with self._observed([payload]):
            return queue.enqueue(payload, **options)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """:meth:`enqueue` for async code, through the app's async store
        (:meth:`App.aqueue`): the same checks, errors and result.

        Raises
        ------
        ValidationError, StoreClosedError, EngineError
            As :meth:`enqueue`; the arguments are checked before the async
            store is opened.
        """
        payload = self.payload(*args, **kwargs)
        options = self._options_for(args, kwargs)
        queue = await self.app.aqueue(self.queue)
        with self._observed([payload]):
            return await queue.enqueue(payload, **options)

    def enqueue_tx(self, conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """Store the job inside the caller's open transaction on ``conn``
        (docs/contract.md §3 "Transactional enqueue"): it exists, and wakes workers,
        only if the caller commits.

        Parameters
        ----------
        conn
            The application's own driver connection with a transaction open
            (``sqlite3.Connection`` on the same file, ``psycopg.Connection``).

        Returns
        -------
        int
            The job's id.

        Raises
        ------
        ValidationError
            For arguments that do not fit the function's signature
            (:meth:`check_call`; per-job options go through :meth:`options`,
            never here) or are not strict JSON, or a ``conn`` outside a
            transaction; the caller's transaction is left as it was.
        """
        payload = self.payload(*args, **kwargs)
        options = self._options_for(args, kwargs)
        queue = self.app.queue(self.queue)
        with self._observed([payload]):
            return queue.enqueue_tx(conn, payload, **options)

    async def aenqueue_tx(self, conn: Any, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """:meth:`enqueue_tx` for async code (:meth:`AsyncQueue.enqueue_tx`):
        the same checks, errors and result.

        Parameters
        ----------
        conn
            The connection :meth:`AsyncQueue.enqueue_tx` takes, with a
            transaction open: an engine with native async primitives takes
            its async driver's connection; through the thread adapter, the
            sync engine's own (``sqlite3.Connection`` opened with
            ``check_same_thread=False``, ``psycopg.Connection``;
            docs/async.md).
        """
        payload = self.payload(*args, **kwargs)
        options = self._options_for(args, kwargs)
        queue = await self.app.aqueue(self.queue)
        with self._observed([payload]):
            return await queue.enqueue_tx(conn, payload, **options)

    def enqueue_many(self, calls: Iterable[Sequence[Any]]) -> list[int]:
        """Store one job per item of ``calls``, each item the positional
        arguments of one call, in one transaction: all or nothing
        (:meth:`Queue.enqueue_many`).

        Returns
        -------
        list[int]
            The ids, in the order of ``calls``.

        Raises
        ------
        ValidationError
            If ``calls`` is not an iterable (a ``str``, ``bytes`` or ``dict``
            is refused too), an item is not a list or tuple, does not fit the function's
            signature, or holds an argument that is not strict JSON; the
            message names the item (``calls[3]: ...``, ``payloads[3]: ...``
            for a refused argument); nothing is stored.
        """
        payloads, options = self._many(calls)
        queue = self.app.queue(self.queue)
        with self._observed(payloads):
            return queue.enqueue_many(payloads, **options)

    async def aenqueue_many(self, calls: Iterable[Sequence[Any]]) -> list[int]:
        """:meth:`enqueue_many` for async code: the same checks, errors and
        result, all or nothing.

        Raises
        ------
        ValidationError, StoreClosedError, EngineError
            As :meth:`enqueue_many`.
        """
        payloads, options = self._many(calls)
        queue = await self.app.aqueue(self.queue)
        with self._observed(payloads):
            return await queue.enqueue_many(payloads, **options)

    def unique_key_of(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """The unique key a job of this call gets (docs/tasks-and-workers.md
        "Unique jobs"): the per-job ``options(unique_key=)``, else the
        task's rule's; ``None`` for none. What ``alkstore enqueue --app``
        uses for a task payload.

        Raises
        ------
        ValidationError
            When the rule's function raises, or returns neither ``None`` nor
            a key.
        """
        given = self._enqueue_opts.get("unique_key")
        if given is not None:
            return given  # type: ignore[return-value]
        rule = self.unique_key
        if rule is None or isinstance(rule, str):
            return rule
        if rule is True:
            return self._call_digest(args, kwargs)
        assert callable(rule)
        try:
            key = rule(*args, **kwargs)
        except Exception as exc:
            raise ValidationError(
                f"the unique_key function of task {self.name!r} raised "
                f"{type(exc).__name__}: {exc} (it is called with the task's arguments)"
            ) from exc
        return v.unique_key(key, f"the key the unique_key function of task {self.name!r} returned")

    def _call_digest(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """SHA-256 (hex) of the task's name and the call's arguments bound to
        the signature with defaults applied, as canonical JSON: ``f(1)`` and
        ``f(a=1)`` are one call."""
        arguments: object = {"args": list(args), "kwargs": dict(kwargs)}
        if self._signature is not None:
            bound = self._signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
        try:
            text = json.dumps(
                {"task": self.name, "arguments": arguments},
                sort_keys=True,
                separators=(",", ":"),
                ensure_ascii=False,
                allow_nan=False,
            )
        except (TypeError, ValueError):
            # Not JSON: the payload codec refuses the call with its own
            # message; this key is never stored.
            return "unencodable"
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def _observed(self, payloads: list[dict[str, Any]]) -> AbstractContextManager[object]:
        """Around an enqueue of ``payloads``: the app's observers see it,
        and may carry a context in each payload (``"trace"``);
        nothing when it has none."""
        observing = self.app._observing
        if observing is None:
            return _UNOBSERVED
        return observing.enqueuing(self.queue, self.name, payloads)

    def _options_for(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, object]:
        """The enqueue options of one call: the per-job ones and its key."""
        key = self.unique_key_of(args, kwargs)
        return {**self._enqueue_opts, "unique_key": key}

    def _many(self, calls: Iterable[Sequence[Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """:meth:`enqueue_many`'s payloads and its options, with one key
        per call (``unique_keys``)."""
        payloads = self._payloads(calls)
        options: dict[str, Any] = {
            k: value for k, value in self._enqueue_opts.items() if k != "unique_key"
        }
        keys = [self.unique_key_of(p["args"], {}) for p in payloads]
        if any(key is not None for key in keys):
            options["unique_keys"] = keys
        return payloads, options

    def _payloads(self, calls: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
        """The payloads of :meth:`enqueue_many`'s ``calls``, each checked."""
        if not v.is_collection(calls):
            raise ValidationError(
                f"calls must be an iterable of argument lists, not {type(calls).__name__}"
            )
        payloads = []
        for index, call in enumerate(calls):
            if not isinstance(call, (list, tuple)):
                raise ValidationError(
                    f"calls[{index}]: each call must be a list or tuple of positional "
                    f"arguments, not {type(call).__name__}"
                )
            try:
                self.check_call(call, {})
            except ValidationError as error:
                raise ValidationError(f"calls[{index}]: {error}") from None
            payloads.append(task_payload(self.name, call, {}))
        return payloads
