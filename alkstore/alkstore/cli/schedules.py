"""``schedules``, ``schedule``, ``unschedule`` and ``scheduler``
(docs/schedules.md).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
from typing import Any

import click

import alkstore
from alkstore.cli.context import Context, configure_logging, fail, log, parse_json
from alkstore.cli.group import cli
from alkstore.cli.options import (
    APP_STORE,
    EXPIRES,
    LOG_LEVEL,
    MAX_ATTEMPTS,
    PRIORITY,
    seconds_option,
)
from alkstore.cli.render import jsonable, table, when
from alkstore.contract.schedule import CATCH_UP_POLICIES, Schedule
from alkstore.contract.store import Store
from alkstore.logic import validation as v
from alkstore.logic.codec import encode_payload
from alkstore.logic.cron import parse_schedule
from alkstore.logic.redact import redact_url
from alkstore.runtime.scheduler import Scheduler
from alkstore.runtime.signals import stop_signals
from alkstore.runtime.worker import (
    DEFAULT_TICK_INTERVAL_S,
)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@APP_STORE
@click.pass_obj
def schedules(ctx: Context, *, as_json: bool, app_spec: str | None) -> None:
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
                when(item.next_run_at),
                when(item.last_run_at),
                "-" if item.last_job_id is None else str(item.last_job_id),
            )
            for item in found
        ]
        header = ("name", "spec", "timezone", "queue", "next_run_at", "last_run_at", "last_job")
        click.echo(table(header, rows))
    if unreadable:
        if found:
            click.echo()
        click.echo(
            f"{len(unreadable)} schedule(s) this version cannot read, so they do not fire "
            "here (save again with `alkstore schedule` or delete with `alkstore unschedule`):"
        )
        reasons = [(item.name, str(item.revision), item.reason) for item in unreadable]
        click.echo(table(("name", "revision", "reason"), reasons))


def _schedule_json(item: Schedule) -> dict[str, Any]:
    """A schedule's fields for ``schedules --json``."""
    fields = {
        f.name: jsonable(getattr(item, f.name))
        for f in dataclasses.fields(item)
        if f.name not in ("payload_bytes", "queue_opts")
    }
    fields["payload"] = jsonable(item.payload)
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
@click.option("--priority", type=PRIORITY, help="Higher is claimed first.")
@click.option("--max-attempts", type=MAX_ATTEMPTS, help="Claims each job may consume.")
@EXPIRES
@APP_STORE
@click.pass_obj
def schedule(
    ctx: Context,
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
    value = parse_json(payload)
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
    click.echo(f"schedule {saved.name}: next run at {when(saved.next_run_at)}")


@cli.command()
@click.argument("name")
@APP_STORE
@click.pass_obj
def unschedule(ctx: Context, *, name: str, app_spec: str | None) -> None:
    """Delete the schedule NAME (jobs it enqueued stay)."""
    with ctx.errors():
        v.queue_name(name, "schedule name")
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        deleted = store.unschedule(name)
    if not deleted:
        fail(f"no schedule {name}")
    click.echo(f"schedule {name} deleted")


@cli.command()
@seconds_option("--interval", DEFAULT_TICK_INTERVAL_S, "Tick this often.", positive=True)
@LOG_LEVEL
@APP_STORE
@click.pass_obj
def scheduler(ctx: Context, *, interval: float, log_level: str, app_spec: str | None) -> None:
    """Fire the store's schedules until SIGTERM/SIGINT, without running jobs.

    Workers tick the scheduler themselves; run this when no worker does
    (workers started with --tick-interval 0). Any number may run: each
    boundary fires once.
    """
    configure_logging(log_level)
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
                if signalled and not stop.is_set():
                    log.info("%s received: stopping", signal.Signals(signalled[0]).name)
                    stop.set()
                ticker.join(0.2)
        if failure:
            raise failure[0]
        log.info("scheduler on %s stopped", where)
