"""How the dashboard shows values: times, ages, payloads and results, and
the throughput series its charts draw. Plain text out: the templates
escape it (Jinja2's autoescape)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from alkstore.contract.job import Job

#: The most characters of a payload a list shows.
PREVIEW_WIDTH = 160
#: The most bytes of a binary payload a job page shows as hex.
HEX_BYTES = 4096
#: The most bytes of a binary payload a job page shows as base64, and the
#: most characters of a JSON one it shows pretty-printed: a page refreshes
#: every few seconds, and a payload may be 64 MiB (``alkstore job ID
#: --json`` prints one whole).
SHOWN_MAX = 256 * 1024
#: A list decodes a payload for its one-line preview only up to this size;
#: a bigger one shows the start of its bytes.
PREVIEW_DECODE_MAX = 64 * 1024
#: The minutes a throughput chart covers.
CHART_MINUTES = 60


def when(value: datetime | None) -> str:
    """``2026-12-05 22:53:46Z``, or ``-``."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def iso(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).isoformat(timespec="seconds")


def span(seconds: float) -> str:
    """A duration for people: ``45 s``, ``12 min``, ``3 h``, ``2 d``."""
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def relative(value: datetime | None, now: datetime) -> str:
    """``3 s ago`` or ``in 5 min``; empty for none."""
    if value is None:
        return ""
    delta = (value - now).total_seconds()
    return f"in {span(delta)}" if delta > 0.5 else f"{span(delta)} ago"


def first_line(text: str | None, width: int = PREVIEW_WIDTH) -> str:
    """The first line of ``text``, cut at ``width`` with an ellipsis."""
    if not text:
        return ""
    lines = text.splitlines()
    first = lines[0] if lines else ""
    more = bool(text[len(first) :].strip())
    if len(first) > width:
        return first[: width - 1] + "\u2026"
    return first + "\u2026" if more else first


def _decoded(job: Job) -> tuple[bool, Any]:
    try:
        return True, job.payload
    except Exception:  # a payload this version cannot decode: show its bytes
        return False, job.payload_bytes


def preview(job: Job) -> str:
    """The payload on one line, cut at :data:`PREVIEW_WIDTH`."""
    if len(job.payload_bytes) > PREVIEW_DECODE_MAX:
        start = job.payload_bytes[: PREVIEW_WIDTH * 4].decode("utf-8", "replace")
        return first_line(f"{len(job.payload_bytes)} bytes: {start}")
    ok, value = _decoded(job)
    if isinstance(value, bytes):
        head = value[:16].hex(" ")
        return f"{len(value)} bytes: {head}" + (" \u2026" if len(value) > 16 else "")
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return first_line(text) if ok else text


def one_line_json(value: Any) -> str:
    """A JSON value on one line, cut at :data:`PREVIEW_WIDTH`; bytes as hex."""
    if isinstance(value, bytes):
        return f"{len(value)} bytes: {value[:16].hex(' ')}"
    return first_line(json.dumps(value, ensure_ascii=False, separators=(", ", ": ")))


@dataclass(frozen=True)
class Shown:
    """A value as a job page shows it: its kind and the text blocks."""

    kind: str  # "json", "bytes" or "none"
    text: str
    base64: str = ""
    size: int = 0


def show(value: Any) -> Shown:
    """A payload or result: JSON pretty-printed; bytes as hex (the first
    :data:`HEX_BYTES`) and base64."""
    if isinstance(value, bytes):
        lines = [
            f"{offset:08x}  {value[offset : offset + 16].hex(' ')}"
            for offset in range(0, min(len(value), HEX_BYTES), 16)
        ]
        if len(value) > HEX_BYTES:
            lines.append(f"\u2026 {len(value) - HEX_BYTES} more bytes")
        shown = base64.b64encode(value[:SHOWN_MAX]).decode()
        if len(value) > SHOWN_MAX:
            shown += f"\n\u2026 {len(value) - SHOWN_MAX} more bytes"
        return Shown("bytes", "\n".join(lines), shown, len(value))
    text = json.dumps(value, indent=2, ensure_ascii=False)
    if len(text) > SHOWN_MAX:
        text = text[:SHOWN_MAX] + f"\n\u2026 {len(text) - SHOWN_MAX} more characters"
    return Shown("json", text)


def show_payload(job: Job) -> Shown:
    return show(_decoded(job)[1])


def show_result(job: Job) -> Shown:
    if job.result_bytes is None:
        return Shown("none", "")
    try:
        return show(job.result)
    except Exception:
        return show(job.result_bytes)


def state_of(job: Job, now: datetime) -> str:
    """The job's state as the dashboard lists them: a pending job not due
    yet is ``scheduled``; a processing one past its claim deadline is
    ``lapsed`` (its worker died or stalled; the next claim takes it back).
    """
    if job.state == "pending" and job.run_at > now:
        return "scheduled"
    if job.state == "processing" and job.claim_deadline is not None and job.claim_deadline <= now:
        return "lapsed"
    return job.state


@dataclass(frozen=True)
class Throughput:
    """One queue's last hour, a minute a column, oldest first."""

    start: datetime
    completed: list[int]
    retried: list[int]
    dead: list[int]

    @property
    def totals(self) -> tuple[int, int, int]:
        return sum(self.completed), sum(self.retried), sum(self.dead)

    def rows(self) -> list[tuple[datetime, int, int, int]]:
        """The minutes with any outcome, for the table beside the chart."""
        return [
            (self.start + timedelta(minutes=i), c, r, d)
            for i, (c, r, d) in enumerate(zip(self.completed, self.retried, self.dead, strict=True))
            if c or r or d
        ]

    def as_json(self) -> str:
        """What the chart script reads (a data attribute, escaped there)."""
        return json.dumps(
            {
                "start": iso(self.start),
                "step_s": 60,
                "completed": self.completed,
                "retried": self.retried,
                "dead": self.dead,
            },
            separators=(",", ":"),
        )


def throughput(points: Sequence[Any], now: datetime) -> Throughput:
    """The dense last :data:`CHART_MINUTES` minutes from the store's
    :class:`~alkstore.ThroughputPoint` list (only minutes with counts)."""
    end = now.astimezone(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(minutes=CHART_MINUTES - 1)
    completed = [0] * CHART_MINUTES
    retried = [0] * CHART_MINUTES
    dead = [0] * CHART_MINUTES
    for point in points:
        index = int((point.minute - start).total_seconds() // 60)
        if 0 <= index < CHART_MINUTES:
            completed[index] += point.completed
            retried[index] += point.retried
            dead[index] += point.dead
    return Throughput(start, completed, retried, dead)
