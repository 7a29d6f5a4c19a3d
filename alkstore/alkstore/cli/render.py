"""How the command prints: tables, instants, and jobs as JSON-ready fields."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from alkstore.contract.job import Job


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a newline, an
    escape sequence's ESC) written as its Python escape, so a stored value
    (a worker id, an error) can neither forge a row nor drive the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = [list(map(printable, header)), *(list(map(printable, row)) for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def when(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    return value


def job_fields(job: Job) -> dict[str, Any]:
    # The decoded payload and result stand where their bytes are in the dataclass.
    decoded = {"payload_bytes": "payload", "result_bytes": "result"}
    names = [decoded.get(f.name, f.name) for f in dataclasses.fields(job)]
    fields = {name: getattr(job, name) for name in names}
    return {name: jsonable(value) for name, value in fields.items()}
