"""docs/contract.md §3 "Backoff": equal-jitter exponential over whole seconds."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alkstore import backoff_ceiling_s, backoff_delay_s

caps = st.integers(0, 3600)
bases = st.integers(0, 10**9)


def reference_ceiling(attempt: int, base: int, cap: int) -> int:
    # The contract's formula with Python's unbounded ints (only for small attempts).
    return min(cap, base * 2 ** (attempt - 1))


@given(attempt=st.integers(1, 200), base=bases, cap=caps)
def test_ceiling_matches_the_formula(attempt: int, base: int, cap: int) -> None:
    assert backoff_ceiling_s(attempt, base, cap) == reference_ceiling(attempt, base, cap)


@given(attempt=st.integers(1, 10**6), base=bases, cap=caps, seed=st.integers(0, 2**32))
def test_delay_is_a_whole_number_in_the_equal_jitter_range(
    attempt: int, base: int, cap: int, seed: int
) -> None:
    exp = reference_ceiling(min(attempt, 64), base, cap)
    delay = backoff_delay_s(attempt, base, cap, random.Random(seed))
    assert type(delay) is int
    assert math.ceil(exp / 2) <= delay <= exp
    assert delay <= 3600


@given(attempt=st.integers(13, 10**6), base=st.integers(1, 10**9))
def test_large_attempts_reach_the_cap(attempt: int, base: int) -> None:
    assert backoff_ceiling_s(attempt, base, 3600) == 3600


def test_attempt_counts_far_past_any_integer_width_stay_cheap() -> None:
    # 2 ** (10**12) cannot be computed at all, so a naive formula never
    # returns here: the shift must be bounded.
    assert backoff_ceiling_s(10**12, 1, 3600) == 3600
    assert backoff_delay_s(10**12, 0, 3600, random.Random(0)) == 0


@pytest.mark.parametrize("attempt", [1, 31, 63, 64, 1024, 1025, 10**6])
@pytest.mark.parametrize("base", [0, 1, 10**9])
def test_handed_case_003_direct_calls(attempt: int, base: int) -> None:
    delay = backoff_delay_s(attempt, base, 3600, random.Random(attempt))
    assert type(delay) is int
    assert 0 <= delay <= 3600
    if base == 0:
        assert delay == 0
    else:
        assert delay > 0
        assert math.ceil(reference_ceiling(min(attempt, 64), base, 3600) / 2) <= delay


def test_zero_ceiling_draws_nothing() -> None:
    class NoDraws:
        def randint(self, a: int, b: int) -> int:
            raise AssertionError("drew a random number for a zero delay")

    assert backoff_delay_s(5, 0, 3600, NoDraws()) == 0
    assert backoff_delay_s(5, 10, 0, NoDraws()) == 0


def test_the_draw_covers_both_ends_of_the_range() -> None:
    rng = random.Random(7)
    draws = {backoff_delay_s(3, 4, 3600, rng) for _ in range(400)}
    assert draws == set(range(8, 17))


def test_attempt_is_one_based() -> None:
    with pytest.raises(ValueError, match="1-based"):
        backoff_ceiling_s(0, 4, 3600)
