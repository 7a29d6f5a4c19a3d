"""The command's option types and checks: durations by the contract's rule,
the per-job ranges, job ids, ``--app`` and ``--log-level``, so that every
bad value is a usage error (exit status 2) before the store opens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from alkstore.errors import ValidationError
from alkstore.logic import validation as v


def seconds_check(*, positive: bool = False) -> Any:
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


SECONDS = seconds_check()


POSITIVE_SECONDS = seconds_check(positive=True)


#: The per-job expiry of ``enqueue`` and ``schedule``.
EXPIRES = click.option(
    "--expires",
    type=float,
    callback=POSITIVE_SECONDS,
    metavar="SECONDS",
    help="Expire unrun after this long.",
)


_Command = TypeVar("_Command", bound=Callable[..., Any])


def seconds_option(
    flag: str, default: float, help: str, *, positive: bool = False
) -> Callable[[_Command], _Command]:
    """A duration option with a default, in seconds, checked as above."""
    return click.option(
        flag,
        type=float,
        callback=POSITIVE_SECONDS if positive else SECONDS,
        default=default,
        show_default=True,
        metavar="SECONDS",
        help=help,
    )


# The ranges docs/contract.md §2 gives the per-job options, and job ids (64-bit).
PRIORITY = click.IntRange(v.INT32_MIN, v.INT32_MAX)


MAX_ATTEMPTS = click.IntRange(1, v.INT32_MAX)


JOB_ID = click.IntRange(0, 2**63 - 1)


#: The environment variable naming the app of ``--app``.
APP_ENV = "ALKSTORE_APP"


#: The ``--app`` option of the commands that only need the app's store.
APP_STORE = click.option(
    "--app",
    "app_spec",
    envvar=APP_ENV,
    metavar="MODULE:APP",
    help="Use this app's store (its URL and engine options, e.g. schema=).",
)


#: The ``--log-level`` option of the long-running commands.
LOG_LEVEL = click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
