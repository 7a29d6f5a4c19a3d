"""The SQLite engine's side of the shared contract suite.

``tests/test_contract.py`` plugs it in as
``class TestSqliteContract(ContractSuite, SqliteHarness): pass``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from alkstore.engine import SCHEDULE_COLUMNS
from alkstore_contract_tests.harness import JOB_INSERT_FAULT, EngineHarness, StoreTarget
from alkstore_sqlite import parse_url

__all__ = ["SqliteHarness"]

# Seconds the application's connection waits for alkstore's write lock.
_APP_TIMEOUT_S = 30.0
_FAULT_TRIGGER = "_alkstore_test_dead_insert_fails"
_JOB_FAULT_TRIGGER = "_alkstore_test_job_insert_fails"
_WRITE_FAULT_TRIGGERS = ("_alkstore_test_job_update_fails", "_alkstore_test_job_delete_fails")


def _literal(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


class SqliteHarness(EngineHarness):
    """A fresh database file per test under pytest's ``tmp_path``."""

    stores_survive_fork = True

    @pytest.fixture
    def alkstore_target(self, tmp_path: Path) -> Iterator[StoreTarget]:
        """A URL to a database file that does not exist yet."""
        # An absolute path gives the four-slash form sqlite:////tmp/...; pytest
        # removes tmp_path itself. The base class declares a generator.
        yield StoreTarget(f"sqlite:///{tmp_path / 'alkstore.db'}", {})  # noqa: PT022

    @contextlib.contextmanager
    def app_connection(self, target: StoreTarget) -> Iterator[sqlite3.Connection]:
        """An autocommit ``sqlite3`` connection: ``BEGIN`` is explicit (the
        suite's :meth:`begin`), ``commit()``/``rollback()`` end it. Usable
        from the async store's threads (``check_same_thread=False``), as
        docs/async.md asks of a connection given to ``AsyncQueue.enqueue_tx``."""
        conn = sqlite3.connect(
            parse_url(target.url),
            isolation_level=None,
            timeout=_APP_TIMEOUT_S,
            check_same_thread=False,
        )
        try:
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def dead_letter_inserts_fail(self, target: StoreTarget) -> Iterator[None]:
        """Every insert into ``_alkstore_dead`` aborts while inside."""
        conn = sqlite3.connect(parse_url(target.url), isolation_level=None, timeout=_APP_TIMEOUT_S)
        try:
            conn.execute(
                f"CREATE TRIGGER {_FAULT_TRIGGER} BEFORE INSERT ON _alkstore_dead "
                "BEGIN SELECT RAISE(ABORT, 'injected dead-letter failure'); END"
            )
            try:
                yield
            finally:
                conn.execute(f"DROP TRIGGER IF EXISTS {_FAULT_TRIGGER}")
        finally:
            conn.close()

    @contextlib.contextmanager
    def job_inserts_fail(self, target: StoreTarget, queue: str) -> Iterator[None]:
        """Every insert into ``_alkstore_jobs`` for ``queue`` aborts while inside."""
        conn = sqlite3.connect(parse_url(target.url), isolation_level=None, timeout=_APP_TIMEOUT_S)
        try:
            conn.execute(
                f"CREATE TRIGGER {_JOB_FAULT_TRIGGER} BEFORE INSERT ON _alkstore_jobs "
                f"WHEN NEW.queue = {_literal(queue)} "
                f"BEGIN SELECT RAISE(ABORT, {_literal(JOB_INSERT_FAULT)}); END"
            )
            try:
                yield
            finally:
                conn.execute(f"DROP TRIGGER IF EXISTS {_JOB_FAULT_TRIGGER}")
        finally:
            conn.close()

    def overwrite_schedule_column(
        self, target: StoreTarget, name: str, column: str, value: str | bytes
    ) -> None:
        """One ``UPDATE`` of ``_alkstore_schedules``, whose columns are
        ``SCHEDULE_COLUMNS``."""
        assert column in SCHEDULE_COLUMNS, column
        conn = sqlite3.connect(parse_url(target.url), isolation_level=None, timeout=_APP_TIMEOUT_S)
        try:
            updated = conn.execute(
                f"UPDATE _alkstore_schedules SET {column} = ? WHERE name = ?", (value, name)
            ).rowcount
        finally:
            conn.close()
        assert updated == 1, f"no stored schedule {name!r}"

    @contextlib.contextmanager
    def job_writes_fail(self, target: StoreTarget) -> Iterator[None]:
        """Every update and delete of ``_alkstore_jobs`` aborts while inside
        (SQLITE_CONSTRAINT: not a permanent error)."""
        conn = sqlite3.connect(parse_url(target.url), isolation_level=None, timeout=_APP_TIMEOUT_S)
        try:
            for trigger, event in zip(_WRITE_FAULT_TRIGGERS, ("UPDATE", "DELETE"), strict=True):
                conn.execute(
                    f"CREATE TRIGGER {trigger} BEFORE {event} ON _alkstore_jobs "
                    "BEGIN SELECT RAISE(ABORT, 'injected job-write failure'); END"
                )
            try:
                yield
            finally:
                for trigger in _WRITE_FAULT_TRIGGERS:
                    conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        finally:
            conn.close()
