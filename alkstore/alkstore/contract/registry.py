"""Engine discovery by URL scheme (docs/contract.md §1).

Lookup order, after SQLAlchemy's plugin loader: engines registered in this
process with :func:`register`, then the ``alkstore.engines`` entry points.
Engines are imported only when a URL asks for them, so importing
``alkstore`` imports no database driver. Two distributions claiming one
scheme is an error, as in ibis.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Coroutine, Generator
from importlib.metadata import entry_points
from types import TracebackType
from typing import Any

from alkstore._off_loop import on_thread
from alkstore.contract.store import Store
from alkstore.contract.store_async import AsyncStore
from alkstore.errors import UnknownEngineError, ValidationError
from alkstore.logic.redact import redact_url

__all__ = [
    "DEFAULT_URL",
    "ENTRY_POINT_GROUP",
    "AsyncOpen",
    "EngineFactory",
    "has_native_async",
    "open",
    "open_async",
    "register",
]

#: The store opened when neither the ``url`` argument nor ``ALKSTORE_URL`` is set.
DEFAULT_URL = "sqlite:///alkstore.db"
ENTRY_POINT_GROUP = "alkstore.engines"
URL_ENV = "ALKSTORE_URL"

#: An engine's entry: called as ``factory(url, **engine_options)``. A
#: factory with native async primitives also has an ``open_async``
#: attribute, an ``async def`` called the same way that returns an
#: :class:`AsyncStore`; :func:`open_async` then uses it instead of the
#: thread adapter (docs/async.md).
EngineFactory = Callable[..., Store]

# The first-party engines, for the install hint when one is missing (fsspec's
# known-implementations table).
_FIRST_PARTY = {
    "sqlite": "alkstore-sqlite",
    "postgresql": "alkstore-postgres",
    "postgres": "alkstore-postgres",
}

_registered: dict[str, EngineFactory] = {}
_lock = threading.Lock()


def register(scheme: str, factory: EngineFactory) -> None:
    """Register an engine for ``scheme`` in this process; it wins over entry
    points. Registering again replaces the earlier factory.

    Parameters
    ----------
    scheme
        A URL scheme, such as ``"sqlite"`` (compared lower-case).
    factory
        Called as ``factory(url, **engine_options)``; returns a :class:`Store`.
    """
    with _lock:
        _registered[scheme.lower()] = factory


def _entry_point_schemes() -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name.lower(), []).append(ep)
    return found


def _factory(scheme: str) -> EngineFactory:
    with _lock:
        factory = _registered.get(scheme)
    if factory is not None:
        return factory
    points = _entry_point_schemes()
    candidates = {ep.value: ep for ep in points.get(scheme, [])}
    if len(candidates) > 1:
        raise UnknownEngineError(
            f"several installed engines claim the scheme {scheme!r}: "
            f"{', '.join(sorted(candidates))}; uninstall all but one"
        )
    if candidates:
        point = next(iter(candidates.values()))
        try:
            loaded: EngineFactory = point.load()
        except ImportError as error:
            # The engine is installed but its driver is missing or broken
            # (psycopg without libpq, say): the driver's words, then ours.
            raise UnknownEngineError(
                f"the alkstore engine for the scheme {scheme!r} ({point.value}) is installed"
                f" but cannot be imported: {error}. {_install_hint(scheme, again=True)}"
            ) from error
        return loaded
    installed = sorted(set(points) | set(_registered))
    message = f"no alkstore engine for the scheme {scheme!r}; installed schemes: " + (
        ", ".join(installed) or "none"
    )
    if scheme in _FIRST_PARTY:
        message += ". " + _install_hint(scheme)
    raise UnknownEngineError(message)


def _install_hint(scheme: str, *, again: bool = False) -> str:
    verb = "Reinstall it with its driver" if again else "Install it with"
    if scheme not in _FIRST_PARTY:
        return "Reinstall the distribution that provides it, with its dependencies."
    distribution = _FIRST_PARTY[scheme]
    # psycopg needs libpq; its [binary] extra ships one (psycopg's install docs).
    extra = "[binary]" if distribution == "alkstore-postgres" else ""
    return f"{verb}: pip install '{distribution}{extra}'"


def open(url: str | None = None, **engine_options: Any) -> Store:
    """Open a store, choosing the engine by the URL's scheme (docs/contract.md §1).

    Parameters
    ----------
    url
        ``sqlite:///relative.db``, ``sqlite:////absolute.db``,
        ``postgresql://...``; default ``$ALKSTORE_URL``, else
        ``sqlite:///alkstore.db``.
    **engine_options
        Every engine takes ``clock=`` (a callable returning an aware
        ``datetime``), ``rng=`` (an object with ``randint``) and
        ``migrate=`` (default ``True``); engines document their own.

    Returns
    -------
    Store
        Open, migrated unless ``migrate=False``; a context manager.

    Raises
    ------
    UnknownEngineError
        No installed engine serves the scheme (the message names the
        installed ones and, for a first-party engine, the install command).
    ValidationError
        A malformed URL (no scheme, a NUL, a lone surrogate) or an unknown
        or bad engine option.
    SchemaVersionError
        The schema is newer than the code, or missing with ``migrate=False``.
    """
    url, factory = _engine_for(url)
    return factory(url, **engine_options)


def has_native_async(url: str | None = None) -> bool:
    """Whether the engine of ``url`` (``None``: the default URL) has native
    async primitives: its factory carries an ``open_async`` attribute, which
    :func:`open_async` then uses instead of the thread adapter
    (docs/async.md). Blocking: it reads the installed entry points and
    imports the engine; call it off an event loop.

    Raises
    ------
    ValidationError, UnknownEngineError
        As :func:`open` for the URL and its scheme.
    """
    _, factory = _engine_for(url)
    return getattr(factory, "open_async", None) is not None


def _engine_for(url: object) -> tuple[str, EngineFactory]:
    """Check ``url`` (``None``: the default) and find its engine's factory."""
    url = _checked_url(url)
    return url, _factory(url.partition("://")[0].lower())


