"""What the Django backend's tests share (imported by conftest.py and the tests)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

HERE = Path(__file__).resolve().parent
URL_ENV = "ALKSTORE_TEST_POSTGRES_URL"
REQUIRE_ENV = "ALKSTORE_REQUIRE_POSTGRES"


def skip_or_fail(reason: str) -> None:
    """Skip the test, or fail it when ``ALKSTORE_REQUIRE_POSTGRES=1``."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1)")
    pytest.skip(reason)


def on_database(server_url: str, name: str) -> str:
    """``server_url`` with its database replaced by ``name``."""
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@dataclass(frozen=True)
class Engine:
    """One engine's task backend and the Django database its store is."""

    name: str
    backend: str  # the TASKS alias
    database: str  # the DATABASES alias

    @property
    def app(self) -> Any:
        from alkstore.contrib.django import backend_app

        return backend_app(self.backend)

    def job(self, result_id: str, queue: str = "default") -> Any:
        return self.app.queue(queue).get_job(int(result_id))

    def stats(self, queue: str = "default") -> Any:
        return self.app.queue(queue).stats()

    def run_worker(self, **options: Any) -> Any:
        """A burst run of a worker of the backend's app, in this process."""
        options.setdefault("concurrency", 2)
        worker = self.app.worker(
            handle_signals=False, sweep_interval_s=None, tick_interval_s=None, **options
        )
        return worker.run(burst=True)
