"""An optional pytest plugin for projects that run the contract suite.

Opt in from the project's root ``conftest.py``::

    pytest_plugins = ["alkstore_contract_tests.plugin"]

or pass ``-p alkstore_contract_tests.plugin`` (on the command line or in
``addopts``). It is deliberately not a ``pytest11`` entry point: installing
the suite changes nothing until a project asks for it. It declares the
``slow`` marker the suite uses, which a project needs when it runs pytest
with ``--strict-markers`` (collection, and ``-m "not slow"``, refuse an
undeclared marker) or with warnings as errors (``PytestUnknownMarkWarning``);
declaring it again beside a project's own declaration is harmless.
"""

from __future__ import annotations

import pytest

__all__ = ["pytest_configure"]

SLOW = "slow: takes more than a few seconds (processes, stateful runs)"


def pytest_configure(config: pytest.Config) -> None:
    """Declare the suite's markers."""
    config.addinivalue_line("markers", SLOW)
