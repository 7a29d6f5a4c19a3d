"""Schema creation, versioning and engine options (docs/contract.md §2, §3 "Schema")."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import sqlite_children

import alkstore
from alkstore import QueueStats
from alkstore.errors import SchemaVersionError, ValidationError
from alkstore_contract_tests import T0, ManualClock
from alkstore_sqlite import SCHEMA_VERSION, SqliteStore, _schema, _wake, open_store
from alkstore_sqlite._rows import to_us

TABLES = {
    "_alkstore_jobs",
    "_alkstore_dead",
    "_alkstore_completed",
    "_alkstore_meta",
    "_alkstore_queues",
    "_alkstore_wakes",
    "_alkstore_schedules",
    "_alkstore_maintenance",
    "_alkstore_workers",
    "_alkstore_throughput",
}


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
        "_alkstore_jobs_lapsed",
        "_alkstore_jobs_scheduled",
        "_alkstore_jobs_processing",
        "_alkstore_jobs_expiry",
        "_alkstore_dead_died",
        "_alkstore_dead_queue",
        "_alkstore_queues_paused",
        "_alkstore_schedules_due",
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
    with pytest.raises(SchemaVersionError, match="no alkstore schema") as caught:
        alkstore.open(db_url, migrate=False)
    assert str(caught.value).startswith(f"{db_path} has no alkstore schema yet")
    assert "`alkstore migrate`" in str(caught.value)
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


# -- migration from version 1 --------------------------------------------------

_V1_INSERT = """
    INSERT INTO _alkstore_jobs (
        id, queue, state, payload, content_type, priority, run_at, expires_at,
        enqueued_at, attempts, max_attempts, visibility_timeout_s,
        backoff_base_s, backoff_cap_s, worker_id, claim_deadline, last_error)
    VALUES (?, 'q', ?, ?, 'application/json', ?, ?, ?, ?, ?, 3, 30.0, 4, 3600, ?, ?, ?)
