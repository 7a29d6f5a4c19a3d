"""Fixtures of the command's tests (test_cli, test_cli_operations)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import JOBS


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder holding test_cli's ``jobs.py`` (tasks ``send`` and ``slow``
    on the queue ``mail``): the current directory of each command."""
    (tmp_path / "jobs.py").write_text(JOBS)
    return tmp_path


@pytest.fixture
def url(project: Path) -> str:
    """The SQLite store in ``project``."""
    return f"sqlite:///{project / 'jobs.db'}"
