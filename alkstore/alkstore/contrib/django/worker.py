"""The module ``alkstore worker`` loads to run a Django project's tasks:
``DJANGO_SETTINGS_MODULE=mysite.settings alkstore worker alkstore.contrib.django.worker:app``.

Importing it sets Django up (``django.setup()``, unless done already), so
the worker's jobs run in a configured Django process. ``app`` is the
:class:`alkstore.App` of the task backend ``$ALKSTORE_DJANGO_BACKEND``
(default ``"default"``); ``backends.<alias>`` is another alias's
(``alkstore worker alkstore.contrib.django.worker:backends.emails``).
``manage.py alkstore_worker`` runs the same command (docs/django.md).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import django
from django.apps import apps

from alkstore.contrib.django.backend import backend_app
from alkstore.runtime.app import App

__all__ = ["BACKEND_ENV", "app", "backends"]

#: The environment variable naming the task backend ``app`` is the app of.
BACKEND_ENV = "ALKSTORE_DJANGO_BACKEND"

if not apps.ready:
    django.setup()


class _Backends:
    """``backends.<alias>``: the :class:`alkstore.App` of ``TASKS[alias]``."""

    def __getattr__(self, alias: str) -> App:
        if alias.startswith("__"):
            raise AttributeError(alias)
        return backend_app(alias)


backends = _Backends()

if TYPE_CHECKING:
    app: App  # read through __getattr__, at each access


def __getattr__(name: str) -> Any:
    if name == "app":
        return backend_app(os.environ.get(BACKEND_ENV) or "default")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