def _checked_url(url: object) -> str:
    """``url`` checked (``None``: the default): a str with a scheme that a
    driver can take."""
    if url is None:
        url = os.environ.get(URL_ENV) or DEFAULT_URL
    if not isinstance(url, str):
        raise ValidationError(f"url must be a str, not {type(url).__name__}")
    # Drivers take URLs as C strings, in UTF-8: neither a NUL nor a lone
    # surrogate can reach one intact.
    if "\x00" in url:
        raise ValidationError(f"url {redact_url(url)!r} has a NUL character")
    try:
        url.encode()
    except UnicodeEncodeError as error:
        raise ValidationError(
            f"url {redact_url(url)!r} is not valid text: {error.reason}"
        ) from None
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise ValidationError(
            f"url {redact_url(url)!r} has no scheme; expected e.g. {DEFAULT_URL!r}"
        )
    return url


def open_async(url: str | None = None, **engine_options: Any) -> AsyncOpen:
    """Open an async store, choosing the engine by the URL's scheme exactly
    as :func:`open` does (docs/async.md).

    The URL is checked now; the engine is found and the store opened when
    the result is awaited or entered, off the event loop (finding an engine
    reads the installed distributions' metadata and imports its driver)::

        store = await alkstore.open_async(url)        # then: await store.close()
        async with alkstore.open_async(url) as store:  # closed on leaving
            ...

    An engine whose factory has an ``open_async`` attribute opens its own
    native :class:`AsyncStore`. Any other engine's sync store is opened on a
    thread and wrapped by
    :class:`alkstore.contract.threaded.ThreadedAsyncStore`, whose
    operations run on a pool of threads it owns, never on the event loop.

    Parameters
    ----------
    url, **engine_options
        As :func:`open`.

    Returns
    -------
    AsyncOpen
        Awaitable (once) to an open :class:`AsyncStore`, or an async
        context manager that closes it on exit.

    Raises
    ------
    ValidationError
        At the call, as :func:`open` for a malformed URL.
    UnknownEngineError, ValidationError, SchemaVersionError, EngineError
        On await, as :func:`open` for the scheme, the engine options and
        the opening.
    """
    return AsyncOpen(_open_async(_checked_url(url), engine_options))


async def _open_async(url: str, engine_options: dict[str, Any]) -> AsyncStore:
    # Off the loop, as the engine's own import: a module's first import
    # reads (and perhaps compiles) its file.
    open_threaded = await on_thread(_threaded_opener, "alkstore-open-async")
    return await open_threaded(_engine_for, url, engine_options)


def _threaded_opener() -> Callable[..., Coroutine[Any, Any, AsyncStore]]:
    from alkstore.contract.threaded import open_threaded

    return open_threaded


async def ahas_native_async(url: str | None = None) -> bool:
    """:func:`has_native_async`, awaited: the entry points are read and the
    engine imported off the event loop.

    Raises
    ------
    ValidationError, UnknownEngineError
        As :func:`has_native_async`.
    """
    return await on_thread(lambda: has_native_async(url), "alkstore-find-engine")


async def open_async_over(store_of: Callable[[], Store]) -> AsyncStore:
    """An :class:`AsyncStore` over the sync store ``store_of()`` returns
    (an app's, docs/async.md "Tasks and workers"): a
    :class:`~alkstore.contract.threaded.ThreadedAsyncStore` that does not
    own it, so closing it leaves that store open. As :func:`open_async`,
    everything is done off the event loop, on one thread: the thread
    adapter's first import, ``store_of()`` (which may open the store:
    connect, migrate) and the start of the adapter's threads.

    Raises
    ------
    Exception
        Whatever ``store_of()`` raises.
    """
    return await on_thread(lambda: _threaded_over(store_of), "alkstore-open-async")


def _threaded_over(store_of: Callable[[], Store]) -> AsyncStore:
    from alkstore.contract.threaded import threaded_over

    return threaded_over(store_of(), owns_store=False)


class AsyncOpen(Coroutine[Any, Any, AsyncStore]):
    """What :func:`open_async` returns: await it for the store, or use it
    as ``async with`` (the store is closed on exit), as asyncpg's
    ``create_pool``. Either, once. It is a coroutine, so
    ``asyncio.create_task(alkstore.open_async(url))`` works too."""

    __slots__ = ("_opening", "_store")

    def __init__(self, opening: Coroutine[Any, Any, AsyncStore]) -> None:
        self._opening = opening
        self._store: AsyncStore | None = None

    def __await__(self) -> Generator[Any, None, AsyncStore]:
        return self._opening.__await__()

    def send(self, value: Any) -> Any:
        return self._opening.send(value)

    def throw(self, *args: Any) -> Any:
        return self._opening.throw(*args)

    def close(self) -> None:
        self._opening.close()

    async def __aenter__(self) -> AsyncStore:
        self._store = await self._opening
        return self._store

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._store is not None:
            await self._store.close()
