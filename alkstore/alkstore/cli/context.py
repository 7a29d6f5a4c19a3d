"""What every command shares to reach its store: the group's :class:`Context`
(``--url``, ``--debug``), loading ``--app MODULE:APP``, opening the queues
a command names, the warning for a queue nothing knows, and turning
alkstore's errors into one line on stderr and exit status 1.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NoReturn

import click

import alkstore
from alkstore.contract.queue import Queue
from alkstore.contract.store import Store
from alkstore.errors import AlkstoreError
from alkstore.logic import validation as v
from alkstore.logic.codec import MAX_NESTING
from alkstore.runtime.app import App

log = logging.getLogger("alkstore.cli")


def fail(message: str) -> NoReturn:
    raise click.ClickException(message)


def parse_json(payload: str) -> Any:
    """The JSON argument of ``enqueue`` and ``schedule``, or a one-line error."""
    try:
        return json.loads(payload)
    except ValueError as exc:
        fail(f"the payload is not valid JSON: {exc}")
    except RecursionError:
        # json's decoder recurses once per level: thousands of levels exhaust
        # the stack before the codec could refuse them.
        fail(f"the payload nests deeper than {MAX_NESTING} levels")


@contextlib.contextmanager
def report_errors(debug: bool = False) -> Iterator[None]:
    """Turn alkstore's errors into one line on stderr and exit status 1
    (after the traceback, with ``--debug``)."""
    try:
        yield
    except AlkstoreError as exc:
        if debug:
            traceback.print_exc()
        fail(f"{one_line(exc)} ({type(exc).__name__})")


def one_line(exc: BaseException) -> str:
    """``exc``'s message with its whitespace (newlines included) collapsed."""
    return " ".join(str(exc).split()) or type(exc).__name__


def load_app(spec: str, *, debug: bool = False) -> App:
    """Import the :class:`App` named by ``MODULE:ATTR`` (``MODULE`` alone
    means ``MODULE:app``), after putting the current directory first on
    ``sys.path`` as Celery and uvicorn do.

    Parameters
    ----------
    spec
        ``MODULE:ATTR``; ``ATTR`` may be dotted.
    debug
        Print the traceback of a failed import on stderr before the error.

    Raises
    ------
    click.ClickException
        One line naming ``spec`` and the error, whatever made loading fail:
        the module cannot be found, or raised while it was imported (a
        ``SyntaxError``, a ``ValidationError`` from a bad ``@app.task``...),
        the attribute is missing, or it is not an App. The traceback is also
        logged at DEBUG on ``alkstore.cli``.
    """
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if not module_name:
        fail(f"{spec!r} names no module; expected MODULE:APP, e.g. myproject.jobs:app")
    where = f"cannot load the app {module_name}:{attr}"
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())

    def failed(what: str, exc: BaseException) -> NoReturn:
        log.debug("%s", where, exc_info=exc)
        if debug:
            traceback.print_exception(exc)
        fail(f"{where}: {what} {type(exc).__name__}: {one_line(exc)}")

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and f"{module_name}.".startswith(f"{exc.name}."):
            # The module itself (or a parent package) is missing, not
            # something the module imports.
            log.debug("%s", where, exc_info=exc)
            fail(
                f"{where}: cannot import {module_name!r}: {one_line(exc)} (run the command "
                "from the folder that holds it, or put that folder on PYTHONPATH)"
            )
        failed(f"importing {module_name!r} raised", exc)
    except Exception as exc:
        failed(f"importing {module_name!r} raised", exc)
    found: object = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            fail(f"{where}: module {module_name!r} has no attribute {attr!r}")
        except Exception as exc:
            failed(f"reading {attr!r} raised", exc)
    if not isinstance(found, App):
        fail(f"{where}: it is of type {type(found).__name__}, not an alkstore.App")
    return found


