"""``enqueue``, ``stats``, ``job`` and ``migrate``: put jobs in, look at them,
and create or upgrade the schema (docs/command.md).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import click

from alkstore.cli.context import (
    Context,
    check_queue_names,
    fail,
    parse_json,
    queues_of,
    warn_unknown_queues,
)
from alkstore.cli.group import cli
from alkstore.cli.options import (
    APP_ENV,
    APP_STORE,
    EXPIRES,
    JOB_ID,
    MAX_ATTEMPTS,
    PRIORITY,
    SECONDS,
)
from alkstore.cli.render import job_fields
from alkstore.contract.job import QueueStats
from alkstore.contract.queue import Queue
from alkstore.contract.store import Store
from alkstore.errors import SchemaVersionError
from alkstore.logic import validation as v
from alkstore.logic.codec import encode_payload
from alkstore.logic.options import QueueOpts
from alkstore.logic.resolution import enqueue_options, resolve
from alkstore.runtime.app import App
from alkstore.runtime.task import parse_task_payload

#: What ``stats`` and ``job`` say when no queue holds a job or is paused.
NO_JOBS = "no jobs in any queue"


#: The counts of ``stats``: QueueStats' fields, with the lapsed claims
#: (part of processing) after processing.
STATS_COLUMNS = ("pending", "scheduled", "processing", "lapsed", "dead")


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("payload", metavar="JSON")
@click.option("--delay", type=float, callback=SECONDS, metavar="SECONDS", help="Due this later.")
@click.option("--priority", type=PRIORITY, help="Higher is claimed first [default: the queue's].")
@click.option("--max-attempts", type=MAX_ATTEMPTS, help="Claims the job may consume.")
@EXPIRES
@click.option(
    "--unique-key",
    metavar="KEY",
    help="While a live job of QUEUE holds KEY, store nothing and print its id.",
)
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
    ctx: Context,
    *,
    queue_name: str,
    payload: str,
    delay: float | None,
    priority: int | None,
    max_attempts: int | None,
    expires: float | None,
    unique_key: str | None,
    app_spec: str | None,
) -> None:
    """Add a job whose payload is JSON to QUEUE; print its id.

    A worker runs it when the payload names a task:
    '{"task": "jobs.send", "args": [1], "kwargs": {}}'. Without --app the job
    gets the default queue options (QueueOpts()), not those the task's app
    declares (max_attempts, backoff...): pass --app MODULE:APP for those.
    """
    value = parse_json(payload)
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
        v.unique_key(unique_key)
        if app_spec:
            app = ctx.app(app_spec)
            elsewhere, rule_key = _check_task(app, app_spec, queue_name, value)
            if unique_key is None:
                unique_key = rule_key
            _check_enqueue(value, options, app.queue_opts(queue_name))
            with app:
                if not elsewhere:  # that warning names the queue already
                    warn_unknown_queues(app.store, [queue_name], app, app_spec)
                job_id = app.queue(queue_name).enqueue(value, **options, unique_key=unique_key)
        else:
            _check_enqueue(value, options, QueueOpts())
            with ctx.open() as store:
                warn_unknown_queues(store, [queue_name], None, None)
                job_id = store.queue(queue_name).enqueue(value, **options, unique_key=unique_key)
    click.echo(job_id)


def _check_enqueue(value: object, options: dict[str, Any], opts: QueueOpts) -> None:
    """Apply the core's enqueue checks without a store: the payload codec
    and the options, resolved against the queue's ``opts`` (an expiry at or
    before the job is due is refused). Resolution compares instants taken
    from one clock reading, so this host's clock gives the store's answer."""
    encode_payload(value)
    resolve(datetime.now(UTC), opts, enqueue_options(**options))


def _check_task(
    app: App, app_spec: str, queue_name: str, payload: object
) -> tuple[bool, str | None]:
    """With ``--app``: refuse a task payload naming a task the app does not
    have (its worker would dead-letter the job as unknown), or arguments
    that do not fit the task's function; warn when the task is declared on
    another queue (the app's workers claim from it only if given ``-q``).
    Return whether it warned, and the unique key the task's rule gives the
    call (``None`` for none), as ``task.enqueue`` would."""
    if not isinstance(payload, dict) or "task" not in payload:
        return False, None  # not meant as a task payload: a queue of the app's, used by hand
    try:
        call = parse_task_payload(payload)
    except ValueError as exc:
        fail(str(exc))
    task = app.tasks.get(call.name)
    if task is None:
        known = ", ".join(sorted(app.tasks)) or "none"
        fail(f"{app_spec} has no task {call.name!r} (its tasks: {known})")
    task.check_call(call.args, call.kwargs)
    key = task.unique_key_of(call.args, call.kwargs)
    if task.queue != queue_name:
        click.echo(
            f"Warning: task {call.name!r} is declared on queue {task.queue!r}, not "
            f"{queue_name!r}: `alkstore worker {app_spec}` claims from {queue_name!r} "
            f"only when started with -q {queue_name}",
            err=True,
        )
        return True, key
    return False, key


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
    ctx: Context, *, queues: tuple[str, ...], app_spec: str | None, watch: bool, interval: float
) -> None:
    """Show each queue's job counts and whether it is paused.

    pending: due now; scheduled: due later (delayed or backing off);
    processing: claimed by a worker; lapsed: of those, the claims past their
    deadline (a worker died or stalled; the next claim takes them back);
    dead: dead letters.
    """
    check_queue_names(ctx, queues)
    with ctx.errors():
        stack, handles = queues_of(ctx, queues, app_spec, migrate=False)
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


@cli.command()
@click.argument("job_id", metavar="ID", type=JOB_ID)
@click.option("-q", "--queue", "queues", multiple=True, metavar="QUEUE", help="Where to look.")
@click.option("--app", "app_spec", envvar=APP_ENV, metavar="MODULE:APP", help="Its queues.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
def job(
    ctx: Context, *, job_id: int, queues: tuple[str, ...], app_spec: str | None, as_json: bool
) -> None:
    """Show the job ID (live or dead) of the given queues.

    Job ids are unique within a store, but every read is scoped to a queue,
    so the job is looked up in each queue named by --queue and --app, in
    order; with neither, in every queue of the store.
    """
    check_queue_names(ctx, queues)
    with ctx.errors():
        stack, handles = queues_of(ctx, queues, app_spec, migrate=False)
        with stack:
            found = next((j for q in handles if (j := q.get_job(job_id)) is not None), None)
    if found is None:
        names = ", ".join(q.name for q in handles)
        fail(f"no job {job_id} in queue(s) {names}" if names else f"no job {job_id}: {NO_JOBS}")
    fields = job_fields(found)
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


@cli.command()
@APP_STORE
@click.pass_obj
def migrate(ctx: Context, *, app_spec: str | None) -> None:
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
def _schema_store(ctx: Context, app_spec: str | None, *, migrate: bool) -> Iterator[Store]:
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
