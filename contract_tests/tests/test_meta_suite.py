"""Meta-tests: the contract suite fails on broken engines and passes on
correct ones (STYLE.md "The shared suite": a contract that cannot fail
proves nothing).

Each run is a separate pytest process (``pytester.runpytest_subprocess``)
on a generated test module that plugs an engine into ``ContractSuite``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

import pytest

HERE = Path(__file__).resolve().parent

# Each test runs a pytest process of its own: seconds, not milliseconds.
pytestmark = pytest.mark.slow

SUITE_MODULE = """
from alkstore_contract_tests import ContractSuite
from {module} import {harness}


class TestEngineContract(ContractSuite, {harness}):
    pass
"""


#: A hypothesis profile without shrinking: the meta-tests need the state
#: machine to find a fault, not to minimise it (which takes a minute).
CONFTEST = """
from hypothesis import Phase, settings

settings.register_profile("meta", phases=[Phase.explicit, Phase.reuse, Phase.generate])
"""


@pytest.fixture
def run_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> RunSuite:
    """Run the contract suite (or the part chosen by ``args``) against
    ``module.harness`` in a fresh pytest process, with this folder's engines
    importable there and in its spawned children."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    )

    def run(module: str, harness: str, *args: str) -> pytest.RunResult:
        pytester.makeconftest(CONFTEST)
        pytester.makepyfile(
            test_engine_contract=SUITE_MODULE.format(module=module, harness=harness)
        )
        return pytester.runpytest_subprocess(
            "-p",
            "alkstore_contract_tests.plugin",
            "-p",
            "no:cacheprovider",
            "--hypothesis-profile=meta",
            "-rfEs",
            *args,
        )

    return run


class RunSuite(Protocol):
    def __call__(self, module: str, harness: str, *args: str) -> pytest.RunResult: ...


def failed_tests(result: pytest.RunResult) -> set[str]:
    """The names of the tests the run reports as FAILED."""
    names = set()
    for line in result.outlines:
        if line.startswith("FAILED "):
            names.add(line.split("::")[-1].split(" ")[0])
    return names


def skip_reasons(result: pytest.RunResult) -> dict[str, int]:
    """``{reason: count}`` from the run's ``SKIPPED [n] file:line: reason`` lines."""
    reasons: dict[str, int] = {}
    for line in result.outlines:
        match = re.match(r"SKIPPED \[(\d+)\] [^:]+:\d+: (.*)", line)
        if match:
            reasons[match[2]] = reasons.get(match[2], 0) + int(match[1])
    return reasons


ORDER = "claim_one_order or claim_batch_order or case_009"
STALE = "stale_handle or retried_handle"
RACE = "case_001"
DEAD = "case_011"
MODEL = "agrees_with_the_model"


def test_wrong_claim_order_fails(run_suite: RunSuite) -> None:
    result = run_suite("broken_engines", "WrongOrderHarness", "-k", ORDER)
    assert failed_tests(result) == {
        "test_claim_one_order",
        "test_claim_batch_order",
        "test_case_009_priority_direction",
    }
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_wrong_claim_order_fails_the_model_comparison(run_suite: RunSuite) -> None:
    result = run_suite("broken_engines", "WrongOrderHarness", "-k", MODEL)
    assert failed_tests(result) == {"test_engine_agrees_with_the_model"}


def test_stale_handle_accepted_fails(run_suite: RunSuite) -> None:
    result = run_suite("broken_engines", "StaleHandleHarness", "-k", STALE)
    assert failed_tests(result) == {"test_stale_handle_cannot_touch_the_newer_claim"}


def test_stale_handle_accepted_fails_the_model_comparison(
    run_suite: RunSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale handle needs a claim, its lapse, a reclaim and a late call
    through the first handle: rarer than a misordered claim, so this run
    asks for more examples than the default to make the catch certain."""
    monkeypatch.setenv("ALKSTORE_STATEFUL_EXAMPLES", "400")
    result = run_suite("broken_engines", "StaleHandleHarness", "-k", MODEL)
    assert failed_tests(result) == {"test_engine_agrees_with_the_model"}


def test_non_atomic_claim_fails(run_suite: RunSuite) -> None:
    result = run_suite("broken_engines", "RacyClaimHarness", "-k", RACE)
    failed = failed_tests(result)
    # The thread races start at one barrier and lose every time; the process
    # races usually do too, but a loaded machine can serialise their rounds.
    assert failed >= {
        "test_case_001_claim_one_race_threads",
        "test_case_001_claim_batch_race_threads",
    }
    assert failed <= {
        "test_case_001_claim_one_race_threads",
        "test_case_001_claim_batch_race_threads",
        "test_case_001_claim_one_race_processes",
        "test_case_001_claim_batch_race_processes",
    }


def test_non_atomic_dead_letter_move_fails(run_suite: RunSuite) -> None:
    result = run_suite("broken_engines", "LeakyDeadLetterHarness", "-k", DEAD)
    assert failed_tests(result) == {"test_case_011_dead_letter_move_is_atomic"}


def test_the_sqlite_engine_passes_the_same_selection(run_suite: RunSuite) -> None:
    selection = " or ".join(f"({k})" for k in (ORDER, STALE, RACE, DEAD, MODEL))
    result = run_suite("broken_engines", "SqliteHarness", "-k", selection)
    assert failed_tests(result) == set()
    assert result.ret == pytest.ExitCode.OK
    assert result.parseoutcomes()["passed"] >= 13


def test_an_in_process_engine_passes_with_capabilities_skipped(run_suite: RunSuite) -> None:
    """The in-memory model engine has no application connection, no fault
    injection and no child processes: those tests skip, the rest pass."""
    result = run_suite("memory_engine", "MemoryHarness")
    outcomes = result.parseoutcomes()
    assert failed_tests(result) == set(), result.stdout.str()[-3000:]
    assert outcomes.get("errors", 0) == 0
    assert outcomes["passed"] > 300
    # only the capabilities this engine lacks are skipped: 8 process tests
    # (4 claim races, 4 worker crashes and signals), 12 transactional ones
    # (11 contract, 1 worker), case 011's fault injection
    assert skip_reasons(result) == {
        "this engine's harness cannot open its target in a spawned process": 8,
        "this engine's harness gives no application connection": 12,
        "this engine's harness cannot inject dead-letter faults": 1,
    }
