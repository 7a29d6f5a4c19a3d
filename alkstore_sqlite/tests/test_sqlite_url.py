"""SQLite URLs (docs/contract.md §2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import alkstore
from alkstore.errors import ValidationError
from alkstore_sqlite import SqliteStore, parse_url


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///jobs.db", "jobs.db"),
        ("sqlite:///data/jobs.db", "data/jobs.db"),
        ("sqlite:////var/lib/jobs.db", "/var/lib/jobs.db"),
        ("SQLite:///Jobs.DB", "Jobs.DB"),
        ("sqlite:///with space/é.db", "with space/é.db"),
    ],
)
def test_path_is_everything_after_three_slashes(url: str, path: str) -> None:
    assert parse_url(url) == path


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("sqlite:///:memory:", "in-memory"),
        ("sqlite://", "host part or no path"),
        ("sqlite:///", "names no database file"),
        ("sqlite:///dir/", "names no database file"),
        ("sqlite://host/jobs.db", "host part"),
        ("sqlite:///jobs.db?timeout=3", "query string"),
        ("sqlite:///file:jobs.db?mode=ro", "query string"),
        ("sqlite:///file:jobs.db", "URI"),
        ("postgresql:///jobs.db", "not a SQLite URL"),
        ("jobs.db", "not a SQLite URL"),
    ],
)
def test_bad_urls_are_refused_clearly(url: str, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        parse_url(url)


def test_memory_is_refused_by_open() -> None:
    with pytest.raises(ValidationError, match="in-memory"):
        alkstore.open("sqlite:///:memory:")


def test_relative_path_is_relative_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with alkstore.open("sqlite:///sub/rel.db") as store:
        assert isinstance(store, SqliteStore)
        assert store.path == str(tmp_path / "sub" / "rel.db")
    assert (tmp_path / "sub" / "rel.db").exists()


def test_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "abs.db"
    with alkstore.open(f"sqlite:///{path}") as store:
        assert store.path == str(path)
    assert path.exists()


def test_default_url_is_the_embedded_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ALKSTORE_URL", raising=False)
    with alkstore.open() as store:
        assert isinstance(store, SqliteStore)
    assert os.path.exists(tmp_path / "alkstore.db")
