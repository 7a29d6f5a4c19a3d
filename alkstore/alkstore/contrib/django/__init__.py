"""A Django Tasks backend on alkstore (docs/django.md).

Settings::

    INSTALLED_APPS = [..., "alkstore.contrib.django"]  # manage.py alkstore_worker
    TASKS = {
        "default": {
            "BACKEND": "alkstore.contrib.django.AlkstoreBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"url": "postgresql://app@db/shop"},
        }
    }

Django tasks come from Django's ``django.tasks`` (Django 6) when present,
else from the ``django-tasks`` backport (``pip install 'alkstore[django]'``).
Nothing here is imported by ``import alkstore``; this package imports
Django only when :class:`AlkstoreBackend` is first read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alkstore.contrib.django.backend import RUN_TASK, AlkstoreBackend, backend_app

__all__ = ["RUN_TASK", "AlkstoreBackend", "backend_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so that INSTALLED_APPS can name this package before Django is set up.
    if name in __all__:
        from alkstore.contrib.django import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
