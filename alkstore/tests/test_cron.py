"""Schedule specs (alkstore.logic.cron): cron boundaries, DST, @every, validation.

The DST expectations are Debian cron's (cron(8), which cronsim follows):
*fixed-time* jobs (minute and hour fields not starting with ``*``) fire once
for a wall time skipped by spring-forward, at the first instant after the
gap, and once for a wall time repeated by fall-back, at its first
occurrence; *wildcard* jobs (minute or hour starting with ``*``) follow the
wall clock as it is, so skipped wall times never fire and repeated ones fire
twice.  ``_reference_boundaries`` below restates those rules independently of
the module (it uses cronsim only to match wall times, with no time zone).
"""

from __future__ import annotations

import functools
import itertools
import pickle
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import given, settings
from hypothesis import strategies as st

from alkstore.errors import ValidationError
from alkstore.logic.cron import ScheduleSpec, parse_schedule

NY = "America/New_York"
ONE_US = timedelta(microseconds=1)


def utc(  # noqa: PLR0917 - reads like datetime(...)
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    """An aware UTC datetime."""
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def boundaries(sched: ScheduleSpec, start: datetime, end: datetime) -> list[datetime]:
    """The boundaries in ``(start, end]``, by feeding next_after its own output."""
    found = []
    t = sched.next_after(start)
    while t <= end:
        found.append(t)
        t = sched.next_after(t)
    return found


def assert_latest_agrees(sched: ScheduleSpec, found: list[datetime]) -> None:
    # Between two successive boundaries, latest_at_or_before is the first.
    for b, after in itertools.pairwise(found):
        for t in (b, b + ONE_US, b + (after - b) / 2, after - ONE_US):
            assert sched.latest_at_or_before(t) == b
        assert sched.latest_at_or_before(after) == after


# --- DST in America/New_York, 2025: spring forward on 2025-03-09 at 02:00 EST
# (07:00Z) to 03:00 EDT; fall back on 2025-11-02 at 02:00 EDT (06:00Z) to
# 01:00 EST.

SPRING_START = utc(2025, 3, 8, 5)  # 2025-03-08 00:00 EST
SPRING_END = utc(2025, 3, 11, 4)  # 2025-03-11 00:00 EDT
FALL_START = utc(2025, 11, 1, 4)  # 2025-11-01 00:00 EDT
FALL_END = utc(2025, 11, 4, 5)  # 2025-11-04 00:00 EST


@pytest.mark.parametrize(
    ("spec", "start", "end", "expected"),
    [
        # 02:30 does not exist on 03-09: fires once at 03:00 EDT, the first
        # instant after the gap.
        (
            "30 2 * * *",
            SPRING_START,
            SPRING_END,
            [utc(2025, 3, 8, 7, 30), utc(2025, 3, 9, 7, 0), utc(2025, 3, 10, 6, 30)],
        ),
        # 01:30 is before the gap: an ordinary day (01:30 EST, then EDT).
        (
            "30 1 * * *",
            SPRING_START,
            SPRING_END,
            [utc(2025, 3, 8, 6, 30), utc(2025, 3, 9, 6, 30), utc(2025, 3, 10, 5, 30)],
        ),
        # 02:30 happens once on 11-02 (02:30 EST, after the repeated hour).
        (
            "30 2 * * *",
            FALL_START,
            FALL_END,
            [utc(2025, 11, 1, 6, 30), utc(2025, 11, 2, 7, 30), utc(2025, 11, 3, 7, 30)],
        ),
        # 01:30 happens twice on 11-02: fires once, at 01:30 EDT (05:30Z), not
        # again at 01:30 EST (06:30Z).
        (
            "30 1 * * *",
            FALL_START,
            FALL_END,
            [utc(2025, 11, 1, 5, 30), utc(2025, 11, 2, 5, 30), utc(2025, 11, 3, 6, 30)],
        ),
        # Fixed-time with several wall times in the gap: 02:00..02:45 all map
        # to 03:00 EDT and fire once there.
        (
            "0,15,30,45 2 * * *",
            utc(2025, 3, 8, 12),
            utc(2025, 3, 10, 12),
            [utc(2025, 3, 9, 7, 0)] + [utc(2025, 3, 10, 6, m) for m in (0, 15, 30, 45)],
        ),
        # Wildcard (minute starts with '*'): Debian cron runs these by the wall
        # clock as it is, and 02:xx never happens on 03-09, so nothing fires.
        (
            "*/15 2 * * *",
            utc(2025, 3, 8, 12),
            utc(2025, 3, 10, 12),
            [utc(2025, 3, 10, 6, m) for m in (0, 15, 30, 45)],
        ),
        # Wildcard in the repeated hour: 01:xx fires in both passes.
        (
            "*/15 1 * * *",
            utc(2025, 11, 1, 12),
            utc(2025, 11, 3, 12),
            [utc(2025, 11, 2, h, m) for h in (5, 6) for m in (0, 15, 30, 45)]
            + [utc(2025, 11, 3, 6, m) for m in (0, 15, 30, 45)],
        ),
        # Fixed-time in the repeated hour: each wall time once, first pass.
        (
            "0,15,30,45 1 * * *",
            utc(2025, 11, 1, 12),
            utc(2025, 11, 3, 12),
            [utc(2025, 11, 2, 5, m) for m in (0, 15, 30, 45)]
            + [utc(2025, 11, 3, 6, m) for m in (0, 15, 30, 45)],
        ),
    ],
)
def test_new_york_dst_boundaries(
    spec: str, start: datetime, end: datetime, expected: list[datetime]
) -> None:
    sched = parse_schedule(spec, NY)
    found = boundaries(sched, start, end)
    assert found == expected
    assert all(b.tzinfo is UTC for b in found)
    assert_latest_agrees(sched, found)


def test_hourly_across_new_york_dst_changes() -> None:
    # "0 * * * *" is a wildcard job (hour field '*'): Debian cron runs it by
    # the wall clock as it is, so it fires at every real top of the hour:
    # 23 times on the spring-forward day (no 02:00), 25 on the fall-back day
    # (01:00 EDT and 01:00 EST).  In UTC that is simply every hour.
    sched = parse_schedule("0 * * * *", NY)
    spring_day = boundaries(sched, utc(2025, 3, 9, 5) - ONE_US, utc(2025, 3, 10, 4) - ONE_US)
    assert spring_day == [utc(2025, 3, 9, 5) + timedelta(hours=h) for h in range(23)]
    fall_day = boundaries(sched, utc(2025, 11, 2, 4) - ONE_US, utc(2025, 11, 3, 5) - ONE_US)
    assert fall_day == [utc(2025, 11, 2, 4) + timedelta(hours=h) for h in range(25)]
    assert [b.astimezone(ZoneInfo(NY)).hour for b in fall_day[:4]] == [0, 1, 1, 2]
    assert [b.astimezone(ZoneInfo(NY)).hour for b in spring_day[:3]] == [0, 1, 3]
    assert_latest_agrees(sched, spring_day)
    assert_latest_agrees(sched, fall_day)


def test_inside_the_repeated_hour_the_methods_agree() -> None:
    # cronsim, asked from 01:40 EST for "45 1 * * *", answers 01:45 EDT (an
    # earlier instant), and asked in reverse from 01:15 EST for "30 1 * * *"
    # steps back to the day before; the module corrects both.
    late = parse_schedule("45 1 * * *", NY)
    assert late.next_after(utc(2025, 11, 2, 6, 40)) == utc(2025, 11, 3, 6, 45)
    assert late.latest_at_or_before(utc(2025, 11, 2, 6, 40)) == utc(2025, 11, 2, 5, 45)
    daily = parse_schedule("30 1 * * *", NY)
    assert daily.latest_at_or_before(utc(2025, 11, 2, 6, 15)) == utc(2025, 11, 2, 5, 30)
    assert daily.next_after(utc(2025, 11, 2, 6, 15)) == utc(2025, 11, 3, 6, 30)
    every_minute_of_1am = parse_schedule("0-59 1 * * *", NY)
    assert every_minute_of_1am.latest_at_or_before(utc(2025, 11, 2, 6, 15)) == utc(
        2025, 11, 2, 5, 59
    )
    assert every_minute_of_1am.next_after(utc(2025, 11, 2, 6, 15)) == utc(2025, 11, 3, 6, 0)
    # The last boundary before 01:15 EST has a later wall time (01:30 EDT),
    # and the one before that is a month back.
    monthly = parse_schedule("30 1 2 * *", NY)
    assert monthly.latest_at_or_before(utc(2025, 11, 2, 6, 15)) == utc(2025, 11, 2, 5, 30)
    assert monthly.latest_at_or_before(utc(2025, 11, 2, 5, 29)) == utc(2025, 10, 2, 5, 30)
    assert monthly.next_after(utc(2025, 11, 2, 5, 29)) == utc(2025, 11, 2, 5, 30)
    assert monthly.next_after(utc(2025, 11, 2, 5, 30)) == utc(2025, 12, 2, 6, 30)


def test_lord_howe_half_hour_shift() -> None:
    # Australia/Lord_Howe moves by 30 minutes: 2025-10-05 02:00 (+10:30) ->
    # 02:30 (+11), and 2025-04-06 02:00 (+11) -> 01:30 (+10:30).
    sched = parse_schedule("15 2 * * *", "Australia/Lord_Howe")
    assert boundaries(sched, utc(2025, 10, 3, 12), utc(2025, 10, 6, 12)) == [
        utc(2025, 10, 3, 15, 45),
        utc(2025, 10, 4, 15, 30),  # 02:15 skipped: fires at 02:30 +11
        utc(2025, 10, 5, 15, 15),
    ]
    twice = parse_schedule("45 1 * * *", "Australia/Lord_Howe")
    assert boundaries(twice, utc(2025, 4, 4, 12), utc(2025, 4, 7, 12)) == [
        utc(2025, 4, 4, 14, 45),
        utc(2025, 4, 5, 14, 45),  # 01:45 +11, not again at 01:45 +10:30
        utc(2025, 4, 6, 15, 15),
    ]
    # Wildcard jobs by the wall clock: 01:30-01:59 happen twice on 04-06 (the
    # change is at 15:00Z), and 02:00 +10:30 follows.  (cronsim's own
    # zone-aware iteration skips 02:00 and 02:15 here: it steps whole hours
    # from 01:00 +11 and lands on 01:30 +10:30, then 02:30.)
    repeated = parse_schedule("*/15 1 * * *", "Australia/Lord_Howe")
    assert boundaries(repeated, utc(2025, 4, 5, 12), utc(2025, 4, 6, 12)) == [
        utc(2025, 4, 5, 14, 0),
        utc(2025, 4, 5, 14, 15),
        utc(2025, 4, 5, 14, 30),
        utc(2025, 4, 5, 14, 45),
        utc(2025, 4, 5, 15, 0),  # 01:30 +10:30
        utc(2025, 4, 5, 15, 15),  # 01:45 +10:30
    ]
    after = parse_schedule("*/15 2 * * *", "Australia/Lord_Howe")
    assert boundaries(after, utc(2025, 4, 5, 12), utc(2025, 4, 6, 12)) == [
        utc(2025, 4, 5, 15, 30),
        utc(2025, 4, 5, 15, 45),
        utc(2025, 4, 5, 16, 0),
        utc(2025, 4, 5, 16, 15),
    ]
    assert after.next_after(utc(2025, 4, 5, 15)) == utc(2025, 4, 5, 15, 30)
    assert after.latest_at_or_before(utc(2025, 4, 5, 15, 29)) == utc(2025, 4, 4, 15, 45)


# --- @every


def test_every_30s_is_anchored_at_the_epoch() -> None:
    sched = parse_schedule("@every 30s", NY)
    assert sched.next_after(utc(2025, 1, 1, 0, 0, 10)) == utc(2025, 1, 1, 0, 0, 30)
    assert sched.latest_at_or_before(utc(2025, 1, 1, 0, 0, 10)) == utc(2025, 1, 1)
    assert sched.next_after(utc(2025, 1, 1, 0, 0, 30)) == utc(2025, 1, 1, 0, 1)
    assert sched.latest_at_or_before(utc(2025, 1, 1, 0, 0, 30)) == utc(2025, 1, 1, 0, 0, 30)
    assert sched.next_after(utc(2025, 1, 1, 0, 0, 30) - ONE_US) == utc(2025, 1, 1, 0, 0, 30)
    assert sched.latest_at_or_before(utc(2025, 1, 1, 0, 0, 59, 999_999)) == utc(
        2025, 1, 1, 0, 0, 30
    )
    assert sched.next_after(utc(1969, 12, 31, 23, 59, 59)) == utc(1970, 1, 1)
    assert sched.latest_at_or_before(utc(1970, 1, 1)) == utc(1970, 1, 1)
    assert sched.latest_at_or_before(utc(1969, 12, 31, 23, 59, 59)) == utc(1969, 12, 31, 23, 59, 30)


def test_every_1h30m_is_anchored_at_the_epoch_not_the_zone() -> None:
    # 5400 s; 2025-01-01T00:00Z is 1_735_689_600 s = 321_424 * 5400 s after
    # the epoch, so it is a boundary, and so is every 90 minutes from it.
    for zone in ("UTC", NY, "Asia/Kolkata", "Australia/Lord_Howe"):
        sched = parse_schedule("@every 1h30m", zone)
        assert sched.next_after(utc(2025, 1, 1, 1)) == utc(2025, 1, 1, 1, 30)
        assert sched.latest_at_or_before(utc(2025, 1, 1, 1)) == utc(2025, 1, 1)
        assert boundaries(sched, utc(2025, 1, 1), utc(2025, 1, 1, 6)) == [
            utc(2025, 1, 1, 1, 30),
            utc(2025, 1, 1, 3),
            utc(2025, 1, 1, 4, 30),
            utc(2025, 1, 1, 6),
        ]
    # 7 minutes: the anchor is the epoch, not the top of the hour.
    seven = parse_schedule("@every 7m")
    k = (1_735_689_600 // 420) + 1  # first boundary after 2025-01-01T00:00Z
    assert seven.next_after(utc(2025, 1, 1)) == utc(1970, 1, 1) + timedelta(seconds=k * 420)
    assert seven.next_after(utc(2025, 1, 1)) == utc(2025, 1, 1, 0, 5)


def test_every_takes_instants_in_any_zone_and_answers_in_utc() -> None:
    sched = parse_schedule("@every 2d")
    kolkata = datetime(2025, 1, 2, 5, 30, tzinfo=ZoneInfo("Asia/Kolkata"))  # 2025-01-02T00:00Z
    # 2025-01-01 is day 20089 after the epoch (odd), so even days are 01-02, 01-04.
    assert sched.latest_at_or_before(kolkata) == utc(2025, 1, 2)
    assert sched.next_after(kolkata) == utc(2025, 1, 4)
    assert sched.next_after(kolkata).tzinfo is UTC


@given(
    period_s=st.integers(1, 36_525 * 86_400),
    offset_us=st.integers(-(5 * 10**16), 10**17),  # years 385 to 5138
)
def test_every_is_exact_integer_arithmetic(period_s: int, offset_us: int) -> None:
    sched = parse_schedule(f"@every {period_s}s")
    t = utc(1970, 1, 1) + timedelta(microseconds=offset_us)
    latest = sched.latest_at_or_before(t)
    nxt = sched.next_after(t)
    assert latest is not None
    period_us = period_s * 1_000_000
    assert (latest - utc(1970, 1, 1)) // ONE_US == (offset_us // period_us) * period_us
    assert latest <= t < nxt == latest + timedelta(seconds=period_s)


def test_every_durations() -> None:
    start = utc(2025, 1, 1)
    assert parse_schedule("@every 2d").next_after(start) == utc(2025, 1, 2)
    assert parse_schedule("@every 1d12h").next_after(start) == utc(2025, 1, 1, 12)
    assert parse_schedule("@every 1s").next_after(start) == utc(2025, 1, 1, 0, 0, 1)
    assert parse_schedule("@every 90m").next_after(start) == utc(2025, 1, 1, 1, 30)
    assert parse_schedule("@every 1h1h").next_after(start) == utc(2025, 1, 1, 2)
    assert parse_schedule("@EVERY\t45s ").spec == "@EVERY\t45s"
    assert parse_schedule("@every 36525d").latest_at_or_before(start) == utc(1970, 1, 1)


# --- aliases and cron syntax


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("@yearly", utc(2026, 1, 1, 5)),
        ("@annually", utc(2026, 1, 1, 5)),
        ("@monthly", utc(2025, 2, 1, 5)),
        ("@weekly", utc(2025, 1, 5, 5)),  # 2025-01-05 is a Sunday
        ("@daily", utc(2025, 1, 16, 5)),
        ("@midnight", utc(2025, 1, 16, 5)),
        ("@hourly", utc(2025, 1, 15, 13)),
        ("@DAILY", utc(2025, 1, 16, 5)),
        ("  @Hourly\n", utc(2025, 1, 15, 13)),
    ],
)
def test_aliases(alias: str, expected: datetime) -> None:
    sched = parse_schedule(alias, NY)
    assert sched.spec == alias.strip()
    t = utc(2025, 1, 15, 12, 30) if alias.strip().lower() != "@weekly" else utc(2025, 1, 1)
    assert sched.next_after(t) == expected


