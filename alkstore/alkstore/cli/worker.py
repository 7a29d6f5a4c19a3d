"""``alkstore worker MODULE:APP``: run an app's tasks (docs/command.md)."""

from __future__ import annotations

import logging

import click

from alkstore.cli.context import Context, configure_logging, warn_unknown_queues
from alkstore.cli.group import cli
from alkstore.cli.options import LOG_LEVEL, seconds_option
from alkstore.logic.redact import redact_url
from alkstore.runtime.worker import (
    DEFAULT_GRACE_PERIOD_S,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_PREFETCH,
    DEFAULT_SWEEP_INTERVAL_S,
    DEFAULT_TICK_INTERVAL_S,
)


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
    help="Jobs run at once (sync tasks on threads, async tasks as coroutines).",
)
@click.option(
    "--prefetch",
    type=click.IntRange(0, 10_000),
    default=DEFAULT_PREFETCH,
    show_default=True,
    help="Claimed jobs that may wait for a free slot (0: claim only for free slots).",
)
@click.option("--burst", is_flag=True, help="Exit once no job is ready (RQ's burst mode).")
@seconds_option(
    "--poll-interval",
    DEFAULT_POLL_INTERVAL_S,
    "Re-poll this often when no wake arrives.",
    positive=True,
)
@seconds_option(
    "--grace-period",
    DEFAULT_GRACE_PERIOD_S,
    "On SIGTERM/SIGINT, running jobs get this long to finish.",
)
@seconds_option(
    "--sweep-interval",
    DEFAULT_SWEEP_INTERVAL_S,
    "Sweep expired jobs and old dead letters this often; 0: never.",
)
@seconds_option(
    "--tick-interval",
    DEFAULT_TICK_INTERVAL_S,
    "Fire due schedules this often; 0: never (run `alkstore scheduler` instead).",
)
@click.option(
    "--worker-id", metavar="ID", help="Recorded on claimed jobs [default: host:pid:random]"
)
@LOG_LEVEL
@click.pass_obj
def worker(
    ctx: Context,
    *,
    app_spec: str,
    queues: tuple[str, ...],
    concurrency: int,
    prefetch: int,
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
    configure_logging(log_level)
    with ctx.errors(), app:
        runner = app.worker(
            list(queues) or None,
            concurrency,
            prefetch=prefetch,
            poll_interval_s=poll_interval,
            grace_period_s=grace_period,
            sweep_interval_s=sweep_interval or None,
            tick_interval_s=tick_interval or None,
            worker_id=worker_id,
        )
        warn_unknown_queues(app.store, queues, app, app_spec)
        logging.getLogger("alkstore.worker").info(
            "worker %s on %s", runner.worker_id, redact_url(app.url)
        )
        runner.run(burst=burst)
