"""The shared contract suite against the SQLite engine."""

from __future__ import annotations

from harness import SqliteHarness

from alkstore_contract_tests import ContractSuite


class TestSqliteContract(ContractSuite, SqliteHarness):
    """Every contract test, on a fresh SQLite file per test."""
