"""The alkstore contract suite: one class every engine must pass.

::

    from alkstore_contract_tests import ContractSuite

    class TestMyEngineContract(ContractSuite, MyEngineHarness):
        pass

See :class:`ContractSuite`, :class:`EngineHarness` and
``docs/engine-authors.md``.
"""

from __future__ import annotations

import pytest

# The suite's asserts live in this package, not in the engine's test module:
# ask pytest to rewrite them (for readable failures) before they are imported.
pytest.register_assert_rewrite(
    "alkstore_contract_tests._fixtures",
    "alkstore_contract_tests.suite",
)

from alkstore_contract_tests._clock import T0, ManualClock  # noqa: E402
from alkstore_contract_tests._fixtures import ContractFixtures, StoreFactory  # noqa: E402
from alkstore_contract_tests.harness import EngineHarness, StoreTarget  # noqa: E402
from alkstore_contract_tests.suite import TOPICS, ContractSuite  # noqa: E402

__all__ = [
    "T0",
    "TOPICS",
    "ContractFixtures",
    "ContractSuite",
    "EngineHarness",
    "ManualClock",
    "StoreFactory",
    "StoreTarget",
]
