"""Shared helpers for the benchmarks: timing and the printed table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["Row", "Table", "percentile", "rate"]


def rate(count: int, run: Callable[[], object]) -> float:
    """Run ``run`` once and return ``count`` divided by its wall time (per second)."""
    start = time.perf_counter()
    run()
    return count / (time.perf_counter() - start)


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``samples``, by the inclusive method."""
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[max(0, min(98, int(q) - 1))]


@dataclass
class Row:
    """One measured scenario: figures per system, and the target verdict."""

    scenario: str
    unit: str
    figures: dict[str, float] = field(default_factory=dict)
    target: str = ""
    verdict: str = ""


@dataclass
class Table:
    """Rows printed as one aligned table, systems as columns."""

    title: str
    systems: list[str]
    rows: list[Row] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def render(self) -> str:
        head = ["scenario", "unit", *self.systems, "target", "verdict"]
        body = [
            [
                r.scenario,
                r.unit,
                *(_fmt(r.figures.get(s)) for s in self.systems),
                r.target,
                r.verdict,
            ]
            for r in self.rows
        ]
        widths = [max(len(str(c)) for c in col) for col in zip(head, *body, strict=True)]
        lines = [self.title, ""]
        for cells in [head, ["-" * w for w in widths], *body]:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)))
        return "\n".join(lines)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"
