"""Engine discovery (docs/contract.md §1)."""

from __future__ import annotations

from importlib.metadata import entry_points

import alkstore
from alkstore_sqlite import SqliteStore, open_store


def test_the_entry_point_names_open_store() -> None:
    (point,) = [ep for ep in entry_points(group="alkstore.engines") if ep.name == "sqlite"]
    assert point.value == "alkstore_sqlite:open_store"
    assert point.load() is open_store


def test_alkstore_open_returns_a_sqlite_store(db_url: str) -> None:
    with alkstore.open(db_url) as store:
        assert isinstance(store, SqliteStore)
        assert store.queue("q").enqueue(1) == 1
    assert store.closed
