"""``pause``, ``resume``, ``cancel``, ``retry``, ``dead list|requeue|purge``
and ``workers`` (docs/operations.md, docs/command.md)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from typing import NoReturn

import click

from alkstore.cli.context import (
    Context,
    check_queue_name,
    check_queue_names,
    fail,
    queues_of,
)
from alkstore.cli.group import cli
from alkstore.cli.options import APP_ENV, APP_STORE, JOB_ID, SECONDS
from alkstore.cli.render import job_fields, jsonable, table, when
from alkstore.contract.queue import Queue
from alkstore.contract.vacuum import VacuumReporting


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@APP_STORE
@click.pass_obj
def pause(ctx: Context, *, queue_name: str, app_spec: str | None) -> None:
    """Stop workers everywhere from claiming QUEUE's jobs (enqueues still land)."""
    check_queue_name(ctx, queue_name)
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        ctx.warn_unknown_queues(store, [queue_name])
        changed = store.queue(queue_name).pause()
    click.echo(
        f"queue {queue_name} paused" if changed else f"queue {queue_name} was already paused"
    )


@cli.command()
@click.argument("queue_name", metavar="QUEUE")
@APP_STORE
@click.pass_obj
def resume(ctx: Context, *, queue_name: str, app_spec: str | None) -> None:
    """Let workers claim QUEUE's jobs again."""
    check_queue_name(ctx, queue_name)
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        ctx.warn_unknown_queues(store, [queue_name])
        changed = store.queue(queue_name).resume()
    click.echo(f"queue {queue_name} resumed" if changed else f"queue {queue_name} was not paused")


@cli.command()
@click.argument("job_id", metavar="ID", type=JOB_ID)
@click.option("-q", "--queue", "queues", multiple=True, metavar="QUEUE", help="Where to look.")
@click.option("--app", "app_spec", envvar=APP_ENV, metavar="MODULE:APP", help="Its queues.")
@click.pass_obj
def cancel(ctx: Context, *, job_id: int, queues: tuple[str, ...], app_spec: str | None) -> None:
    """Delete the live (pending or processing) job ID: it never runs, or,
    running, its outcome is not recorded (its handler runs on, and sees
    context.cancelled once its worker's next heartbeat is refused).

    The job is looked for in each queue named by --queue and --app, in
    order; with neither, in every queue of the store. Exits 1 when no such
    live job is found (a dead job is not cancelled: see dead purge).
    """
    check_queue_names(ctx, queues)
    with ctx.errors():
        stack, handles = queues_of(ctx, queues, app_spec, migrate=False)
        with stack:
            found = next(((q, j) for q in handles if (j := q.get_job(job_id)) is not None), None)
            cancelled = found is not None and found[1].state != "dead" and found[0].cancel(job_id)
    if found is not None and cancelled:
        click.echo(f"cancelled job {job_id} of {found[0].name!r}")
        return
    if found is not None and found[1].state in ("dead", "completed"):
        fail(f"no live job {job_id}: it is a {found[1].state} job of {found[0].name!r}")
    _not_found(f"no live job {job_id}", handles)


@cli.command()
@click.argument("job_id", metavar="ID", type=JOB_ID)
@click.option("-q", "--queue", "queues", multiple=True, metavar="QUEUE", help="Where to look.")
@click.option("--app", "app_spec", envvar=APP_ENV, metavar="MODULE:APP", help="Its queues.")
@click.pass_obj
def retry(ctx: Context, *, job_id: int, queues: tuple[str, ...], app_spec: str | None) -> None:
    """Run job ID now: a dead job is requeued (its budget renewed), a job
    waiting out its retry backoff or its delay is made due (Queue.run_now).

    The job is looked for as by cancel. Exits 1 when it is neither dead
    nor waiting (running, due already, completed, or not found).
    """
    check_queue_names(ctx, queues)
    with ctx.errors():
        stack, handles = queues_of(ctx, queues, app_spec, migrate=False)
        with stack:
            found = next(((q, j) for q in handles if (j := q.get_job(job_id)) is not None), None)
            if found is not None:
                queue, job = found
                if job.state == "dead" and queue.requeue(job_id):
                    click.echo(f"requeued dead job {job_id} of {queue.name!r}: due now")
                    return
                if job.state == "pending" and queue.run_now(job_id):
                    click.echo(f"job {job_id} of {queue.name!r} is due now")
                    return
    if found is not None:
        queue, job = found
        held = (
            f"dead, and a live job of the queue holds its unique key {job.unique_key!r}: "
            "cancel that one, or let it finish, first"
        )
        why = {
            "pending": "due already",
            "processing": "running",
            "completed": "completed",
            # Else someone requeued it between the read and the requeue.
            "dead": held if job.unique_key is not None else "requeued by someone else meanwhile",
        }[job.state]
        fail(f"job {job_id} of {queue.name!r} was not retried: it is {why}")
    _not_found(f"no job {job_id}", handles)


def _not_found(what: str, handles: list[Queue]) -> NoReturn:
    """Fail saying ``what`` was not found in the queues looked in."""
    names = ", ".join(q.name for q in handles)
    fail(f"{what} in queue(s) {names}" if names else what)


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


@cli.group()
def dead() -> None:
    """List, requeue and purge a queue's dead letters."""


