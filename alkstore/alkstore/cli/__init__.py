"""The ``alkstore`` command (docs/command.md), built with click.

Importing :mod:`alkstore` does not import this package (nor click): only the
console script and ``python -m alkstore`` do.

Every command takes the store from ``--url``, else ``$ALKSTORE_URL``, else
the embedded ``sqlite:///alkstore.db`` (docs/contract.md §1). The commands that read
queues read those named by ``--queue`` options and by ``--app MODULE:APP``
(``$ALKSTORE_APP``), whose tasks name their queues; with neither, every
queue of the store. Errors print one line on stderr and exit with status 1.

The group and its options are in :mod:`~alkstore.cli.group`, what commands
share in :mod:`~alkstore.cli.context`, :mod:`~alkstore.cli.options` and
:mod:`~alkstore.cli.render`; each family of commands has its module:
:mod:`~alkstore.cli.worker`, :mod:`~alkstore.cli.jobs`,
:mod:`~alkstore.cli.operations`, :mod:`~alkstore.cli.schedules`,
:mod:`~alkstore.cli.dashboard`.
"""

from __future__ import annotations

# Importing the command modules registers their commands on the group.
from alkstore.cli import dashboard, jobs, operations, schedules, worker
from alkstore.cli.context import load_app
from alkstore.cli.group import cli, main

__all__ = ["cli", "dashboard", "jobs", "load_app", "main", "operations", "schedules", "worker"]