def test_alias_dst_kinds() -> None:
    # @daily is fixed-time, @hourly a wildcard job (Debian sets HR_STAR for it):
    # 25 firings on the local fall-back day, 2025-11-02 00:00 EDT to 24:00 EST.
    daily = parse_schedule("@daily", NY)
    assert boundaries(daily, utc(2025, 11, 1, 12), utc(2025, 11, 3, 12)) == [
        utc(2025, 11, 2, 4),
        utc(2025, 11, 3, 5),
    ]
    hourly = parse_schedule("@hourly", NY)
    fall_day = boundaries(hourly, utc(2025, 11, 2, 4) - ONE_US, utc(2025, 11, 3, 5) - ONE_US)
    assert len(fall_day) == 25


@pytest.mark.parametrize(
    ("spec", "after", "expected"),
    [
        ("0 9 * * MON-FRI", utc(2025, 1, 3, 9), utc(2025, 1, 6, 9)),
        ("0 9 * * mon-fri", utc(2025, 1, 3, 9), utc(2025, 1, 6, 9)),
        ("0 0 1 JAN,jul *", utc(2025, 1, 1), utc(2025, 7, 1)),
        ("0 0 L * *", utc(2025, 2, 10), utc(2025, 2, 28)),
        ("0 0 L 2 *", utc(2023, 3, 1), utc(2024, 2, 29)),
        ("0 0 LW * *", utc(2025, 5, 1), utc(2025, 5, 30)),  # 05-31 is a Saturday
        ("0 12 * * MON#2", utc(2025, 1, 1), utc(2025, 1, 13, 12)),
        ("0 12 * * 5L", utc(2025, 1, 1), utc(2025, 1, 31, 12)),
        ("*/20 8-9 * * *", utc(2025, 1, 1, 8, 40), utc(2025, 1, 1, 9)),
        ("0 0 13 * FRI", utc(2025, 1, 1), utc(2025, 1, 3)),  # DOM or DOW (Debian)
        ("0 0 */13 * FRI", utc(2025, 1, 1), utc(2025, 2, 14)),  # "*" first: DOM (1,14,27) and DOW
        ("0 0 29 2 *", utc(2025, 1, 1), utc(2028, 2, 29)),
        ("  5   4 * * *  ", utc(2025, 1, 1), utc(2025, 1, 1, 4, 5)),
    ],
)
def test_cron_syntax(spec: str, after: datetime, expected: datetime) -> None:
    sched = parse_schedule(spec)
    assert sched.next_after(after) == expected
    assert sched.latest_at_or_before(expected) == expected
    assert sched.latest_at_or_before(expected - ONE_US) != expected


