"""Small helpers the engine's tests share: threads run at once, and the
indexes a schema holds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg


def in_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run ``target(i)`` on ``count`` threads; re-raise the first error."""
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def index_names(admin: psycopg.Connection[Any], schema: str) -> set[str]:
    """The names of the indexes in ``schema``."""
    rows = admin.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s", [schema]
    ).fetchall()
    return {name for (name,) in rows}
