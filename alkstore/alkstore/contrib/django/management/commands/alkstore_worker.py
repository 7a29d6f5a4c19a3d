"""``manage.py alkstore_worker``: the ``alkstore worker`` command on a task
backend's app, in this Django process (docs/django.md "Running the worker")."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from alkstore.contrib.django.backend import backend_app

#: ``manage.py alkstore_worker`` option -> ``alkstore worker`` option, for
#: those given a value; the defaults are the command's own.
_PASSED = {
    "concurrency": "--concurrency",
    "prefetch": "--prefetch",
    "poll_interval": "--poll-interval",
    "grace_period": "--grace-period",
    "worker_id": "--worker-id",
    "log_level": "--log-level",
}


class Command(BaseCommand):  # type: ignore[misc]  # Django has no stubs here
    help = (
        "Run alkstore's worker for a Django Tasks backend until SIGTERM/SIGINT "
        "(or, with --burst, until no job is ready)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend", default="default", help="The TASKS alias to work [default: default]"
        )
        parser.add_argument(
            "-q",
            "--queue",
            action="append",
            dest="queues",
            default=[],
            metavar="QUEUE",
            help="A queue to work, repeatable, in priority order [default: the backend's QUEUES]",
        )
        parser.add_argument("-c", "--concurrency", type=int, help="Jobs run at once [default: 1]")
        parser.add_argument("--prefetch", type=int, help="Claimed jobs that may wait for a slot")
        parser.add_argument("--burst", action="store_true", help="Exit once no job is ready")
        parser.add_argument("--poll-interval", help="Re-poll this often when no wake arrives")
        parser.add_argument("--grace-period", help="On SIGTERM/SIGINT, how long jobs may finish")
        parser.add_argument("--worker-id", help="Recorded on claimed jobs")
        parser.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR [default: INFO]")

    def handle(self, *args: Any, **options: Any) -> None:
        import click

        from alkstore.cli import cli

        alias = options["backend"]
        if "." in alias or ":" in alias:
            raise CommandError(f"backend alias {alias!r}: '.' and ':' are not supported here")
        try:
            backend_app(alias)  # a missing backend, or one of another kind: refused by name
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        argv = ["worker", f"alkstore.contrib.django.worker:backends.{alias}"]
        for queue in options["queues"]:
            argv += ["--queue", queue]
        for name, flag in _PASSED.items():
            if options[name] is not None:
                argv += [flag, str(options[name])]
        if options["burst"]:
            argv.append("--burst")
        try:
            cli.main(args=argv, prog_name="manage.py alkstore_worker", standalone_mode=False)
        except click.ClickException as exc:
            raise CommandError(exc.format_message()) from exc
