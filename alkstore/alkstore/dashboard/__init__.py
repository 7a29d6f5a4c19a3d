"""The web dashboard (``alkstore dashboard``; docs/operations.md "The
dashboard"): queues, jobs, dead letters, schedules and workers, rendered on
the server, with actions behind a token.

Needs the ``dashboard`` extra (Starlette, Jinja2, uvicorn); importing
:mod:`alkstore` never imports this package.
"""

from __future__ import annotations

from alkstore.dashboard.app import create_app

__all__ = ["create_app"]
