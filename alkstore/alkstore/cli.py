"""The ``alkstore`` command (docs/command.md), built with click.

Importing :mod:`alkstore` does not import this module (nor click): only the
console script and ``python -m alkstore`` do.

Every command takes the store from ``--url``, else ``$ALKSTORE_URL``, else
the embedded ``sqlite:///alkstore.db`` (docs/contract.md §1). The commands that read
queues read those named by ``--queue`` options and by ``--app MODULE:APP``
(``$ALKSTORE_APP``), whose tasks name their queues; with neither, every
queue of the store. Errors print one line on stderr and exit with status 1.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, NoReturn, TypeVar

import click

import alkstore
from alkstore.contract.job import Job, QueueStats
from alkstore.contract.options import QueueOpts
from alkstore.contract.queue import Queue
from alkstore.contract.schedule import CATCH_UP_POLICIES, Schedule
from alkstore.contract.store import Store
from alkstore.errors import AlkstoreError, SchemaVersionError, ValidationError
from alkstore.logic import validation as v
from alkstore.logic.codec import MAX_NESTING, encode_payload
from alkstore.logic.cron import parse_schedule
from alkstore.logic.redact import redact_url
from alkstore.logic.resolution import enqueue_options, resolve
from alkstore.runtime.app import App
from alkstore.runtime.scheduler import Scheduler
from alkstore.runtime.signals import stop_signals
from alkstore.runtime.task import parse_task_payload
from alkstore.runtime.worker import (
    DEFAULT_GRACE_PERIOD_S,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_SWEEP_INTERVAL_S,
    DEFAULT_TICK_INTERVAL_S,
)

__all__ = ["cli", "load_app", "main"]

#: The environment variable naming the app of ``--app``.
APP_ENV = "ALKSTORE_APP"
#: What ``stats`` and ``job`` say when no queue holds a job or is paused.
NO_JOBS = "no jobs in any queue"
#: The counts of ``stats``: QueueStats' fields, with the lapsed claims
#: (part of processing) after processing.
STATS_COLUMNS = ("pending", "scheduled", "processing", "lapsed", "dead")

log = logging.getLogger("alkstore.cli")


def _seconds(*, positive: bool = False) -> Any:
    """A duration option's check: seconds by docs/contract.md §2's rule (finite, >= 0 or
    > 0, at most 100 years), so every bad duration is a usage error (exit
    status 2), as click's own range checks are. Used as the option's
    ``callback`` beside ``type=float``."""

    def check(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
        if value is None:
            return None
        try:
            return v.duration_s(value, "the value", positive=positive)
        except ValidationError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    return check


_SECONDS = _seconds()
_POSITIVE_SECONDS = _seconds(positive=True)


#: The per-job expiry of ``enqueue`` and ``schedule``.
_EXPIRES = click.option(
    "--expires",
    type=float,
    callback=_POSITIVE_SECONDS,
    metavar="SECONDS",
    help="Expire unrun after this long.",
)

_Command = TypeVar("_Command", bound=Callable[..., Any])


def _seconds_option(
    flag: str, default: float, help: str, *, positive: bool = False
) -> Callable[[_Command], _Command]:
    """A duration option with a default, in seconds, checked as above."""
    return click.option(
        flag,
        type=float,
        callback=_POSITIVE_SECONDS if positive else _SECONDS,
        default=default,
        show_default=True,
        metavar="SECONDS",
        help=help,
    )


# The ranges docs/contract.md §2 gives the per-job options, and job ids (64-bit).
_PRIORITY = click.IntRange(v.INT32_MIN, v.INT32_MAX)
_MAX_ATTEMPTS = click.IntRange(1, v.INT32_MAX)
_JOB_ID = click.IntRange(0, 2**63 - 1)


def _fail(message: str) -> NoReturn:
    raise click.ClickException(message)


def _parse_json(payload: str) -> Any:
    """The JSON argument of ``enqueue`` and ``schedule``, or a one-line error."""
    try:
        return json.loads(payload)
    except ValueError as exc:
        _fail(f"the payload is not valid JSON: {exc}")
    except RecursionError:
        # json's decoder recurses once per level: thousands of levels exhaust
        # the stack before the codec could refuse them.
        _fail(f"the payload nests deeper than {MAX_NESTING} levels")


@contextlib.contextmanager
def _errors(debug: bool = False) -> Iterator[None]:
    """Turn alkstore's errors into one line on stderr and exit status 1
    (after the traceback, with ``--debug``)."""
    try:
        yield
    except AlkstoreError as exc:
        if debug:
            traceback.print_exc()
        _fail(f"{_one_line(exc)} ({type(exc).__name__})")


def _one_line(exc: BaseException) -> str:
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
        _fail(f"{spec!r} names no module; expected MODULE:APP, e.g. myproject.jobs:app")
    where = f"cannot load the app {module_name}:{attr}"
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())

    def failed(what: str, exc: BaseException) -> NoReturn:
        log.debug("%s", where, exc_info=exc)
        if debug:
            traceback.print_exception(exc)
        _fail(f"{where}: {what} {type(exc).__name__}: {_one_line(exc)}")

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and f"{module_name}.".startswith(f"{exc.name}."):
            # The module itself (or a parent package) is missing, not
            # something the module imports.
            log.debug("%s", where, exc_info=exc)
            _fail(
                f"{where}: cannot import {module_name!r}: {_one_line(exc)} (run the command "
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
            _fail(f"{where}: module {module_name!r} has no attribute {attr!r}")
        except Exception as exc:
            failed(f"reading {attr!r} raised", exc)
    if not isinstance(found, App):
        _fail(f"{where}: it is of type {type(found).__name__}, not an alkstore.App")
    return found


class _Context:
    """What the group passes to its commands."""

    def __init__(self, url: str | None, url_from_command_line: bool, debug: bool) -> None:
        self.url = url
        self.url_from_command_line = url_from_command_line
        self.debug = debug
        #: The ``--app`` loaded by :meth:`store` or :func:`_queues_of`, and its spec.
        self.loaded_app: tuple[App, str] | None = None

    def errors(self) -> contextlib.AbstractContextManager[None]:
        """:func:`_errors` with this command's ``--debug``."""
        return _errors(self.debug)

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
                _fail(f"--url cannot apply to {spec}: {exc}")
        if migrate is not None:
            with contextlib.suppress(RuntimeError):
                app.configure(migrate=migrate)
        return app

    def warn_unknown_queues(self, store: Store, names: Iterable[str]) -> None:
        """:func:`_warn_unknown_queues` with the app this command loaded."""
        app, spec = self.loaded_app or (None, None)
        _warn_unknown_queues(store, names, app, spec)

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


