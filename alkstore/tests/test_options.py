"""docs/contract.md §2 durations and QueueOpts; §3 "Validation" and "Error text"."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alkstore import QueueOpts, ValidationError
from alkstore.logic import validation as v

HUNDRED_YEARS_S = 100 * 365.25 * 86400


def test_defaults() -> None:
    assert QueueOpts() == QueueOpts(
        visibility_timeout_s=30,
        max_attempts=5,
        priority=0,
        backoff_base_s=4,
        backoff_cap_s=3600,
        expires_s=None,
        dead_letter_retention_s=None,
    )


def test_timedeltas_are_normalised_to_seconds() -> None:
    opts = QueueOpts(
        visibility_timeout_s=timedelta(minutes=1),
        backoff_base_s=timedelta(seconds=2),
        backoff_cap_s=timedelta(minutes=10),
        expires_s=timedelta(hours=1),
        dead_letter_retention_s=timedelta(days=1),
    )
    assert opts.visibility_timeout_s == 60.0
    assert opts.backoff_base_s == 2
    assert type(opts.backoff_base_s) is int
    assert opts.backoff_cap_s == 600
    assert QueueOpts(backoff_base_s=2.0, backoff_cap_s=60.0).backoff_base_s == 2
    assert opts.expires_s == 3600.0
    assert opts.dead_letter_retention_s == 86400.0


BAD_OPTS = [
    {"visibility_timeout_s": 0},
    {"visibility_timeout_s": -1},
    {"visibility_timeout_s": math.nan},
    {"visibility_timeout_s": math.inf},
    {"visibility_timeout_s": True},
    {"visibility_timeout_s": "30"},
    {"visibility_timeout_s": HUNDRED_YEARS_S + 1},
    {"max_attempts": 0},
    {"max_attempts": 2**31},
    {"max_attempts": 1.0},
    {"max_attempts": True},
    {"priority": 2**31},
    {"priority": -(2**31) - 1},
    {"priority": False},
    {"priority": 1.5},
    {"backoff_base_s": -1},
    {"backoff_base_s": 1.5},
    {"backoff_base_s": timedelta(milliseconds=1500)},
    {"backoff_cap_s": 3601},
    {"backoff_cap_s": -1},
    {"expires_s": 0},
    {"expires_s": -5},
    {"dead_letter_retention_s": -1},
    {"dead_letter_retention_s": math.nan},
]


@pytest.mark.parametrize("kwargs", BAD_OPTS)
def test_bad_queue_opts_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=next(iter(kwargs))):
        QueueOpts(**kwargs)  # type: ignore[arg-type]


def test_boundary_queue_opts_are_accepted() -> None:
    opts = QueueOpts(
        visibility_timeout_s=HUNDRED_YEARS_S,
        max_attempts=2**31 - 1,
        priority=-(2**31),
        backoff_base_s=0,
        backoff_cap_s=0,
        dead_letter_retention_s=0,
    )
    assert opts.max_attempts == 2**31 - 1
    assert QueueOpts(priority=2**31 - 1, backoff_cap_s=3600).backoff_cap_s == 3600


def test_queue_opts_are_frozen() -> None:
    with pytest.raises(AttributeError):
        QueueOpts().priority = 3  # type: ignore[misc]


@given(st.from_regex(r"[A-Za-z0-9_.:-]{1,128}", fullmatch=True))
def test_legal_queue_names(name: str) -> None:
    if name.startswith("__alkstore_"):
        with pytest.raises(ValidationError, match="reserved"):
            v.queue_name(name)
    else:
        assert v.queue_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a b",
        'q"uote',
        "it's",
        "x'); DROP TABLE jobs; --",
        "名前",
        "semi;colon",
        "q" * 129,
        "__alkstore_x",
        "tab\t",
        "nul\x00",
        None,
        b"bytes",
        7,
    ],
)
def test_illegal_queue_names(name: object) -> None:
    with pytest.raises(ValidationError, match="queue name"):
        v.queue_name(name)


@pytest.mark.parametrize("worker", ["", "w" * 256, None, 3, b"w"])
def test_illegal_worker_ids(worker: object) -> None:
    with pytest.raises(ValidationError, match="worker_id"):
        v.worker_id(worker)


def test_legal_worker_ids() -> None:
    assert v.worker_id("w") == "w"
    assert v.worker_id("w" * 255) == "w" * 255


@given(st.floats(min_value=0, max_value=HUNDRED_YEARS_S))
def test_durations_in_range_are_seconds(seconds: float) -> None:
    assert v.duration_s(seconds, "delay") == seconds
    assert v.duration_s(timedelta(seconds=seconds), "delay") == pytest.approx(seconds, abs=1e-6)


@pytest.mark.parametrize(
    "bad",
    [
        -0.001,
        math.nan,
        math.inf,
        -math.inf,
        True,
        "1",
        None,
        HUNDRED_YEARS_S * 1.01,
        timedelta(seconds=-1),
        10**400,
        -(10**400),
        10**4000,
    ],
)
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValidationError, match="delay"):
        v.duration_s(bad, "delay")


def test_huge_ints_are_shown_by_their_size() -> None:
    with pytest.raises(ValidationError, match="at most 100 years, got an int of about 401 digits"):
        v.duration_s(10**400, "delay")
    with pytest.raises(ValidationError, match=">= 0 seconds, got a negative int of about 401"):
        v.duration_s(-(10**400), "delay")
    with pytest.raises(ValidationError, match=r"in 0\.\.3600, got an int of about 5001 digits"):
        QueueOpts(backoff_cap_s=10**5000)


def test_positive_durations_refuse_zero() -> None:
    with pytest.raises(ValidationError, match="> 0"):
        v.duration_s(0, "extend", positive=True)


def test_job_ids_are_ints_counted_once() -> None:
    assert v.job_ids([3, 1, 3, 2, 1]) == [3, 1, 2]
    assert v.job_ids(iter([])) == []
    for bad in ([1, True], [1.0], ["1"], "12", 5):
        with pytest.raises(ValidationError):
            v.job_ids(bad)  # type: ignore[arg-type]


@given(st.text())
def test_error_text_is_storable_and_capped(text: str) -> None:
    stored = v.error_text(text)
    assert len(stored) == min(len(text), v.MAX_ERROR_CHARS)
    assert "\x00" not in stored
    stored.encode("utf-8")  # never a lone surrogate


def test_error_text_rules() -> None:
    assert v.error_text("boom\x00tail") == "boom\ufffdtail"
    assert v.error_text("\x00") == "\ufffd"
    assert v.error_text("é" * 70_000) == "é" * 65_536
    assert v.error_text("bad \ud800 half") == "bad \ufffd half"
    with pytest.raises(ValidationError, match="error must be a str"):
        v.error_text(None)
