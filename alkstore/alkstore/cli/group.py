"""The ``alkstore`` group: its ``--url`` and ``--debug`` (accepted after a
command's name too), and :func:`main`, the console script.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

import alkstore
from alkstore.cli.context import Context

_URL_HELP = (
    "The store: sqlite:///path.db or postgresql://... "
    "[default: $ALKSTORE_URL, else sqlite:///alkstore.db]"
)


_DEBUG_HELP = "On an error, print its traceback before the one-line message."


def _late_url(click_ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    if value is not None:
        obj = click_ctx.find_object(Context)
        assert obj is not None
        obj.url, obj.url_from_command_line = value, True


def _late_debug(click_ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value:
        obj = click_ctx.find_object(Context)
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
    click_ctx.obj = Context(url, source is click.core.ParameterSource.COMMANDLINE, debug)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command (the ``alkstore`` console script)."""
    cli.main(args=None if argv is None else list(argv), prog_name="alkstore")