def _queues_of(
    ctx: _Context, names: Sequence[str], app_spec: str | None, *, migrate: bool
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
            _fail(f"{app_spec} has no tasks, so names no queue; add --queue NAME")
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


def _warn_unknown_queues(
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


#: The ``--app`` option of the commands that only need the app's store.
_APP_STORE = click.option(
    "--app",
    "app_spec",
    envvar=APP_ENV,
    metavar="MODULE:APP",
    help="Use this app's store (its URL and engine options, e.g. schema=).",
)

#: The ``--log-level`` option of the long-running commands.
_LOG_LEVEL = click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)


def _configure_logging(level: str) -> None:
    """Log to stderr at ``level``, unless logging is configured already (by
    an app's module, imported first)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )


_URL_HELP = (
    "The store: sqlite:///path.db or postgresql://... "
    "[default: $ALKSTORE_URL, else sqlite:///alkstore.db]"
)
_DEBUG_HELP = "On an error, print its traceback before the one-line message."


def _late_url(click_ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    if value is not None:
        obj = click_ctx.find_object(_Context)
        assert obj is not None
        obj.url, obj.url_from_command_line = value, True


def _late_debug(click_ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value:
        obj = click_ctx.find_object(_Context)
        assert obj is not None
        obj.debug = True


class _Group(click.Group):
    """A group whose commands take the group's ``--url`` and ``--debug``
    after their own name too: ``alkstore stats --url ...`` works as
    ``alkstore --url ... stats`` does (git and docker users type both)."""

    group_class = type  # subgroups are _Group too

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not isinstance(cmd, click.Group):
            cmd.params += [
                click.Option(
                    ["--url"], metavar="URL", expose_value=False, callback=_late_url, help=_URL_HELP
                ),
                click.Option(
                    ["--debug"],
                    is_flag=True,
                    expose_value=False,
                    callback=_late_debug,
                    help=_DEBUG_HELP,
                ),
            ]
        super().add_command(cmd, name)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", envvar="ALKSTORE_URL", metavar="URL", help=_URL_HELP)
@click.option("--debug", is_flag=True, help=_DEBUG_HELP)
@click.version_option(alkstore.__version__, prog_name="alkstore")
@click.pass_context
def cli(click_ctx: click.Context, url: str | None, debug: bool) -> None:
    """Run and inspect alkstore jobs."""
    source = click_ctx.get_parameter_source("url")
    click_ctx.obj = _Context(url, source is click.core.ParameterSource.COMMANDLINE, debug)


@cli.command()
@click.argument("app_spec", metavar="MODULE:APP")
@click.option(
    "-q",
    "--queue",
    "queues",
    multiple=True,
    metavar="QUEUE",
    help="A queue to work, repeatable, in priority order [default: every queue of the app]",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=1,
    show_default=True,
    help="Jobs run at once (threads).",
)
@click.option("--burst", is_flag=True, help="Exit once no job is ready (RQ's burst mode).")
@_seconds_option(
    "--poll-interval",
    DEFAULT_POLL_INTERVAL_S,
    "Re-poll this often when no wake arrives.",
    positive=True,
)
@_seconds_option(
    "--grace-period",
    DEFAULT_GRACE_PERIOD_S,
    "On SIGTERM/SIGINT, running jobs get this long to finish.",
)
@_seconds_option(
    "--sweep-interval",
    DEFAULT_SWEEP_INTERVAL_S,
    "Sweep expired jobs and old dead letters this often; 0: never.",
)
@_seconds_option(
    "--tick-interval",
    DEFAULT_TICK_INTERVAL_S,
    "Fire due schedules this often; 0: never (run `alkstore scheduler` instead).",
)
@click.option(
    "--worker-id", metavar="ID", help="Recorded on claimed jobs [default: host:pid:random]"
)
@_LOG_LEVEL
@click.pass_obj
def worker(
    ctx: _Context,
    *,
    app_spec: str,
    queues: tuple[str, ...],
    concurrency: int,
    burst: bool,
    poll_interval: float,
    grace_period: float,
    sweep_interval: float,
    tick_interval: float,
    worker_id: str | None,
    log_level: str,
) -> None:
    """Run the tasks of the App MODULE:APP until SIGTERM/SIGINT.

    MODULE is imported with the current directory on sys.path; APP defaults
    to "app". The first SIGTERM or SIGINT stops claiming and lets running
    jobs finish within the grace period; a second one exits at once, leaving
    them to be reclaimed.
    """
    app = ctx.app(app_spec)
    # After the import, so that logging configured by the app's module wins.
    _configure_logging(log_level)
    with ctx.errors(), app:
        runner = app.worker(
            list(queues) or None,
            concurrency,
            poll_interval_s=poll_interval,
            grace_period_s=grace_period,
            sweep_interval_s=sweep_interval or None,
            tick_interval_s=tick_interval or None,
            worker_id=worker_id,
        )
        _warn_unknown_queues(app.store, queues, app, app_spec)
        logging.getLogger("alkstore.worker").info(
            "worker %s on %s", runner.worker_id, redact_url(app.url)
        )
        runner.run(burst=burst)


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("payload", metavar="JSON")
@click.option("--delay", type=float, callback=_SECONDS, metavar="SECONDS", help="Due this later.")
@click.option("--priority", type=_PRIORITY, help="Higher is claimed first [default: the queue's].")
@click.option("--max-attempts", type=_MAX_ATTEMPTS, help="Claims the job may consume.")
@_EXPIRES
@click.option(
    "--app",
    "app_spec",
    envvar=APP_ENV,
    metavar="MODULE:APP",
    help="Stamp the queue options this app gives QUEUE, and check a task payload "
    "against the app's tasks [default: QueueOpts(), unchecked]",
)
@click.pass_obj
def enqueue(
    ctx: _Context,
    *,
    queue_name: str,
    payload: str,
    delay: float | None,
    priority: int | None,
    max_attempts: int | None,
    expires: float | None,
    app_spec: str | None,
) -> None:
    """Add a job whose payload is JSON to QUEUE; print its id.

    A worker runs it when the payload names a task:
    '{"task": "jobs.send", "args": [1], "kwargs": {}}'. Without --app the job
    gets the default queue options (QueueOpts()), not those the task's app
    declares (max_attempts, backoff...): pass --app MODULE:APP for those.
    """
    value = _parse_json(payload)
    options: dict[str, Any] = {
        "delay": delay,
        "priority": priority,
        "max_attempts": max_attempts,
        "expires": expires,
    }
    with ctx.errors():
        # Everything enqueue would refuse, before the store opens (and so
        # before a mistyped queue name creates a database file).
        v.queue_name(queue_name)
        if app_spec:
            app = ctx.app(app_spec)
            elsewhere = _check_task(app, app_spec, queue_name, value)
            _check_enqueue(value, options, app.queue_opts(queue_name))
            with app:
                if not elsewhere:  # that warning names the queue already
                    _warn_unknown_queues(app.store, [queue_name], app, app_spec)
                job_id = app.queue(queue_name).enqueue(value, **options)
        else:
            _check_enqueue(value, options, QueueOpts())
            with ctx.open() as store:
                _warn_unknown_queues(store, [queue_name], None, None)
                job_id = store.queue(queue_name).enqueue(value, **options)
    click.echo(job_id)


def _check_enqueue(value: object, options: dict[str, Any], opts: QueueOpts) -> None:
    """Apply the core's enqueue checks without a store: the payload codec
    and the options, resolved against the queue's ``opts`` (an expiry at or
    before the job is due is refused). Resolution compares instants taken
    from one clock reading, so this host's clock gives the store's answer."""
    encode_payload(value)
    resolve(datetime.now(UTC), opts, enqueue_options(**options))


def _check_task(app: App, app_spec: str, queue_name: str, payload: object) -> bool:
    """With ``--app``: refuse a task payload naming a task the app does not
    have (its worker would dead-letter the job as unknown), or arguments
    that do not fit the task's function; warn when the task is declared on
    another queue (the app's workers claim from it only if given ``-q``),
    and then return ``True``."""
    if not isinstance(payload, dict) or "task" not in payload:
        return False  # not meant as a task payload: a queue of the app's, used by hand
    try:
        call = parse_task_payload(payload)
    except ValueError as exc:
        _fail(str(exc))
    task = app.tasks.get(call.name)
    if task is None:
        known = ", ".join(sorted(app.tasks)) or "none"
        _fail(f"{app_spec} has no task {call.name!r} (its tasks: {known})")
    task.check_call(call.args, call.kwargs)
    if task.queue != queue_name:
        click.echo(
            f"Warning: task {call.name!r} is declared on queue {task.queue!r}, not "
            f"{queue_name!r}: `alkstore worker {app_spec}` claims from {queue_name!r} "
            f"only when started with -q {queue_name}",
            err=True,
        )
        return True
    return False


class _QueueRow(NamedTuple):
    """One queue's line of ``stats``."""

    name: str
    stats: QueueStats
    lapsed: int
    paused: bool


def _stats_rows(queues: Sequence[Queue]) -> list[_QueueRow]:
    """Each queue's counts, lapsed claims and pause flag (three reads)."""
    return [_QueueRow(q.name, q.stats(), q.lapsed_claims(), q.is_paused()) for q in queues]


def _stats_table(rows: Sequence[_QueueRow]) -> str:
    """Names left, counts right, then ``yes``/``no`` under ``paused``."""
    cells: list[tuple[str, ...]] = [("queue", *STATS_COLUMNS, "paused")]
    for row in rows:
        pending, scheduled, processing, dead = row.stats
        counts = (pending, scheduled, processing, row.lapsed, dead)
        cells.append((row.name, *map(str, counts), "yes" if row.paused else "no"))
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    lines = []
    for line in cells:
        first = line[0].ljust(widths[0])
        numbers = (cell.rjust(width) for cell, width in zip(line[1:-1], widths[1:-1], strict=True))
        lines.append("  ".join((first, *numbers, line[-1])))
    return "\n".join(lines)


@cli.command()
@click.option("-q", "--queue", "queues", multiple=True, metavar="QUEUE", help="Repeatable.")
@click.option("--app", "app_spec", envvar=APP_ENV, metavar="MODULE:APP", help="Its queues.")
@click.option("--watch", is_flag=True, help="Redraw every --interval until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
)
@click.pass_obj
def stats(
    ctx: _Context, *, queues: tuple[str, ...], app_spec: str | None, watch: bool, interval: float
) -> None:
    """Show each queue's job counts and whether it is paused.

    pending: due now; scheduled: due later (delayed or backing off);
    processing: claimed by a worker; lapsed: of those, the claims past their
    deadline (a worker died or stalled; the next claim takes them back);
    dead: dead letters.
    """
    _check_queue_names(ctx, queues)
    with ctx.errors():
        stack, handles = _queues_of(ctx, queues, app_spec, migrate=False)
        with stack:
            if not handles:
                # A store whose queues were all drained lists none either.
                click.echo(NO_JOBS)
                return
            if not watch:
                click.echo(_stats_table(_stats_rows(handles)))
                return
            try:
                while True:
                    table = _stats_table(_stats_rows(handles))
                    click.clear()
                    now = datetime.now().astimezone()
                    click.echo(f"{now:%Y-%m-%d %H:%M:%S %Z}  (Ctrl-C to stop)\n{table}")
                    time.sleep(interval)
            except KeyboardInterrupt:
                return


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    return value


def _job_fields(job: Job) -> dict[str, Any]:
    # The decoded payload stands where its bytes are in the dataclass.
    names = ["payload" if f.name == "payload_bytes" else f.name for f in dataclasses.fields(job)]
    fields = {name: getattr(job, name) for name in names}
    return {name: _jsonable(value) for name, value in fields.items()}


@cli.command()
@click.argument("job_id", metavar="ID", type=_JOB_ID)
@click.option("-q", "--queue", "queues", multiple=True, metavar="QUEUE", help="Where to look.")
@click.option("--app", "app_spec", envvar=APP_ENV, metavar="MODULE:APP", help="Its queues.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
def job(
    ctx: _Context, *, job_id: int, queues: tuple[str, ...], app_spec: str | None, as_json: bool
) -> None:
    """Show the job ID (live or dead) of the given queues.

    Job ids are unique within a store, but every read is scoped to a queue,
    so the job is looked up in each queue named by --queue and --app, in
    order; with neither, in every queue of the store.
    """
    _check_queue_names(ctx, queues)
    with ctx.errors():
        stack, handles = _queues_of(ctx, queues, app_spec, migrate=False)
        with stack:
            found = next((j for q in handles if (j := q.get_job(job_id)) is not None), None)
    if found is None:
        names = ", ".join(q.name for q in handles)
        _fail(f"no job {job_id} in queue(s) {names}" if names else f"no job {job_id}: {NO_JOBS}")
    fields = _job_fields(found)
    if as_json:
        click.echo(json.dumps(fields, ensure_ascii=False, indent=2))
        return
    width = max(map(len, fields))
    for name, value in fields.items():
        if name == "payload" and found.content_type != "application/json":
            text = f"<{len(found.payload_bytes)} bytes>"
        elif name != "payload" and value is None:
            text = "-"
        elif name != "payload" and isinstance(value, str):
            text = value
        else:
            text = json.dumps(value, ensure_ascii=False)
        first, *rest = str(text).split("\n") or [""]
        click.echo(f"{name.ljust(width)}  {first}")
        for line in rest:
            click.echo(f"{' ' * width}  {line}")


# -- operations (docs/operations.md) -------------------------------------------


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@_APP_STORE
@click.pass_obj
def pause(ctx: _Context, *, queue_name: str, app_spec: str | None) -> None:
    """Stop workers everywhere from claiming QUEUE's jobs (enqueues still land)."""
    _check_queue_name(ctx, queue_name)
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        ctx.warn_unknown_queues(store, [queue_name])
        changed = store.queue(queue_name).pause()
    click.echo(
        f"queue {queue_name} paused" if changed else f"queue {queue_name} was already paused"
    )


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@_APP_STORE
@click.pass_obj
def resume(ctx: _Context, *, queue_name: str, app_spec: str | None) -> None:
    """Let workers claim QUEUE's jobs again."""
    _check_queue_name(ctx, queue_name)
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        ctx.warn_unknown_queues(store, [queue_name])
        changed = store.queue(queue_name).resume()
    click.echo(f"queue {queue_name} resumed" if changed else f"queue {queue_name} was not paused")


def _check_queue_name(ctx: _Context, name: str) -> None:
    """Refuse a bad queue name before the store opens (docs/contract.md §3: arguments
    are checked before any I/O)."""
    _check_queue_names(ctx, (name,))


def _check_queue_names(ctx: _Context, names: Sequence[str]) -> None:
    """:func:`_check_queue_name` for each of ``names``."""
    with ctx.errors():
        for name in names:
            v.queue_name(name)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = [list(header), *map(list, rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


#: The most characters of ``last_error`` that ``dead list`` shows.
LAST_ERROR_WIDTH = 80
#: Ends a table cell whose text was cut short (as ``docker ps`` does).
ELLIPSIS = "\u2026"


def _first_line(text: str | None, width: int) -> str:
    """The first line of ``text``, at most ``width`` characters, ending in
    :data:`ELLIPSIS` when anything was left out (the rest of the line, or
    further lines: a traceback); ``-`` for none."""
    if not text:
        return "-"
    lines = text.splitlines()  # \r and the other line breaks too: one row each
    first = lines[0] if lines else ""
    more = bool(text[len(first) :].strip())
    if len(first) > width:
        return first[: width - 1] + ELLIPSIS
    return first + ELLIPSIS if more else first


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


@cli.group()
def dead() -> None:
    """List, requeue and purge a queue's dead letters."""


@dead.command("list")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--after", "after_id", type=_JOB_ID, metavar="ID", help="Page on.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@_APP_STORE
@click.pass_obj
def dead_list(
    ctx: _Context,
    *,
    queue_name: str,
    limit: int,
    after_id: int | None,
    as_json: bool,
    app_spec: str | None,
) -> None:
    """Show QUEUE's dead jobs in id order, --limit at a time (--after the
    last id shown for the next page)."""
    _check_queue_name(ctx, queue_name)
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        ctx.warn_unknown_queues(store, [queue_name])
        jobs = store.queue(queue_name).dead_jobs(limit, after_id)
    if as_json:
        for found in jobs:
            click.echo(json.dumps(_job_fields(found), ensure_ascii=False))
        return
    if not jobs:
        click.echo(f"no dead jobs in queue {queue_name}")
        return
    rows = [
        (
            str(found.id),
            _when(found.died_at),
            f"{found.attempts}/{found.max_attempts}",
            _first_line(found.last_error, LAST_ERROR_WIDTH),
        )
        for found in jobs
    ]
    click.echo(_table(("id", "died_at", "attempts", "last_error"), rows))
    if len(jobs) == limit:
        click.echo(f"(more may follow: --after {jobs[-1].id})")


@dead.command("requeue")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("job_ids", metavar="[ID]...", nargs=-1, type=_JOB_ID)
@click.option("--all", "every", is_flag=True, help="Requeue every dead job of QUEUE.")
@click.option("--delay", type=float, callback=_SECONDS, metavar="SECONDS", help="Due this later.")
@_APP_STORE
@click.pass_obj
def dead_requeue(
    ctx: _Context,
    *,
    queue_name: str,
    job_ids: tuple[int, ...],
    every: bool,
    delay: float | None,
    app_spec: str | None,
) -> None:
    """Move dead jobs of QUEUE back to pending, each with a renewed attempt
    budget (its attempts so far are kept)."""
    _check_queue_name(ctx, queue_name)
    if bool(job_ids) == every:
        _fail("give the dead job ids to requeue, or --all (not both)")
    requeued = missing = 0
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        ctx.warn_unknown_queues(store, [queue_name])
        queue = store.queue(queue_name)
        for job_id in job_ids or _every_dead_id(queue):
            if queue.requeue(job_id, delay=delay):
                requeued += 1
            else:
                missing += 1
                click.echo(f"job {job_id} is not a dead job of queue {queue_name}", err=True)
    click.echo(f"{requeued} job(s) requeued")
    if missing:
        sys.exit(1)


def _every_dead_id(queue: Queue) -> Iterator[int]:
    after: int | None = None
    while page := queue.dead_jobs(1000, after):
        yield from (found.id for found in page)
        after = page[-1].id


@dead.command("purge")
@click.argument("queue_name", metavar="QUEUE")
@click.option(
    "--older-than",
    type=float,
    callback=_SECONDS,
    metavar="SECONDS",
    help="Only jobs dead at least this long [default: all].",
)
@click.option("--yes", is_flag=True, help="Purge all without asking.")
@_APP_STORE
@click.pass_obj
def dead_purge(
    ctx: _Context, *, queue_name: str, older_than: float | None, yes: bool, app_spec: str | None
) -> None:
    """Delete QUEUE's dead jobs for good."""
    _check_queue_name(ctx, queue_name)
    if older_than is None and not yes:
        click.confirm(f"delete every dead job of queue {queue_name}?", abort=True)
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        ctx.warn_unknown_queues(store, [queue_name])
        purged = store.queue(queue_name).purge_dead(older_than)
    click.echo(f"{purged} dead job(s) purged")


# -- schedules (docs/schedules.md) ---------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@_APP_STORE
@click.pass_obj
def schedules(ctx: _Context, *, as_json: bool, app_spec: str | None) -> None:
    """Show the store's schedules and when each fires next, then those this
    version cannot read, with the reason (they do not fire)."""
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        found = store.schedules()
        unreadable = store.unreadable_schedules()
    if as_json:
        lines = [(item.name, _schedule_json(item)) for item in found]
        lines += [
            (item.name, {"name": item.name, "revision": item.revision, "unreadable": item.reason})
            for item in unreadable
        ]
        for _, fields in sorted(lines, key=lambda line: line[0]):
            click.echo(json.dumps(fields, ensure_ascii=False))
        return
    if not found and not unreadable:
        click.echo("no schedules")
        return
    if found:
        rows = [
            (
                item.name,
                item.spec,
                item.timezone,
                item.queue,
                _when(item.next_run_at),
                _when(item.last_run_at),
                "-" if item.last_job_id is None else str(item.last_job_id),
            )
            for item in found
        ]
        header = ("name", "spec", "timezone", "queue", "next_run_at", "last_run_at", "last_job")
        click.echo(_table(header, rows))
    if unreadable:
        if found:
            click.echo()
        click.echo(
            f"{len(unreadable)} schedule(s) this version cannot read, so they do not fire "
            "here (save again with `alkstore schedule` or delete with `alkstore unschedule`):"
        )
        reasons = [(item.name, str(item.revision), item.reason) for item in unreadable]
        click.echo(_table(("name", "revision", "reason"), reasons))


def _schedule_json(item: Schedule) -> dict[str, Any]:
    """A schedule's fields for ``schedules --json``."""
    fields = {
        f.name: _jsonable(getattr(item, f.name))
        for f in dataclasses.fields(item)
        if f.name not in ("payload_bytes", "queue_opts")
    }
    fields["payload"] = _jsonable(item.payload)
    fields["queue_opts"] = dataclasses.asdict(item.queue_opts)
    return fields


@cli.command()
@click.argument("name")
@click.argument("spec")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("payload", metavar="JSON")
@click.option("--timezone", default="UTC", show_default=True, help="IANA zone of the cron fields.")
@click.option(
    "--catch-up",
    type=click.Choice(CATCH_UP_POLICIES),
    default="latest",
    show_default=True,
    help="After an outage: fire the latest missed boundary once, or skip.",
)
@click.option("--priority", type=_PRIORITY, help="Higher is claimed first.")
@click.option("--max-attempts", type=_MAX_ATTEMPTS, help="Claims each job may consume.")
@_EXPIRES
@_APP_STORE
@click.pass_obj
def schedule(
    ctx: _Context,
    *,
    name: str,
    spec: str,
    queue_name: str,
    payload: str,
    timezone: str,
    catch_up: str,
    priority: int | None,
    max_attempts: int | None,
    expires: float | None,
    app_spec: str | None,
) -> None:
    """Create or replace the schedule NAME: enqueue JSON into QUEUE on every
    boundary of SPEC ('30 2 * * *', '@daily', '@every 30s')."""
    value = _parse_json(payload)
    options = {"priority": priority, "max_attempts": max_attempts, "expires": expires}
    with ctx.errors():  # what can be checked before the store opens
        v.queue_name(name, "schedule name")
        v.queue_name(queue_name)
        parse_schedule(spec, timezone)
        encode_payload(value)
    with ctx.errors(), ctx.store(app_spec, migrate=True) as store:
        saved = store.schedule(
            name,
            spec,
            queue_name,
            value,
            timezone=timezone,
            catch_up=catch_up,
            **{key: value for key, value in options.items() if value is not None},
        )
    click.echo(f"schedule {saved.name}: next run at {_when(saved.next_run_at)}")


@cli.command()
@click.argument("name")
@_APP_STORE
@click.pass_obj
def unschedule(ctx: _Context, *, name: str, app_spec: str | None) -> None:
    """Delete the schedule NAME (jobs it enqueued stay)."""
    with ctx.errors():
        v.queue_name(name, "schedule name")
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        deleted = store.unschedule(name)
    if not deleted:
        _fail(f"no schedule {name}")
    click.echo(f"schedule {name} deleted")


@cli.command()
@_seconds_option("--interval", DEFAULT_TICK_INTERVAL_S, "Tick this often.", positive=True)
@_LOG_LEVEL
@_APP_STORE
@click.pass_obj
def scheduler(ctx: _Context, *, interval: float, log_level: str, app_spec: str | None) -> None:
    """Fire the store's schedules until SIGTERM/SIGINT, without running jobs.

    Workers tick the scheduler themselves; run this when no worker does
    (workers started with --tick-interval 0). Any number may run: each
    boundary fires once.
    """
    _configure_logging(log_level)
    stop = threading.Event()
    signalled: list[int] = []  # the handler only appends (as stop_signals requires)
    failure: list[BaseException] = []

    def tick_until_stopped(store: Store) -> None:
        try:
            Scheduler(store).run(interval_s=interval, stop=stop)
        except BaseException as exc:
            failure.append(exc)

    with ctx.errors(), ctx.store(app_spec, migrate=True) as store:
        where = app_spec or redact_url(ctx.url or alkstore.DEFAULT_URL)
        log.info("scheduler on %s, ticking every %g s", where, interval)
        ticker = threading.Thread(target=tick_until_stopped, args=(store,), name="alkstore-tick")
        with stop_signals(signalled.append, install=True):
            ticker.start()
            while ticker.is_alive():
                if signalled:
                    stop.set()
                ticker.join(0.2)
        if failure:
            raise failure[0]


@cli.command()
@_APP_STORE
@click.pass_obj
def migrate(ctx: _Context, *, app_spec: str | None) -> None:
    """Create or upgrade the store's schema (idempotent), and say which.

    Prints that it created the schema, upgraded it from one version to
    another, or found it at this code's version already.
    """
    found: SchemaVersionError | None = None
    with ctx.errors():
        try:
            # A look that creates nothing: a store opened with migrate=False
            # refuses a missing schema (and, on SQLite, an older one) with
            # the version it found (docs/contract.md §3 "Schema").
            with _schema_store(ctx, app_spec, migrate=False) as store:
                before = store._schema_version()
        except SchemaVersionError as exc:
            if exc.found is not None and exc.expected is not None and exc.found > exc.expected:
                raise  # newer than this code: nothing to do but say so
            found, before = exc, exc.found
        with _schema_store(ctx, app_spec, migrate=True) as store:
            store.migrate()
            after = store._schema_version()
    click.echo(_migrated(found, before, after))


@contextlib.contextmanager
def _schema_store(ctx: _Context, app_spec: str | None, *, migrate: bool) -> Iterator[Store]:
    """The store of ``--app`` or ``--url`` opened with exactly this
    ``migrate=`` (the app's own engine option does not apply here)."""
    if app_spec:
        with ctx.app(app_spec, migrate=migrate) as app:
            yield app.store
    else:
        with ctx.open(migrate=migrate) as store:
            yield store


def _migrated(refused: SchemaVersionError | None, before: int | None, after: int | None) -> str:
    """What ``migrate`` did: ``refused`` is the look's error (a missing or
    older schema), ``before`` and ``after`` the stored versions around the
    migration (``None`` where the engine does not say)."""
    at = "" if after is None else f" at version {after}"
    if refused is not None and refused.expected is not None and refused.found is None:
        return f"created the alkstore schema{at}"
    if before is not None and after is not None and before < after:
        return f"upgraded the alkstore schema from version {before} to {after}"
    if refused is None and before is not None and before == after:
        return f"the alkstore schema is already at version {after}"
    return f"the alkstore schema is up to date{at}"


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command (the ``alkstore`` console script)."""
    cli.main(args=None if argv is None else list(argv), prog_name="alkstore")
