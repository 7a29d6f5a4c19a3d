"""Fixtures of the SQLite engine's own tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from alkstore_contract_tests import ManualClock
from alkstore_sqlite import SqliteStore, open_store


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A fresh database file path (not created yet)."""
    return tmp_path / "alkstore.db"


@pytest.fixture
def db_url(db_path: Path) -> str:
    """The ``sqlite:////...`` URL of :func:`db_path`."""
    return f"sqlite:///{db_path}"


@pytest.fixture
def clock() -> ManualClock:
    """A manual clock at the regression cases' T0."""
    return ManualClock()


@pytest.fixture
def open_sqlite(db_url: str, clock: ManualClock) -> Iterator[Callable[..., SqliteStore]]:
    """Open stores on :func:`db_url` with the test's clock; all closed at teardown."""
    stores: list[SqliteStore] = []

    def opener(**options: Any) -> SqliteStore:
        options.setdefault("clock", clock)
        store = open_store(db_url, **options)
        stores.append(store)
        return store

    yield opener
    for store in stores:
        store.close()


@pytest.fixture
def store(open_sqlite: Callable[..., SqliteStore]) -> SqliteStore:
    """A store on a fresh file with the test's manual clock."""
    return open_sqlite()