class Context:
    """What the group passes to its commands."""

    def __init__(self, url: str | None, url_from_command_line: bool, debug: bool) -> None:
        self.url = url
        self.url_from_command_line = url_from_command_line
        self.debug = debug
        #: The ``--app`` loaded by :meth:`store` or :func:`queues_of`, and its spec.
        self.loaded_app: tuple[App, str] | None = None

    def errors(self) -> contextlib.AbstractContextManager[None]:
        """:func:`report_errors` with this command's ``--debug``."""
        return report_errors(self.debug)

    def app(self, spec: str, *, migrate: bool | None = None) -> App:
        """Load an app; a ``--url`` on the command line overrides its URL.

        ``migrate=False`` makes the app open its store without migrating
        (the read-only commands); ``None`` keeps the app's own choice. An app
        whose store is already open (its module used it at import, or it
        wraps a store it was given) cannot change either: a ``--url`` is
        then an error, while ``migrate=False`` is moot.
        """
        app = load_app(spec, debug=self.debug)
        if self.url_from_command_line:
            try:
                app.configure(self.url)
            except RuntimeError as exc:
                fail(f"--url cannot apply to {spec}: {exc}")
        if migrate is not None:
            with contextlib.suppress(RuntimeError):
                app.configure(migrate=migrate)
        return app

    def warn_unknown_queues(self, store: Store, names: Iterable[str]) -> None:
        """:func:`warn_unknown_queues` with the app this command loaded."""
        app, spec = self.loaded_app or (None, None)
        warn_unknown_queues(store, names, app, spec)

    def open(self, *, migrate: bool = True) -> Store:
        return alkstore.open(self.url, migrate=migrate)

    @contextlib.contextmanager
    def store(self, app_spec: str | None, *, migrate: bool) -> Iterator[Store]:
        """The store of ``--app`` (its URL and engine options, ``schema=``
        say), else of ``--url``; ``migrate=False`` never creates a schema."""
        if app_spec:
            with self.app(app_spec, migrate=None if migrate else False) as app:
                self.loaded_app = (app, app_spec)
                yield app.store
        else:
            with self.open(migrate=migrate) as store:
                yield store


def queues_of(
    ctx: Context, names: Sequence[str], app_spec: str | None, *, migrate: bool
) -> tuple[contextlib.ExitStack, list[Queue]]:
    """Open the store and the queues named by ``--queue`` and ``--app``.

    ``migrate=False`` opens the store without migrating, with or without an
    app: the read-only commands never create or upgrade a schema.
    """
    stack = contextlib.ExitStack()
    if app_spec:
        app = stack.enter_context(ctx.app(app_spec, migrate=None if migrate else False))
        ctx.loaded_app = (app, app_spec)
        all_names = list(dict.fromkeys([*names, *app.queue_names, *app.relays]))
        if not all_names:
            stack.close()
            fail(f"{app_spec} has no tasks, so names no queue; add --queue NAME")
        with _closing_on_error(stack):
            handles = [app.queue(name) for name in all_names]
            ctx.warn_unknown_queues(app.store, names)
            return stack, handles
    store = stack.enter_context(ctx.open(migrate=migrate))
    with _closing_on_error(stack):
        ctx.warn_unknown_queues(store, names)
        if not names:
            names = store.queue_names()  # none at all in a new store
        return stack, [store.queue(name) for name in dict.fromkeys(names)]


def warn_unknown_queues(
    store: Store, names: Iterable[str], app: App | None, app_spec: str | None
) -> None:
    """Warn on stderr about each of ``names`` that no task or relay of
    ``app`` declares and that holds no live or dead job and is not paused
    (one index-driven :meth:`Store.queue_names`): most likely a typo, which
    would otherwise act on an empty queue in silence. The command goes on."""
    declared = set() if app is None else {*app.queue_names, *app.relays}
    unknown = [name for name in dict.fromkeys(names) if name not in declared]
    if not unknown:
        return
    known = set(store.queue_names())
    for name in unknown:
        if name in known:
            continue
        if app is None:
            why = "holds no jobs and is not paused"
            hint = " (with --app MODULE:APP, the queues of the app's tasks count as known)"
        else:
            why = f"holds no jobs, is not paused, and no task or relay of {app_spec} declares it"
            hint = ""
        click.echo(f"Warning: queue {name!r} {why}: check its name{hint}", err=True)


@contextlib.contextmanager
def _closing_on_error(stack: contextlib.ExitStack) -> Iterator[None]:
    try:
        yield
    except BaseException:
        stack.close()
        raise


def configure_logging(level: str) -> None:
    """Log to stderr at ``level``, unless logging is configured already (by
    an app's module, imported first)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )


def check_queue_name(ctx: Context, name: str) -> None:
    """Refuse a bad queue name before the store opens (docs/contract.md §3: arguments
    are checked before any I/O)."""
    check_queue_names(ctx, (name,))


def check_queue_names(ctx: Context, names: Sequence[str]) -> None:
    """:func:`check_queue_name` for each of ``names``."""
    with ctx.errors():
        for name in names:
            v.queue_name(name)
