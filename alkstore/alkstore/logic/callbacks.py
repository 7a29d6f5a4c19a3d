"""The rule for the functions users hand to alkstore: task handlers, relay
``send`` functions, clocks. Nothing is counted as done unless its code ran
and returned (regression case 012).

A coroutine function (``async def``), an async generator function or a
generator function does not run its body when called: it returns an object
that would run it later. Taking that return as "done" would ack a job whose
code never ran. So:

- where alkstore calls a function synchronously (a clock, ``rng.randint``),
  such functions are refused where they are given
  (:func:`check_runs_when_called`);
- where alkstore can await (a task, an outbox relay's ``send``), the kind is
  decided once, where the function is given (:func:`handler_kind`): a
  coroutine function, a ``functools.partial`` of one, or an object whose
  ``__call__`` is one is *async*, and alkstore awaits the awaitable its call
  returns (:func:`call_async`); anything else callable is *sync*, and its
  call's result must not be an awaitable or a generator (:func:`check_ran`:
  a plain function that hands back a coroutine ran none of it). Generator
  and async generator functions are refused either way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from alkstore.errors import ValidationError

__all__ = [
    "HandlerKind",
    "NotRunError",
    "call_async",
    "call_sync",
    "check_ran",
    "check_runs_when_called",
    "handler_kind",
]

#: How alkstore calls a handler: ``"sync"`` on a thread, ``"async"`` awaited
#: on an event loop.
HandlerKind = Literal["sync", "async"]


class NotRunError(TypeError):
    """A callable returned an object that would run its body later (a
    coroutine, a generator, an async generator) instead of running it."""


def _deferred_kind(func: object) -> str | None:
    """What ``func`` returns instead of running its body, if it is such a
    function: ``"coroutine"``, ``"async generator"`` or ``"generator"``."""
    for candidate in (func, getattr(func, "__call__", None)):  # noqa: B004
        if candidate is None:
            continue
        if inspect.iscoroutinefunction(candidate):
            return "coroutine"
        if inspect.isasyncgenfunction(candidate):
            return "async generator"
        if inspect.isgeneratorfunction(candidate):
            return "generator"
    return None


def _name(func: object) -> str:
    while isinstance(func, functools.partial):
        func = func.func
    return str(getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or func)


def check_runs_when_called(func: Callable[..., Any], what: str) -> None:
    """Refuse a function whose call would not run its body, where alkstore
    calls it synchronously (a clock, ``rng.randint``).

    Parameters
    ----------
    func
        The function being given.
    what
        What it is for the message: ``"the clock"``, ``"rng.randint"``.

    Raises
    ------
    ValidationError
        For a coroutine function (``async def``), an async generator
        function or a generator function (or an object whose ``__call__``
        is one), naming it.
    """
    kind = _deferred_kind(func)
    if kind is None:
        return
    if kind == "generator":
        why = "calling it returns a generator and runs none of its body; use return, not yield"
    else:
        why = (
            f"calling it returns a {kind} and runs none of its body, and alkstore calls "
            f"{what} synchronously; make it a plain def"
        )
    raise ValidationError(f"{what} must be a plain function: {_name(func)} is {_an(kind)}; {why}")


def handler_kind(func: Callable[..., Any], what: str) -> HandlerKind:
    """How alkstore calls ``func``, a task or a relay's ``send``: ``"async"``
    for a coroutine function (``async def``), a ``functools.partial`` of one
    or an object whose ``__call__`` is one; ``"sync"`` for any other
    callable.

    Parameters
    ----------
    func
        The callable being registered (checked to be callable by the caller).
    what
        What it is for the message: ``"a task"``, ``"send"``.

    Raises
    ------
    ValidationError
        For a generator function or an async generator function (or an
        object whose ``__call__`` is one): its call runs none of its body,
        and no job is done by a stream of values.
    """
    kind = _deferred_kind(func)
    if kind is None:
        return "sync"
    if kind == "coroutine":
        return "async"
    fix = "a def that returns" if kind == "generator" else "an async def that returns"
    raise ValidationError(
        f"{what} must be a plain function or a coroutine function (async def): "
        f"{_name(func)} is {_an(kind)}; calling it returns {_an_object(kind)} and runs "
        f"none of its body; make it {fix} (return, not yield)"
    )


def _an(kind: str) -> str:
    return f"an {kind} function" if kind[0] in "aeiou" else f"a {kind} function"


def _an_object(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def check_ran(result: object, func: object, what: str, *, awaited: bool = False) -> None:
    """Refuse the result of a call that did not run its body.

    An awaitable or a (sync or async) generator result is closed, where it
    can be, so no "never awaited" warning follows, and refused. A sync
    handler's result is never awaited: a plain function that returns a
    coroutine ran none of it.

    Parameters
    ----------
    awaited
        ``result`` is what awaiting an async handler's call gave: the
        message then says to await inside it, not to make it async.

    Raises
    ------
    NotRunError
        If ``result`` is awaitable or a generator of either kind, naming
        ``func`` and what it is (``what``).
    """
    if result is None or not (
        inspect.isawaitable(result) or inspect.isgenerator(result) or inspect.isasyncgen(result)
    ):
        return
    if inspect.iscoroutine(result) or inspect.isgenerator(result):
        result.close()
    # An unstarted async generator holds nothing (its aclose() is a coroutine).
    kind = type(result).__name__
    if awaited:
        raise NotRunError(
            f"{what} {_name(func)} returned a {kind} from its coroutine: what that {kind} "
            "does did not run, so this is not counted as done (alkstore awaits the "
            f"coroutine once; await the {kind} inside it)"
        )
    raise NotRunError(
        f"{what} {_name(func)} returned a {kind} instead of running: its body did not run, "
        "so this is not counted as done (alkstore awaits only what a coroutine function "
        "returns: declare it async def)"
    )


def call_sync(
    func: Callable[..., Any], what: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> object:
    """Call a sync handler (:func:`handler_kind` ``"sync"``); return its
    result, refused if it is an awaitable or a generator.

    Raises
    ------
    NotRunError
        If the call returned an awaitable or a generator: its body did not
        run (:func:`check_ran`).
    BaseException
        Whatever the handler raises.
    """
    result = func(*args, **kwargs)
    check_ran(result, func, what)
    return result


async def call_async(
    func: Callable[..., Any], what: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> object:
    """Call an async handler (:func:`handler_kind` ``"async"``) and await
    what its call returns; return the awaited value.

    The call's awaitable is awaited once; a value that is still an
    awaitable or a generator is refused, as a sync handler's would be.

    Raises
    ------
    NotRunError
        If the awaited value is itself an awaitable or a generator.
    BaseException
        Whatever the handler raises.
    """
    result = func(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    check_ran(result, func, what, awaited=True)
    return result
