"""Settings of the test project (alkstore/tests/contrib_django, docs/django.md).

The environment gives the databases, so that the tests and the worker
processes they start share them: ``ALKSTORE_DJANGO_SQLITE`` is the SQLite
file of Django's ``default`` database and of the ``default`` task backend's
store; ``ALKSTORE_DJANGO_POSTGRES``, when set, the PostgreSQL database of
Django's ``pg`` database and of the ``pg`` task backend's store.
"""

import os
from urllib.parse import unquote, urlsplit

SQLITE = os.environ["ALKSTORE_DJANGO_SQLITE"]
POSTGRES = os.environ.get("ALKSTORE_DJANGO_POSTGRES")

SECRET_KEY = "alkstore-contrib-django-tests"
USE_TZ = True
INSTALLED_APPS = ["alkstore.contrib.django", "djshop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# A failing task dies at once, as Django's own backends do (no retries).
_QUEUE_OPTIONS = {"max_attempts": 1}

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": SQLITE,
        # A transaction that reads before it writes takes the write lock first
        # (docs/outbox.md, docs/django.md).
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
}
TASKS = {
    # The store is Django's own SQLite file: enqueue_tx in Django's transaction.
    "default": {
        "BACKEND": "alkstore.contrib.django.AlkstoreBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"url": f"sqlite:///{SQLITE}", "queue_options": _QUEUE_OPTIONS},
    },
    # Another file: the enqueue waits for Django's commit (on_commit).
    "elsewhere": {
        "BACKEND": "alkstore.contrib.django.AlkstoreBackend",
        "OPTIONS": {"url": f"sqlite:///{SQLITE}.elsewhere.db", "queue_options": _QUEUE_OPTIONS},
    },
}

if POSTGRES:
    _url = urlsplit(POSTGRES)
    DATABASES["pg"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
    TASKS["pg"] = {
        "BACKEND": "alkstore.contrib.django.AlkstoreBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"url": POSTGRES, "database": "pg", "queue_options": _QUEUE_OPTIONS},
    }
