"""docs/contract.md §3 "Option resolution", as one pure function."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alkstore import QueueOpts, ValidationError, enqueue_options, resolve

T0 = datetime(2030, 1, 1, tzinfo=UTC)
seconds = st.floats(min_value=0, max_value=10**7, allow_nan=False)
instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


def span(seconds: float) -> timedelta:
    """Whole microseconds, seconds * 1e6 rounded half to even (D26)."""
    return timedelta(microseconds=round(seconds * 1e6))


def test_no_options_means_now_and_the_queue_stamps() -> None:
    opts = QueueOpts(
        visibility_timeout_s=12,
        max_attempts=3,
        priority=4,
        backoff_base_s=2,
        backoff_cap_s=60,
        expires_s=100,
    )
    r = resolve(T0, opts, enqueue_options())
    assert r.enqueued_at == T0
    assert r.run_at == T0
    assert r.expires_at == T0 + timedelta(seconds=100)
    assert (r.priority, r.max_attempts) == (4, 3)
    assert (r.visibility_timeout_s, r.backoff_base_s, r.backoff_cap_s) == (12, 2, 60)


@given(delay=seconds, run_at=instants, now=instants)
def test_delay_wins_over_run_at(delay: float, run_at: datetime, now: datetime) -> None:
    r = resolve(now, QueueOpts(), enqueue_options(delay=delay, run_at=run_at))
    assert r.run_at == now + span(delay)


@given(run_at=instants, offset_h=st.integers(-12, 14))
def test_run_at_in_any_zone_is_normalised_to_utc(run_at: datetime, offset_h: int) -> None:
    zoned = run_at.astimezone(timezone(timedelta(hours=offset_h)))
    r = resolve(T0, QueueOpts(), enqueue_options(run_at=zoned))
    assert r.run_at == run_at
    assert r.run_at.utcoffset() == timedelta(0)


@given(expires=st.floats(min_value=0.001, max_value=10**7), queue_expires=seconds)
def test_expiry_is_relative_to_the_enqueue_instant(expires: float, queue_expires: float) -> None:
    opts = QueueOpts(expires_s=queue_expires or None)
    r = resolve(T0, opts, enqueue_options(expires=expires))
    assert r.expires_at == T0 + span(expires)


def test_per_job_overrides() -> None:
    r = resolve(
        T0, QueueOpts(priority=1, max_attempts=2), enqueue_options(priority=-7, max_attempts=9)
    )
    assert (r.priority, r.max_attempts) == (-7, 9)


@given(delay=seconds, expires=st.floats(min_value=0.001, max_value=10**7))
def test_expiry_at_or_before_run_at_is_refused(delay: float, expires: float) -> None:
    options = enqueue_options(delay=delay, expires=expires)
    if span(expires) <= span(delay):
        with pytest.raises(ValidationError, match="expire"):
            resolve(T0, QueueOpts(), options)
    else:
        assert resolve(T0, QueueOpts(), options).expires_at == T0 + span(expires)


def test_queue_expiry_before_an_explicit_run_at_is_refused_too() -> None:
    with pytest.raises(ValidationError, match="expire"):
        resolve(T0, QueueOpts(expires_s=10), enqueue_options(run_at=T0 + timedelta(seconds=10)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay": -1},
        {"delay": float("nan")},
        {"delay": True},
        {"run_at": datetime(2030, 1, 1)},
        {"run_at": "2030-01-01T00:00:00Z"},
        {"priority": 2**31},
        {"priority": True},
        {"max_attempts": 0},
        {"max_attempts": 2**31},
        {"expires": 0},
        {"expires": -1},
    ],
)
def test_bad_enqueue_options(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=next(iter(kwargs))):
        enqueue_options(**kwargs)


@pytest.mark.parametrize(
    "run_at",
    [
        datetime.min.replace(tzinfo=timezone(timedelta(hours=5))),  # before year 1 in UTC
        datetime.max.replace(tzinfo=timezone(timedelta(hours=-5))),  # after 9999 in UTC
        datetime(1899, 12, 31, 23, 59, tzinfo=UTC),
        datetime(9000, 1, 1, 0, 0, 1, tzinfo=UTC),
    ],
)
def test_instants_outside_the_supported_range_are_refused(run_at: datetime) -> None:
    with pytest.raises(ValidationError, match="run_at must lie between 1900-01-01 and 9000-01-01"):
        enqueue_options(run_at=run_at)


def test_the_widest_instants_and_durations_resolve_without_overflow() -> None:
    last = datetime(9000, 1, 1, tzinfo=UTC)
    hundred_years = timedelta(days=36525)
    r = resolve(last, QueueOpts(), enqueue_options(delay=hundred_years / 2, expires=hundred_years))
    assert r.run_at == last + hundred_years / 2
    assert r.expires_at == last + hundred_years
    assert enqueue_options(run_at=datetime(1900, 1, 1, tzinfo=UTC)).run_at == datetime(
        1900, 1, 1, tzinfo=UTC
    )


class _Zone(tzinfo):
    """A hand-written zone: ``utcoffset`` gives (or raises) ``offset`` and
    counts its calls."""

    def __init__(self, offset: object) -> None:
        self.offset = offset
        self.calls = 0

    def utcoffset(self, dt: datetime | None) -> Any:
        self.calls += 1
        if isinstance(self.offset, BaseException):
            raise self.offset
        return self.offset

    def dst(self, dt: datetime | None) -> None:
        return None


@pytest.mark.parametrize(
    ("offset", "message"),
    [
        (
            timedelta(hours=24),
            "run_at must be timezone-aware with a valid UTC offset; its tzinfo (_Zone) failed "
            "for 2030-01-01T06:30:00: ValueError: offset must be a timedelta strictly between",
        ),
        (
            -timedelta(days=2),
            "run_at must be timezone-aware with a valid UTC offset; its tzinfo (_Zone) failed "
            "for 2030-01-01T06:30:00: ValueError: offset must be a timedelta strictly between",
        ),
        (
            "+05:00",
            "run_at must be timezone-aware with a valid UTC offset; its tzinfo (_Zone) failed "
            "for 2030-01-01T06:30:00: TypeError: tzinfo.utcoffset() must return None or "
            "timedelta, not 'str'",
        ),
        (
            RuntimeError("zone database unreadable"),
            "run_at must be timezone-aware with a valid UTC offset; its tzinfo (_Zone) failed "
            "for 2030-01-01T06:30:00: RuntimeError: zone database unreadable",
        ),
        (
            None,
            "run_at must be timezone-aware; its tzinfo (_Zone) gives no UTC offset for "
            "2030-01-01T06:30:00",
        ),
    ],
    ids=["24h", "minus-2-days", "str", "raises", "none"],
)
def test_a_run_at_whose_tzinfo_gives_no_valid_offset_is_refused(
    offset: object, message: str
) -> None:
    run_at = datetime(2030, 1, 1, 6, 30, tzinfo=_Zone(offset))
    with pytest.raises(ValidationError) as caught:
        enqueue_options(run_at=run_at)
    assert str(caught.value).startswith(message)
    assert caught.value.__cause__ is None  # the zone's error is named, not chained


def test_a_run_at_is_read_through_its_tzinfo_once_and_returned_plain_utc() -> None:
    class Instant(datetime):
        pass

    zone = _Zone(timedelta(hours=5, minutes=30))
    got = enqueue_options(run_at=Instant(2030, 1, 1, 6, 30, tzinfo=zone)).run_at
    assert got == datetime(2030, 1, 1, 1, 0, tzinfo=UTC)
    assert type(got) is datetime  # not the subclass, not the caller's zone
    assert got.tzinfo is UTC
    assert zone.calls == 1
    assert enqueue_options(run_at=datetime(2030, 1, 1, tzinfo=UTC)).run_at.tzinfo is UTC


def test_an_out_of_range_run_at_is_shown_with_its_offset() -> None:
    late = datetime(9000, 1, 1, 0, 0, 1, tzinfo=timezone(-timedelta(hours=5, microseconds=1500)))
    with pytest.raises(ValidationError) as caught:
        enqueue_options(run_at=late)
    assert str(caught.value) == (
        "run_at must lie between 1900-01-01 and 9000-01-01 UTC, "
        "got 9000-01-01T00:00:01 at UTC offset -05:00:00.001500"
    )
