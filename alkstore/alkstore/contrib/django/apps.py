"""The Django app ``alkstore.contrib.django``: its management command
(``manage.py alkstore_worker``) and, after ``manage.py migrate``, the
schema of each alkstore task backend that follows the migrated database."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate


class AlkstoreConfig(AppConfig):  # type: ignore[misc]  # Django has no stubs here
    name = "alkstore.contrib.django"
    label = "alkstore"
    verbose_name = "alkstore"

    def ready(self) -> None:
        post_migrate.connect(migrate_stores, sender=self)


def migrate_stores(*, using: str, **_: Any) -> None:
    """Open (and so create or upgrade the schema of) the store of every
    :class:`~alkstore.contrib.django.AlkstoreBackend` whose ``database``
    option is ``using``: on a shared SQLite file, the first enqueue inside a
    transaction then finds the schema in place (docs/django.md)."""
    from alkstore.contrib.django._compat import get_backend
    from alkstore.contrib.django.backend import AlkstoreBackend

    for alias in getattr(settings, "TASKS", None) or {}:
        backend = get_backend(alias)
        if isinstance(backend, AlkstoreBackend) and backend.database == using:
            backend.app.store  # noqa: B018 - opening the store migrates it
