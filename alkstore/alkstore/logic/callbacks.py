"""The rule for the functions users hand to alkstore: task handlers, relay
``send`` functions, clocks. They run when called.

A coroutine function (``async def``), an async generator function or a
generator function does not run its body when called: it returns an object
that would run it later. Taking that return as "done" would ack a job whose
code never ran. So such functions are refused where they are registered, and
a call that returns an awaitable, a generator or an async generator anyway
(a ``functools.partial`` or a lambda around an ``async def``) is an error,
never a success. asyncio support runs async callables instead (issue 12);
until then they are refused.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from alkstore.errors import ValidationError

__all__ = ["NotRunError", "check_runs_when_called", "check_ran"]


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
    """Refuse a function whose call would not run its body.

    Parameters
    ----------
    func
        The function being registered.
    what
        What it is for the message: ``"a task"``, ``"a relay's send"``.

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
            f"calling it returns a {kind} and runs none of its body, and alkstore runs "
            "callables synchronously; make it a plain def (run the async code inside "
            "with asyncio.run)"
        )
    raise ValidationError(f"{what} must be a plain function: {_name(func)} is {_an(kind)}; {why}")


def _an(kind: str) -> str:
    return f"an {kind} function" if kind[0] in "aeiou" else f"a {kind} function"


def check_ran(result: object, func: object, what: str) -> None:
    """Refuse the result of a call that did not run its body.

    An awaitable or a (sync or async) generator result is closed, where it
    can be, so no "never awaited" warning follows, and refused.

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
    raise NotRunError(
        f"{what} {_name(func)} returned a {kind} instead of running: its body did not run, "
        "so this is not counted as done (alkstore runs callables synchronously)"
    )