def test_spec_value_semantics() -> None:
    a = parse_schedule(" 30 2 * * * ", NY)
    assert a == ScheduleSpec("30 2 * * *", NY)
    assert hash(a) == hash(ScheduleSpec("30 2 * * *", NY))
    assert a != parse_schedule("30 2 * * *", "UTC")
    assert repr(a) == "ScheduleSpec(spec='30 2 * * *', timezone='America/New_York')"
    assert parse_schedule("@daily").timezone == "UTC"
    copy = pickle.loads(pickle.dumps(a))
    assert copy == a
    assert copy.next_after(utc(2025, 3, 8, 12)) == utc(2025, 3, 9, 7)
    with pytest.raises(AttributeError):
        a.spec = "@daily"  # type: ignore[misc]


# --- validation


@pytest.mark.parametrize(
    ("spec", "zone", "fragment"),
    [
        (None, "UTC", "schedule spec must be a str, got NoneType"),
        (b"@daily", "UTC", "schedule spec must be a str, got bytes"),
        ("@daily", 0, "time zone must be a str, got int"),
        ("@daily", ZoneInfo("UTC"), "time zone must be a str, got ZoneInfo"),
        ("", "UTC", "expected 5 fields"),
        ("* * * *", "UTC", "'* * * *': expected 5 fields"),
        ("0 * * * * *", "UTC", "'0 * * * * *': expected 5 fields"),
        ("@reboot", "UTC", "'@reboot' is not supported"),
        ("@REBOOT", "UTC", "'@REBOOT' is not supported"),
        ("@fortnightly", "UTC", "unknown schedule alias '@fortnightly'"),
        ("@daily 0", "UTC", "unknown schedule alias '@daily 0'"),
        ("@every", "UTC", "@every takes a duration such as 30s"),
        ("@every   ", "UTC", "@every takes a duration such as 30s"),
        ("@every30s", "UTC", "unknown schedule alias '@every30s'"),
        ("@every 30", "UTC", "got '30'"),
        ("@every 1.5h", "UTC", "got '1.5h'"),
        ("@every 1w", "UTC", "got '1w'"),
        ("@every 30S", "UTC", "got '30S'"),
        ("@every 1h 30m", "UTC", "got '1h 30m'"),
        ("@every -5s", "UTC", "got '-5s'"),
        ("@every h", "UTC", "got 'h'"),
        ("@every \uff15s", "UTC", "got '\uff15s'"),  # a full-width digit
        ("@every 0s", "UTC", "'0s' is shorter than 1 second"),
        ("@every 0d0h0m0s", "UTC", "'0d0h0m0s' is shorter than 1 second"),
        ("@every 36526d", "UTC", "'36526d' is longer than 100 years"),
        ("@every 36525d1s", "UTC", "'36525d1s' is longer than 100 years"),
        ("@every " + "9" * 5000 + "s", "UTC", "is longer than 100 years"),
        ("61 * * * *", "UTC", "invalid cron expression '61 * * * *': Bad minute"),
        ("0 24 * * *", "UTC", "invalid cron expression '0 24 * * *': Bad hour"),
        ("0 0 0 * *", "UTC", "'0 0 0 * *': Bad day-of-month"),
        ("0 0 31 2 *", "UTC", "'0 0 31 2 *': Bad day-of-month"),
        ("0 0 * 13 *", "UTC", "'0 0 * 13 *': Bad month"),
        ("0 0 * * 8", "UTC", "'0 0 * * 8': Bad day-of-week"),
        ("0 0 * * MON#6", "UTC", "'0 0 * * MON#6': Bad day-of-week"),
        ("*/0 * * * *", "UTC", "'*/0 * * * *': Bad minute"),
        ("5-1 * * * *", "UTC", "'5-1 * * * *': Bad minute"),
        ("a b c d e", "UTC", "invalid cron expression 'a b c d e'"),
        ("? * * * *", "UTC", "invalid cron expression '? * * * *'"),
        ("*/" + "9" * 5000 + " * * * *", "UTC", "invalid cron expression '*/999"),
        ("@daily", "", "time zone '' is not an IANA zone name"),
        ("@daily", "Mars/Olympus_Mons", "unknown time zone 'Mars/Olympus_Mons'"),
        ("@daily", "America", "unknown time zone 'America'"),
        ("@daily", "UTC ", "time zone 'UTC ' is not an IANA zone name"),
        ("@daily", "../etc/passwd", "time zone '../etc/passwd' is not an IANA zone name"),
        ("@daily", "/etc/localtime", "time zone '/etc/localtime' is not an IANA zone name"),
        ("@daily", "America\\New_York", "is not an IANA zone name"),
        ("@daily", "localtime", "time zone 'localtime' is not an IANA zone name"),
        ("@every 30s", "Nowhere/Else", "unknown time zone 'Nowhere/Else'"),
    ],
)
def test_validation_errors(spec: object, zone: object, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_schedule(spec, zone)
    assert fragment in str(info.value)


def test_cron_errors_keep_cronsims_error_as_cause() -> None:
    with pytest.raises(ValidationError, match=r"'61 \* \* \* \*'") as info:
        parse_schedule("61 * * * *")
    assert isinstance(info.value.__cause__, CronSimError)


def test_unknown_zone_keeps_zoneinfos_error_as_cause() -> None:
    with pytest.raises(ValidationError, match="Mars/Olympus_Mons") as info:
        parse_schedule("@daily", "Mars/Olympus_Mons")
    assert isinstance(info.value.__cause__, KeyError)  # ZoneInfoNotFoundError


def test_constructor_validates_too() -> None:
    with pytest.raises(ValidationError, match="Bad minute"):
        ScheduleSpec("99 * * * *", "UTC")
    with pytest.raises(ValidationError, match="schedule spec must be a str"):
        ScheduleSpec(5, "UTC")  # type: ignore[arg-type]


# --- properties: the two methods agree, and match Debian cron's rules
#
# The reference enumerates matching wall times with cronsim on naive
# datetimes (calendar matching only: no time zone, so no DST handling) and
# applies Debian cron's DST rules itself.


def _is_wildcard(expression: str) -> bool:
    minute, hour = expression.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def _gap_end(wall: datetime, zone: ZoneInfo) -> datetime:
    # For a wall time in a gap, fold=1 reads it with the offset after the
    # change (an instant before the change) and fold=0 with the one before
    # (after it): the change is the first whole minute in between whose
    # offset is the new one.
    lo = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    hi = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    new_offset = hi.astimezone(zone).utcoffset()
    t = lo
    while t.astimezone(zone).utcoffset() != new_offset:
        t += timedelta(minutes=1)
    return t


def _reference_boundaries(
    expression: str, zone: ZoneInfo, wall_from: datetime, wall_to: datetime
) -> list[datetime]:
    wildcard = _is_wildcard(expression)
    found: set[datetime] = set()
    for wall in CronSim(expression, wall_from):
        if wall > wall_to:
            break
        real = []
        for fold in (0, 1):
            instant = wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)
            if instant.astimezone(zone).replace(tzinfo=None) == wall:
                real.append(instant)
        if not real:  # in a gap
            if not wildcard:
                found.add(_gap_end(wall, zone))
        elif wildcard:
            found.update(real)  # twice when repeated
        else:
            found.add(min(real))  # first occurrence only
    return sorted(found)


