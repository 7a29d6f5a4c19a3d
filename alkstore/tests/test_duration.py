"""D26: one rounding rule for every duration."""

from __future__ import annotations

from datetime import timedelta

import pytest

from alkstore.engine import duration, duration_us


@pytest.mark.parametrize(
    ("seconds", "micros"),
    [
        (2.5e-6, 2),  # halves go to even
        (3.5e-6, 4),
        (1.7e-6, 2),
        (30.0000005, 30_000_000),
        # seconds * 1e6 is a half in binary; timedelta(seconds=) rounds the
        # exact value, just below it, to 18,034,063 and 4,105,719.
        (18.0340635, 18_034_064),
        (4.1057185, 4_105_718),
        (0.0, 0),
        (86_400.0, 86_400_000_000),
    ],
)
def test_durations_round_the_product_half_to_even(seconds: float, micros: int) -> None:
    assert duration_us(seconds) == micros
    assert duration(seconds) == timedelta(microseconds=micros)


def test_a_timedelta_keeps_its_microseconds() -> None:
    span = timedelta(days=36_500, microseconds=123_457)
    assert duration(span.total_seconds()) == span
