"""``alkstore worker MODULE:APP``: run an app's tasks (docs/command.md)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from alkstore.cli.context import Context, configure_logging, fail, warn_unknown_queues
from alkstore.cli.group import cli
from alkstore.cli.options import LOG_LEVEL, seconds_option
from alkstore.logic.redact import redact_url
from alkstore.runtime.worker import (
    DEFAULT_GRACE_PERIOD_S,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_PREFETCH,
    DEFAULT_REGISTRY_INTERVAL_S,
    DEFAULT_SWEEP_INTERVAL_S,
    DEFAULT_TICK_INTERVAL_S,
)

if TYPE_CHECKING:
    from alkstore.runtime.app import App


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
@seconds_option(
    "--registry-interval",
    DEFAULT_REGISTRY_INTERVAL_S,
    "Refresh this worker's record in the workers registry this often; 0: stay out.",
)
@click.option(
    "--worker-id", metavar="ID", help="Recorded on claimed jobs [default: host:pid:random]"
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (needs alkstore[prometheus]).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    metavar="HOST",
    help="The address --metrics-port binds (0.0.0.0: every interface).",
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
    registry_interval: float,
    worker_id: str | None,
    metrics_port: int | None,
    metrics_host: str,
    log_level: str,
) -> None:
    """Run the tasks of the App MODULE:APP until SIGTERM/SIGINT.

    MODULE is imported with the current directory on sys.path; APP defaults
    to "app". The first SIGTERM or SIGINT stops claiming and lets running
    jobs finish within the grace period; a second one exits at once, leaving
    them to be reclaimed. With --metrics-port, the worker's job counts and
    timings are served for Prometheus while it runs (docs/operations.md).
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
            registry_interval_s=registry_interval or None,
            worker_id=worker_id,
        )
        warn_unknown_queues(app.store, queues, app, app_spec)
        logging.getLogger("alkstore.worker").info(
            "worker %s on %s", runner.worker_id, redact_url(app.url)
        )
        with contextlib.ExitStack() as cleanup:
            if metrics_port is not None:
                cleanup.enter_context(_metrics_served(app, metrics_host, metrics_port))
            runner.run(burst=burst)


@contextlib.contextmanager
def _metrics_served(app: App, host: str, port: int) -> Iterator[None]:
    """The app's metrics (alkstore.contrib.prometheus, in prometheus_client's
    default registry) served at http://host:port/metrics meanwhile."""
    try:
        from alkstore.contrib import prometheus
    except ImportError:
        fail("--metrics-port needs prometheus_client: pip install 'alkstore[prometheus]'")
    prometheus.instrument(app)
    try:
        server = prometheus.serve(port, host)
    except OSError as exc:
        fail(f"--metrics-port: cannot serve on {host}:{port}: {exc}")
    logging.getLogger("alkstore.worker").info(
        "serving metrics at http://%s:%d/metrics", host, server.server_port
    )
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
