"""docs/engine-authors.md's worked example certifies, as the page says.

Section 8 of the page is a delegating engine (``delegate:///path`` is the
SQLite engine on ``path``) with its distribution, a strict pytest project,
the plugin line, a harness with every capability and the test module. These
tests take those files from the page itself, so a page that drifts from the
suite (a hook renamed, the plugin moved, the SQLite engine's dead-letter
table renamed, the rule for ``app_connection`` changed) fails here.

The page certifies from built wheels with the entry point installed; that
needs a package index and most of a minute, so the run here registers the
page's engine in-process with ``alkstore.register`` instead, the one
difference, and runs the tests the harness's capabilities turn on (the
spawned-process tests need the installed entry point and are left out).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from alkstore.contract.registry import ENTRY_POINT_GROUP

PAGE = Path(__file__).resolve().parents[2] / "docs" / "engine-authors.md"

EXAMPLE_FILES = {
    "alkstore_delegate/pyproject.toml",
    "alkstore_delegate/alkstore_delegate/__init__.py",
    "project/pyproject.toml",
    "project/conftest.py",
    "project/tests/delegate_harness.py",
    "project/tests/test_delegate_contract.py",
}

#: The tests each capability of the page's harness turns on: the 20 that
#: ``app_connection`` enables (3 of them through the async surface, 1 the
#: worker's ``aenqueue_tx``, 1 ``AsyncOutbox.add``), case 011
#: (``dead_letter_inserts_fail``) and the two fork tests
#: (``stores_survive_fork``).
APP_CONNECTION = (
    "commit_makes_the_job_visible or rollback_leaves_no_job or rollback_to_savepoint"
    " or conn_outside_a_transaction or refused_enqueue_does_not_abort"
    " or options_resolve_as_for_enqueue or committed_message_is_relayed"
    " or rolled_back_message_is_never_sent or refused_message_aborts_nothing"
    " or enqueue_tx_commits_and_rolls_back or async_surface_tx"
    " or outbox_add_commits_with_the_callers_transaction"
)
DEAD_LETTER_FAULT = "case_011"
FORK = "opened_before_fork or parent_closing_its_store"
CAPABILITY_TESTS = 20 + 1 + 2

#: The page's harness with sqlite3's default (implicit) transactions: the
#: page says the suite then fails its check that ``enqueue_tx`` refuses a
#: connection outside a transaction.
IMPLICIT_MODULE = """
import contextlib
import sqlite3

from delegate_harness import DelegateHarness, database_path

from alkstore_contract_tests import ContractSuite


class ImplicitHarness(DelegateHarness):
    @contextlib.contextmanager
    def app_connection(self, target):
        conn = sqlite3.connect(database_path(target), timeout=30)
        try:
            yield conn
        finally:
            conn.close()


class TestImplicitTransactions(ContractSuite, ImplicitHarness):
    pass
"""

#: Instead of installing the entry point: the page's factory, registered
#: under the scheme its pyproject.toml gives it.
REGISTER_CONFTEST = """
import alkstore
import alkstore_delegate

alkstore.register({scheme!r}, alkstore_delegate.open_store)
"""


def example_files() -> dict[str, str]:
    """The page's example: every fenced ``python`` or ``toml`` block of its
    section 8 whose first line is ``# PATH``, as ``{PATH: the rest}``."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index('<a id="example"></a>') :]
    files = {}
    for body in re.findall(r"```(?:python|toml)\n(.*?)```", section, re.S):
        first, _, rest = body.partition("\n")
        marker = re.fullmatch(r"# (\S+)", first)
        if marker:
            files[marker[1]] = rest
    return files


def entry_point(files: dict[str, str]) -> tuple[str, str]:
    """The scheme and the ``module:factory`` the example registers."""
    project = tomllib.loads(files["alkstore_delegate/pyproject.toml"])["project"]
    ((scheme, target),) = project["entry-points"][ENTRY_POINT_GROUP].items()
    return scheme, target


def failed_tests(result: pytest.RunResult) -> set[str]:
    """``Class::test`` of every test the run reports as FAILED or ERROR."""
    found = set()
    for line in result.outlines:
        match = re.match(r"(?:FAILED|ERROR) \S+::(\w+::\w+)", line)
        if match:
            found.add(match[1])
    return found


def test_the_page_holds_the_whole_example() -> None:
    assert set(example_files()) == EXAMPLE_FILES


def test_the_example_registers_under_the_group_alkstore_reads() -> None:
    assert entry_point(example_files()) == ("delegate", "alkstore_delegate:open_store")


@pytest.mark.slow
def test_the_example_certifies_with_every_capability(pytester: pytest.Pytester) -> None:
    files = example_files()
    scheme, target = entry_point(files)
    module, _, factory = target.partition(":")
    assert factory == "open_store"
    package = files["alkstore_delegate/alkstore_delegate/__init__.py"]
    pytester.path.joinpath(module).mkdir()
    pytester.path.joinpath(module, "__init__.py").write_text(package)
    for path, text in files.items():
        if path.startswith("project/"):
            destination = pytester.path / path.removeprefix("project/")
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_text(text)
    pytester.path.joinpath("tests", "conftest.py").write_text(
        REGISTER_CONFTEST.format(scheme=scheme)
    )
    pytester.path.joinpath("tests", "test_implicit_transactions.py").write_text(IMPLICIT_MODULE)

    selection = (
        f"(TestDelegateContract and ({APP_CONNECTION} or {DEAD_LETTER_FAULT} or {FORK}))"
        " or (TestImplicitTransactions and conn_outside_a_transaction)"
    )
    # The page's pyproject.toml is this run's configuration: --strict-markers
    # and warnings as errors, so the page's plugin line is needed and tried.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rfEs", "-k", selection)

    assert failed_tests(result) == {
        "TestImplicitTransactions::test_conn_outside_a_transaction_is_refused"
    }, result.stdout.str()[-3000:]
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == CAPABILITY_TESTS, result.stdout.str()[-3000:]
    assert outcomes.get("failed") == 1
    assert "skipped" not in outcomes
    assert "errors" not in outcomes
