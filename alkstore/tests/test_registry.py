"""docs/contract.md §1 engine discovery by URL scheme."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import alkstore
from alkstore import UnknownEngineError, ValidationError
from alkstore.contract import registry as _registry


class Sentinel(Exception):
    """Raised by the fake factory to prove it was called with the right args."""


def recording_factory(url: str, **options: Any) -> alkstore.Store:
    raise Sentinel(url, options)


def python_stdout(code: str) -> str:
    """What ``python -c code`` prints, in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout


def test_register_wins_and_receives_url_and_options() -> None:
    alkstore.register("Fake-A", recording_factory)
    with pytest.raises(Sentinel) as caught:
        alkstore.open("fake-a://somewhere/x", migrate=False, answer=42)
    assert caught.value.args == ("fake-a://somewhere/x", {"migrate": False, "answer": 42})


def test_unknown_scheme_names_the_installed_ones() -> None:
    alkstore.register("fake-b", recording_factory)
    with pytest.raises(UnknownEngineError, match="'nosuch'") as caught:
        alkstore.open("nosuch://x")
    assert "fake-b" in str(caught.value)
    assert "pip install" not in str(caught.value)


def test_missing_first_party_engine_gives_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_registry, "_entry_point_schemes", dict)
    with pytest.raises(UnknownEngineError, match=r"pip install 'alkstore-postgres\[binary\]'"):
        alkstore.open("postgres://h/db")
    with pytest.raises(UnknownEngineError, match="pip install 'alkstore-sqlite'"):
        alkstore.open("sqlite:///x.db")


def test_an_engine_whose_driver_cannot_be_imported_is_an_unknown_engine() -> None:
    # The installed PostgreSQL engine, its driver made unimportable (as on a
    # host without libpq): the ImportError becomes the cause, not the error.
    pytest.importorskip("alkstore_postgres")
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import alkstore\n"
        "try:\n"
        "    alkstore.open('postgresql://127.0.0.1:1/nowhere')\n"
        "except alkstore.UnknownEngineError as error:\n"
        "    print(type(error.__cause__).__name__, '|', error)\n"
    )
    out = python_stdout(code)
    cause, _, message = out.partition(" | ")
    assert cause == "ModuleNotFoundError"
    assert (
        "'postgresql' (alkstore_postgres:open_store) is installed but cannot be imported" in message
    )
    assert "pip install 'alkstore-postgres[binary]'" in message


def test_two_distributions_claiming_one_scheme_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Point:
        def __init__(self, value: str) -> None:
            self.name, self.value = "dup", value

    monkeypatch.setattr(
        _registry, "_entry_point_schemes", lambda: {"dup": [Point("a:f"), Point("b:f")]}
    )
    with pytest.raises(UnknownEngineError, match="several installed engines"):
        alkstore.open("dup://x")


def test_url_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    alkstore.register("sqlite", recording_factory)
    try:
        monkeypatch.delenv("ALKSTORE_URL", raising=False)
        with pytest.raises(Sentinel) as caught:
            alkstore.open()
        assert caught.value.args[0] == "sqlite:///alkstore.db"
        monkeypatch.setenv("ALKSTORE_URL", "sqlite:////tmp/from-env.db")
        with pytest.raises(Sentinel) as caught:
            alkstore.open()
        assert caught.value.args[0] == "sqlite:////tmp/from-env.db"
    finally:
        del _registry._registered["sqlite"]


@pytest.mark.parametrize(
    "url",
    [
        "no-scheme",
        "://x",
        5,
        # Drivers take C strings in UTF-8: refused before any engine sees them.
        "sqlite:///a\x00b.db",
        "postgresql://u:pw@h/db\x00",
        "sqlite:///\ud800.db",
        "postgresql://h/db?application_name=\udcff",
    ],
)
def test_malformed_urls(url: Any) -> None:
    with pytest.raises(ValidationError, match="url") as caught:
        alkstore.open(url)
    assert "pw@" not in str(caught.value)


def test_importing_alkstore_imports_no_database_driver() -> None:
    code = (
        "import sys, alkstore, alkstore.engine, alkstore.errors; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlite3', '_sqlite3', 'psycopg', 'psycopg_pool', 'alkstore_sqlite', "
        "'alkstore_postgres')))"
    )
    out = python_stdout(code)
    assert out.strip() == "[]"