ZONES = ["UTC", NY, "Europe/London", "Australia/Lord_Howe", "Asia/Kolkata"]

# (expression, days around t that surely hold the boundaries on both sides)
SPECS = [
    ("30 2 * * *", 2),
    ("30 1 * * *", 2),
    ("15 2 * * *", 2),
    ("45 1 * * *", 2),
    ("0 * * * *", 1),
    ("*/15 2 * * *", 3),
    ("*/10 1,2 * * *", 3),
    ("0,15,30,45 1,2 * * *", 2),
    ("0,10,20,30,40,50 1-2 * * *", 2),
    ("0-59 1 * * *", 2),
    ("45 0-3 * * *", 2),
    ("*/7 * * * *", 1),
    ("0 9 * * MON-FRI", 5),
    ("0 0 L * *", 33),
    ("30 1 * * SUN#1", 40),
    ("0 0 * * *", 2),
    ("0 * * * SUN", 8),
    # Sparse ones; the first Sunday of November is the US fall-back day.
    ("*/30 1 * 11 SUN#1", 370),
    ("30 1 1-7 11 SUN", 370),
    ("30 2 29 2 *", 1500),
    ("30 1 2 * *", 33),
]


@functools.cache
def _transitions(zone_name: str) -> list[datetime]:
    """The instants 2020-2030 where the zone's UTC offset changes."""
    zone = ZoneInfo(zone_name)
    found = []
    t = utc(2020, 1, 1)
    while t < utc(2030, 1, 1):
        nxt = t + timedelta(days=1)
        if t.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            lo, hi = t, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == lo.astimezone(zone).utcoffset():
                    lo = mid
                else:
                    hi = mid
            found.append(hi.replace(second=0, microsecond=0))
        t = nxt
    return found


