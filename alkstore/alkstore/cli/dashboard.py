"""``dashboard``: serve the web dashboard with uvicorn (docs/operations.md
"The dashboard"). Starlette, Jinja2 and uvicorn are imported only when the
command runs: they are the ``alkstore[dashboard]`` extra."""

from __future__ import annotations

import click

from alkstore.cli.context import Context, configure_logging, fail
from alkstore.cli.group import cli
from alkstore.cli.options import APP_STORE, LOG_LEVEL

TOKEN_ENV = "ALKSTORE_DASHBOARD_TOKEN"
#: The Host names a dashboard listening on a loopback address answers by
#: default: a page of another domain resolving to 127.0.0.1 (DNS
#: rebinding) gets 400, not the queues.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--actions", is_flag=True, help="Enable requeue, purge, cancel, pause... (needs --token)."
)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    metavar="TOKEN",
    help=f"The secret that logs a browser in for actions [default: ${TOKEN_ENV}].",
)
@click.option(
    "--root-path",
    default="",
    metavar="PATH",
    help="The path prefix a reverse proxy serves the dashboard under, e.g. /alkstore.",
)
@click.option(
    "--forwarded-allow-ips",
    metavar="IPS",
    help="Proxies trusted for X-Forwarded-Proto/For (uvicorn's) [default: 127.0.0.1].",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="HOST",
    help=(
        "A Host name the dashboard answers (repeat; *.example.com allowed) "
        "[default: 127.0.0.1 and localhost on a loopback --host, else any]."
    ),
)
@click.option(
    "--refresh",
    type=click.FloatRange(0, 3600),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How often pages refresh themselves; 0 never.",
)
@click.option(
    "--metrics",
    is_flag=True,
    help="Also serve /metrics: the queues' gauges for Prometheus (the prometheus extra).",
)
@APP_STORE
@LOG_LEVEL
@click.pass_obj
def dashboard(
    ctx: Context,
    *,
    host: str,
    port: int,
    actions: bool,
    token: str | None,
    root_path: str,
    forwarded_allow_ips: str | None,
    allowed_hosts: tuple[str, ...],
    refresh: float,
    metrics: bool,
    app_spec: str | None,
    log_level: str,
) -> None:
    """Serve the web dashboard: queues, jobs, dead letters, schedules and
    workers, read-only unless --actions is given."""
    try:
        import uvicorn

        from alkstore.dashboard.app import create_app
    except ImportError as exc:
        fail(f"the dashboard needs its extra: pip install 'alkstore[dashboard]' ({exc})")
    if root_path and (not root_path.startswith("/") or root_path.endswith("/")):
        fail("--root-path must start with / and not end with one, e.g. /alkstore")
    if actions and not token:
        fail(f"--actions needs a token: give --token or set ${TOKEN_ENV}")
    if 0 < refresh < 0.1:
        fail("--refresh must be 0 (never) or at least 0.1 s")
    configure_logging(log_level)
    with ctx.errors(), ctx.store(app_spec, migrate=False) as store:
        # An app's queues show even while they hold no job (to pause one
        # before a deploy, or read its zero on /metrics).
        named = [] if ctx.loaded_app is None else ctx.loaded_app[0].queue_names
        try:
            app = create_app(
                store,
                actions=actions,
                token=token,
                refresh_s=refresh,
                metrics=metrics,
                queues=named,
                allowed_hosts=_hosts(host, allowed_hosts),
            )
        except ValueError as exc:
            fail(str(exc))
        except ImportError as exc:
            fail(
                f"--metrics needs the prometheus extra: pip install 'alkstore[prometheus]' ({exc})"
            )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            root_path=root_path,
            proxy_headers=True,
            forwarded_allow_ips=forwarded_allow_ips,
            log_level=log_level.lower(),
        )
        mode = "actions enabled (log in with the token)" if actions else "read-only"
        click.echo(f"alkstore dashboard on http://{host}:{port}{root_path}/ ({mode})", err=True)
        uvicorn.Server(config).run()


def _hosts(listen: str, given: tuple[str, ...]) -> list[str] | None:
    """The Host names to answer: those given; else, listening on a
    loopback address, the loopback names; else any (``None``)."""
    if given:
        return list(given)
    if listen in LOOPBACK_HOSTS:
        return list(LOOPBACK_HOSTS)
    # Any other address, ::1 among them (Starlette's host check cannot
    # match an IPv6 literal's "[::1]:port").
    return None
