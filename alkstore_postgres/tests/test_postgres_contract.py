"""The shared contract suite against the PostgreSQL engine."""

from __future__ import annotations

import pytest
from postgres_harness import BouncerHarness, PostgresHarness

from alkstore_contract_tests import ContractSuite

pytestmark = pytest.mark.postgres


class TestPostgresContract(ContractSuite, PostgresHarness):
    """Every contract test, on a fresh schema per test."""


class TestBouncerContract(ContractSuite, BouncerHarness):
    """Every contract test again, through PgBouncer in transaction mode."""