@st.composite
def instants(draw: st.DrawFn, zone_name: str) -> datetime:
    changes = _transitions(zone_name)
    near_change = draw(st.booleans())
    if changes and near_change:
        # Close to a DST change, where the rules bite.
        base = draw(st.sampled_from(changes))
        offset = draw(st.integers(-2 * 86_400, 2 * 86_400))
        t = base + timedelta(seconds=offset)
    else:
        t = utc(1995, 1, 1) + timedelta(seconds=draw(st.integers(0, 40 * 365 * 86_400)))
    shape = draw(st.sampled_from(["minute", "second", "micro"]))
    if shape == "minute":
        t = t.replace(second=0)
    elif shape == "micro":
        t = t.replace(microsecond=draw(st.integers(0, 999_999)))
    return t


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, int, str, datetime]:
    expression, days = draw(st.sampled_from(SPECS))
    zone_name = draw(st.sampled_from(ZONES))
    return expression, days, zone_name, draw(instants(zone_name))


@settings(max_examples=400, deadline=None)
@given(case=cases(), in_zone=st.booleans())
def test_cron_matches_debian_rules(case: tuple[str, int, str, datetime], in_zone: bool) -> None:
    expression, days, zone_name, t = case
    zone = ZoneInfo(zone_name)
    sched = parse_schedule(expression, zone_name)
    wall = t.astimezone(zone).replace(tzinfo=None)
    reference = _reference_boundaries(
        expression, zone, wall - timedelta(days=days + 1), wall + timedelta(days=days + 1)
    )
    expected_next = min(b for b in reference if b > t)
    expected_latest = max(b for b in reference if b <= t)
    given_t = t.astimezone(zone) if in_zone else t  # any zone in, same answer
    assert sched.next_after(given_t) == expected_next
    assert sched.latest_at_or_before(given_t) == expected_latest


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_cron_consistency_laws(case: tuple[str, int, str, datetime]) -> None:
    expression, _, zone_name, t = case
    sched = parse_schedule(expression, zone_name)
    nxt = sched.next_after(t)
    assert nxt > t
    assert nxt.tzinfo is UTC
    assert sched.latest_at_or_before(nxt) == nxt
    assert sched.latest_at_or_before(nxt - ONE_US) == sched.latest_at_or_before(t)
    latest = sched.latest_at_or_before(t)
    assert latest is not None
    assert latest <= t < sched.next_after(latest)
    assert sched.next_after(latest) == nxt
    # Successive boundaries strictly increase and never repeat.
    chain = [nxt]
    for _ in range(5):
        chain.append(sched.next_after(chain[-1]))
    assert chain == sorted(set(chain))
    assert all(sched.latest_at_or_before(b) == b for b in chain)


