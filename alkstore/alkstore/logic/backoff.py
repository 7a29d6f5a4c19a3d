"""The retry backoff curve (docs/contract.md §3 "Backoff").

Equal-jitter exponential backoff over whole seconds: with ``attempt`` the
job's post-claim attempt count (1-based)::

    exp   = min(cap, base * 2 ** (attempt - 1))
    delay = uniform integer in [ceil(exp / 2), exp]     (0 when exp is 0)

The random source is passed in, so the draw is reproducible in tests.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Rng", "backoff_delay_s", "backoff_ceiling_s"]

# Doubling past this many times exceeds any allowed cap (2**12 > 3600) for
# every base >= 1, so the shift is bounded: no big ints, constant time.
_MAX_SHIFT = 12


class Rng(Protocol):
    """A random source with ``random.Random``'s ``randint``."""

    def randint(self, a: int, b: int) -> int: ...


def backoff_ceiling_s(attempt: int, base_s: int, cap_s: int) -> int:
    """Return ``min(cap_s, base_s * 2 ** (attempt - 1))`` in constant time.

    Parameters
    ----------
    attempt
        The post-claim attempt count, ``>= 1``.
    base_s, cap_s
        The row's stamped backoff base and cap, whole seconds ``>= 0``.
    """
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    return min(cap_s, base_s << min(attempt - 1, _MAX_SHIFT))


def backoff_delay_s(attempt: int, base_s: int, cap_s: int, rng: Rng) -> int:
    """Draw the delay in whole seconds before a retried job runs again.

    Parameters
    ----------
    attempt
        The post-claim attempt count, ``>= 1``.
    base_s, cap_s
        The row's stamped backoff base and cap, whole seconds ``>= 0``.
    rng
        The store's random source.

    Returns
    -------
    int
        A whole number of seconds in ``[ceil(exp/2), exp]``, ``exp`` as in
        :func:`backoff_ceiling_s`; ``0`` when ``exp`` is 0.
    """
    ceiling = backoff_ceiling_s(attempt, base_s, cap_s)
    if ceiling == 0:
        return 0
    return rng.randint((ceiling + 1) // 2, ceiling)
