"""Rows to Job snapshots."""

from __future__ import annotations

import pytest

from alkstore import Job
from alkstore_contract_tests import T0
from alkstore_sqlite._rows import job_from_row, jobs_from_rows, to_us

ROW = (
    7,
    "q",
    "processing",
    b'{"a":[1,2]}',
    "application/json",
    -3,
    to_us(T0),
    None,
    to_us(T0),
    2,
    5,
    30,  # an integral REAL as SQLite may return it
    4,
    3600,
    "w",
    to_us(T0) + 30_000_000,
    "boom",
    None,
    "key",
    None,
    None,
)


def _expected() -> Job:
    from datetime import timedelta

    return Job(
        7,
        "q",
        "processing",
        b'{"a":[1,2]}',
        "application/json",
        -3,
        T0,
        None,
        T0,
        2,
        5,
        30.0,
        4,
        3600,
        "w",
        T0 + timedelta(seconds=30),
        "boom",
        None,
        "key",
        None,
        None,
    )


def test_rows_become_jobs() -> None:
    job = job_from_row(ROW)
    assert job == _expected()
    assert repr(job) == repr(_expected())
    assert isinstance(job.visibility_timeout_s, float)
    with pytest.raises(AttributeError):
        job.attempts = 3  # type: ignore[misc]
    first, second = jobs_from_rows([ROW, ROW])
    assert first == second
    assert first.payload == {"a": [1, 2]}
    assert first.payload is not second.payload  # decoded once per job
    assert first.run_at is first.enqueued_at  # one object per distinct instant