@settings(max_examples=100, deadline=None)
@given(
    spec=st.sampled_from(["@every 30s", "@every 1h30m", "@every 7m", "@every 1d", "@every 13s"]),
    zone_name=st.sampled_from(ZONES),
    t=instants("UTC"),
)
def test_every_consistency_laws(spec: str, zone_name: str, t: datetime) -> None:
    sched = parse_schedule(spec, zone_name)
    nxt = sched.next_after(t)
    latest = sched.latest_at_or_before(t)
    assert latest is not None
    assert latest <= t < nxt == sched.next_after(latest)
    assert sched.latest_at_or_before(nxt) == nxt
    assert nxt.tzinfo is UTC
    assert latest.tzinfo is UTC


def test_sparse_specs_go_back_far_enough() -> None:
    leap = parse_schedule("0 0 29 2 *", NY)
    assert leap.latest_at_or_before(utc(2028, 2, 29, 4)) == utc(2024, 2, 29, 5)
    assert leap.next_after(utc(2096, 2, 29, 5)) == utc(2104, 2, 29, 5)  # 2100 is no leap year
    sunday_leap = parse_schedule("0 0 29 2 */7")  # Feb 29 AND Sunday: 2004, 2032, 2060
    assert sunday_leap.next_after(utc(2004, 2, 29)) == utc(2032, 2, 29)
    assert sunday_leap.latest_at_or_before(utc(2032, 2, 28)) == utc(2004, 2, 29)


def test_latest_is_none_before_any_boundary_in_reach() -> None:
    # Nothing before year 1.
    assert parse_schedule("0 0 29 2 */7").latest_at_or_before(utc(1, 6, 1)) is None
    assert parse_schedule("@every 100d").latest_at_or_before(utc(1, 1, 1)) is None