@dead.command("list")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--after", "after_id", type=JOB_ID, metavar="ID", help="Page on.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@APP_STORE
@click.pass_obj
def dead_list(
    ctx: Context,
    *,
    queue_name: str,
    limit: int,
    after_id: int | None,
    as_json: bool,
    app_spec: str | None,
) -> None:
    """Show QUEUE's dead jobs in id order, --limit at a time (--after the
    last id shown for the next page)."""
    check_queue_name(ctx, queue_name)
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        ctx.warn_unknown_queues(store, [queue_name])
        jobs = store.queue(queue_name).dead_jobs(limit, after_id)
    if as_json:
        for found in jobs:
            click.echo(json.dumps(job_fields(found), ensure_ascii=False))
        return
    if not jobs:
        click.echo(f"no dead jobs in queue {queue_name}")
        return
    rows = [
        (
            str(found.id),
            when(found.died_at),
            f"{found.attempts}/{found.max_attempts}",
            _first_line(found.last_error, LAST_ERROR_WIDTH),
        )
        for found in jobs
    ]
    click.echo(table(("id", "died_at", "attempts", "last_error"), rows))
    if len(jobs) == limit:
        click.echo(f"(more may follow: --after {jobs[-1].id})")


@dead.command("requeue")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("job_ids", metavar="[ID]...", nargs=-1, type=JOB_ID)
@click.option("--all", "every", is_flag=True, help="Requeue every dead job of QUEUE.")
@click.option("--delay", type=float, callback=SECONDS, metavar="SECONDS", help="Due this later.")
@APP_STORE
@click.pass_obj
def dead_requeue(
    ctx: Context,
    *,
    queue_name: str,
    job_ids: tuple[int, ...],
    every: bool,
    delay: float | None,
    app_spec: str | None,
) -> None:
    """Move dead jobs of QUEUE back to pending, each with a renewed attempt
    budget (its attempts so far are kept)."""
    check_queue_name(ctx, queue_name)
    if bool(job_ids) == every:
        fail("give the dead job ids to requeue, or --all (not both)")
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
    callback=SECONDS,
    metavar="SECONDS",
    help="Only jobs dead at least this long [default: all].",
)
@click.option("--yes", is_flag=True, help="Purge all without asking.")
@APP_STORE
@click.pass_obj
def dead_purge(
    ctx: Context, *, queue_name: str, older_than: float | None, yes: bool, app_spec: str | None
) -> None:
    """Delete QUEUE's dead jobs for good."""
    check_queue_name(ctx, queue_name)
    if older_than is None and not yes:
        click.confirm(f"delete every dead job of queue {queue_name}?", abort=True)
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        ctx.warn_unknown_queues(store, [queue_name])
        purged = store.queue(queue_name).purge_dead(older_than)
    click.echo(f"{purged} dead job(s) purged")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@APP_STORE
@click.pass_obj
def workers(ctx: Context, *, as_json: bool, app_spec: str | None) -> None:
    """Show the live workers of the store: where each runs, its queues and
    concurrency, when it started and last refreshed its record, and the
    jobs it runs (docs/contract.md §11 "Workers registry"). A worker that
    stopped without a word drops off three refresh intervals after its last.
    """
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        found = store.workers()
    if as_json:
        for info in found:
            fields = {k: jsonable(v) for k, v in dataclasses.asdict(info).items()}
            click.echo(json.dumps(fields, ensure_ascii=False))
        return
    if not found:
        click.echo("no live workers")
        return
    rows = [
        (
            info.id,
            f"{info.host}:{info.pid}",
            ",".join(info.queues),
            f"{len(info.running)}/{info.concurrency}",
            when(info.started_at),
            when(info.last_seen_at),
            " ".join(map(str, info.running)) or "-",
        )
        for info in found
    ]
    header = ("id", "host:pid", "queues", "busy", "started_at", "last_seen_at", "running")
    click.echo(table(header, rows))


@cli.command()
@APP_STORE
@click.pass_obj
def bloat(ctx: Context, *, app_spec: str | None) -> None:
    """Show the store's dead row versions and what keeps vacuum from
    removing them (docs/operations.md "Long transactions").

    For each of the store's tables: live and dead row versions (the
    server's estimates) and its last vacuum; then the oldest sessions,
    replication slots and prepared transactions that hold the xmin horizon,
    with their age in transactions and how long they have been open.
    Engines that keep no old row versions have nothing to report.
    """
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        if not isinstance(store, VacuumReporting):
            click.echo(f"{type(store).__name__} keeps no dead row versions: nothing to report")
            return
        report = store.vacuum_report()
    rows = [
        (t.table, str(t.live_rows), str(t.dead_rows), when(t.last_autovacuum), when(t.last_vacuum))
        for t in report.tables
    ]
    click.echo(table(("table", "live", "dead", "last autovacuum", "last vacuum"), rows))
    click.echo()
    if not report.holders:
        click.echo("nothing holds the xmin horizon: vacuum can remove every dead row")
        return
    click.echo("oldest holders of the xmin horizon (vacuum keeps every row they may see):")
    holders = [
        (
            h.kind,
            h.ident,
            str(h.age),
            "-" if h.held_s is None else f"{h.held_s:.0f} s",
            h.state or "-",
            h.application_name or "-",
            " ".join((h.query or "-").split()),
        )
        for h in report.holders
    ]
    header = ("kind", "pid/name", "age (xacts)", "open for", "state", "application", "query")
    click.echo(table(header, holders))
