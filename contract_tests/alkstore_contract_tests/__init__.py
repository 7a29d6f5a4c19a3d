"""The alkstore contract suite: one class every engine must pass.

See ``docs/engine-authors.md``.
"""

from __future__ import annotations

from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests.harness import EngineHarness, StoreTarget

__all__ = ["T0", "EngineHarness", "ManualClock", "StoreTarget"]
