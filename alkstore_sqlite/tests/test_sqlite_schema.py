"""Schema creation, versioning and engine options (SPEC §2, §3 "Schema")."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlite_children

import alkstore
from alkstore.errors import SchemaVersionError, ValidationError
from alkstore_sqlite import SCHEMA_VERSION, SqliteStore, open_store

TABLES = {"_alkstore_jobs", "_alkstore_dead", "_alkstore_meta"}


def _names(path: Path, kind: str) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_schema WHERE type = ?", (kind,))
        return {name for (name,) in rows}


def _version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        (value,) = conn.execute(
            "SELECT value FROM _alkstore_meta WHERE key = 'schema_version'"
        ).fetchone()
        return int(value)


def test_open_creates_the_prefixed_schema_in_wal_mode(store: SqliteStore, db_path: Path) -> None:
    assert _names(db_path, "table") - {"sqlite_sequence"} == TABLES
    assert {
        "_alkstore_jobs_pending",
        "_alkstore_jobs_processing",
        "_alkstore_jobs_exhausted",
        "_alkstore_jobs_expiry",
        "_alkstore_dead_died",
    } <= _names(db_path, "index")
    assert _version(db_path) == SCHEMA_VERSION
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_migrate_is_idempotent(store: SqliteStore, db_path: Path) -> None:
    job_id = store.queue("q").enqueue("kept")
    store.migrate()
    store.migrate()
    with open_store(f"sqlite:///{db_path}") as again:
        again.migrate()
        job = again.queue("q").get_job(job_id)
        assert job is not None
        assert job.payload == "kept"
    assert _version(db_path) == SCHEMA_VERSION


def test_the_application_tables_are_left_alone(db_path: Path, db_url: str) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, what TEXT)")
        conn.execute("INSERT INTO jobs (what) VALUES ('mine')")
    with open_store(db_url) as store:
        store.queue("q").enqueue(1)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT what FROM jobs").fetchall() == [("mine",)]


def test_migrate_false_on_a_missing_file_raises_and_creates_nothing(
    db_path: Path, db_url: str
) -> None:
    with pytest.raises(SchemaVersionError, match="no alkstore schema"):
        alkstore.open(db_url, migrate=False)
    assert not db_path.exists()


def test_migrate_false_on_an_empty_database_raises(db_path: Path, db_url: str) -> None:
    sqlite3.connect(db_path).close()
    with pytest.raises(SchemaVersionError, match="no alkstore schema"):
        alkstore.open(db_url, migrate=False)
    assert _names(db_path, "table") == set()


def test_migrate_false_on_a_migrated_database_opens(store: SqliteStore, db_url: str) -> None:
    store.queue("q").enqueue(1)
    with alkstore.open(db_url, migrate=False) as again:
        # This store reads the system clock, before the test clock's T0.
        assert again.queue("q").stats().scheduled == 1


@pytest.mark.parametrize("migrate", [True, False])
def test_a_newer_schema_raises_at_open(store: SqliteStore, db_path: Path, migrate: bool) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.execute(
            "UPDATE _alkstore_meta SET value = ? WHERE key = 'schema_version'",
            (SCHEMA_VERSION + 1,),
        )
    with pytest.raises(SchemaVersionError, match="newer"):
        alkstore.open(f"sqlite:///{db_path}", migrate=migrate)
    with pytest.raises(SchemaVersionError, match="newer"):
        store.migrate()


def test_several_processes_migrate_one_new_file_at_once(db_path: Path, db_url: str) -> None:
    processes = 6
    barrier = sqlite_children.barrier(processes)
    results = sqlite_children.run_children(
        sqlite_children.open_at_once, [(db_url, barrier)] * processes
    )
    assert results == ["SqliteStore"] * processes
    assert _version(db_path) == SCHEMA_VERSION
    assert _names(db_path, "table") - {"sqlite_sequence"} == TABLES


def test_unknown_engine_option_is_refused(db_url: str, db_path: Path) -> None:
    with pytest.raises(ValidationError, match="unknown engine option"):
        alkstore.open(db_url, schema="x")
    assert not db_path.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("busy_timeout_s", 0),
        ("busy_timeout_s", -1),
        ("busy_timeout_s", "5"),
        ("poll_interval_s", 0),
        ("poll_interval_s", float("nan")),
        ("migrate", "yes"),
        ("clock", 5),
        ("rng", object()),
    ],
)
def test_bad_engine_option_values_are_refused(db_url: str, option: str, value: object) -> None:
    with pytest.raises(ValidationError):
        alkstore.open(db_url, **{option: value})


def test_engine_options_are_accepted(open_sqlite: Callable[..., SqliteStore]) -> None:
    store = open_sqlite(busy_timeout_s=2.5, poll_interval_s=0.01, migrate=True)
    assert store._busy_timeout_s == 2.5
    assert store._poll_interval_s == 0.01