"""


def _us(seconds: float) -> int:
    return to_us(T0 + timedelta(seconds=seconds))


def _make_version_1(path: Path) -> None:
    """A version-1 file with rows in every shape, as version-1 code left it."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_schema._CREATE_META)
        for statement in _schema._MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO _alkstore_meta (key, value) VALUES ('schema_version', 1)")
        rows = [
            # id, state, payload, priority, run_at, expires_at, enqueued_at,
            # attempts, worker_id, claim_deadline, last_error
            (1, "pending", b'"due"', 0, _us(-10), None, _us(-10), 0, None, None, None),
            (2, "pending", b'"future"', 9, _us(60), None, _us(-10), 0, None, None, None),
            (3, "pending", b'"retried"', 0, _us(30), None, _us(-10), 1, None, None, "boom"),
            (4, "processing", b'"live"', 0, _us(-10), None, _us(-10), 1, "w", _us(20), None),
            (5, "processing", b'"lapsed"', 5, _us(-10), None, _us(-10), 1, "w", _us(-1), None),
            (6, "processing", b'"last"', 0, _us(-10), None, _us(-10), 3, "w", _us(-1), None),
            (7, "pending", b'"expired"', 7, _us(-10), _us(-5), _us(-10), 0, None, None, None),
            (9, "pending", b'"newest"', 0, _us(-10), None, _us(-10), 0, None, None, None),
        ]
        conn.executemany(_V1_INSERT, rows)
        # The newest job was acked: AUTOINCREMENT remembers its id.
        conn.execute("DELETE FROM _alkstore_jobs WHERE id = 9")
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_version_1_migrates_and_keeps_every_row(db_path: Path) -> None:
    _make_version_1(db_path)
    with sqlite3.connect(db_path) as conn:
        before = conn.execute("SELECT * FROM _alkstore_jobs ORDER BY id").fetchall()
        columns = [d[0] for d in conn.execute("SELECT * FROM _alkstore_jobs").description]
    clock = ManualClock()
    with open_store(f"sqlite:///{db_path}", clock=clock) as store:
        assert _version(db_path) == SCHEMA_VERSION == 5
        with sqlite3.connect(db_path) as conn:
            conn.row_factory = sqlite3.Row
            after = conn.execute("SELECT * FROM _alkstore_jobs ORDER BY id").fetchall()
            states = dict(conn.execute("SELECT id, state FROM _alkstore_jobs").fetchall())
            (seq,) = conn.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = '_alkstore_jobs'"
            ).fetchone()
        # Every column of every row is as it was, but for the private state
        # of the rows not due yet at the store's clock.
        assert [tuple(row[c] for c in columns if c != "state") for row in after] == [
            tuple(v for c, v in zip(columns, row, strict=True) if c != "state") for row in before
        ]
        assert states == {
            1: "pending",
            2: "scheduled",
            3: "scheduled",
            4: "processing",
            5: "processing",
            6: "processing",
            7: "pending",
        }
        assert seq == 9
        assert _names(db_path, "index") >= {"_alkstore_jobs_scheduled", "_alkstore_jobs_lapsed"}
        assert "_alkstore_jobs_exhausted" not in _names(db_path, "index")
        assert store._pool.run(_fetchone, _wake.LATEST_ID) == (9,)

        queue = store.queue("q")
        assert queue.stats() == QueueStats(pending=2, scheduled=2, processing=3, dead=0)
        future = queue.get_job(2)
        assert future is not None
        assert future.state == "pending"
        # The first claim buries the exhausted claim, reclaims the lapsed
        # one (priority 5) and skips the expired one.
        (first,) = queue.claim_batch("w2", 1)
        assert (first.payload, first.attempts) == ("lapsed", 2)
        gone = queue.get_job(6)
        assert gone is not None
        assert (gone.state, gone.last_error) == ("dead", "max attempts exceeded")
        (second,) = queue.claim_batch("w2", 1)
        assert second.payload == "due"
        assert queue.claim_batch("w2", 1) == []
        assert first.ack()
        assert second.ack()
        clock.advance(60)
        # The live claim has lapsed meanwhile.
        claimed = queue.claim_batch("w2", 5)
        assert [h.payload for h in claimed] == ["future", "live", "retried"]
        # Ids go on above the highest ever handed out.
        assert queue.enqueue("new") == 10
        assert tuple(queue.sweep_expired()) == (1, 0)


def test_several_processes_migrate_a_version_1_file_at_once(db_path: Path, db_url: str) -> None:
    _make_version_1(db_path)
    processes = 4
    barrier = sqlite_children.barrier(processes)
    results = sqlite_children.run_children(
        sqlite_children.open_at_once, [(db_url, barrier)] * processes
    )
    assert results == ["SqliteStore"] * processes
    assert _version(db_path) == SCHEMA_VERSION
    with open_store(db_url, clock=ManualClock()) as store:
        assert store.queue("q").stats() == QueueStats(pending=2, scheduled=2, processing=3, dead=0)


def test_migrate_false_refuses_an_older_schema(db_path: Path, db_url: str) -> None:
    _make_version_1(db_path)
    with pytest.raises(
        SchemaVersionError, match=f"version 1, older than this code's {SCHEMA_VERSION}"
    ):
        alkstore.open(db_url, migrate=False)
    assert _version(db_path) == 1
    alkstore.open(db_url).close()
    with alkstore.open(db_url, migrate=False) as store:
        assert store.queue("q").stats().processing == 3


def test_an_application_view_survives_the_upgrade(db_path: Path, db_url: str) -> None:
    _make_version_1(db_path)
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE VIEW app_jobs AS SELECT id, state FROM _alkstore_jobs")
    with alkstore.open(db_url) as store:
        assert isinstance(store, SqliteStore)
        # The migration's connection went back to the pool as it came.
        setting = store._pool.run(_fetchone, "PRAGMA legacy_alter_table")
        assert setting == (0,)
    with sqlite3.connect(db_path) as conn:
        assert len(conn.execute("SELECT * FROM app_jobs").fetchall()) == 7
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def _fetchone(conn: sqlite3.Connection, sql: str) -> object:
    return conn.execute(sql).fetchone()
