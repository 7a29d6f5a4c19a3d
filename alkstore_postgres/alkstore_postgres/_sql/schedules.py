"""The statements of schedules (:mod:`alkstore_postgres._schedules`) and
the values they bind.

A schedule is stored as the flat columns of
:data:`alkstore.contract.schedule.SCHEDULE_COLUMNS` (the enqueue options as
one JSON text); firing a boundary is guarded by the row's ``revision`` and
``next_run_at``, under ``FOR UPDATE SKIP LOCKED`` (see
:mod:`alkstore_postgres._schedules`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from alkstore.engine import SCHEDULE_COLUMNS, Schedule, schedule_to_values
from alkstore_postgres._schema import Statement

__all__ = [
    "ADVANCE",
    "DELETE",
    "LIST_ALL",
    "LIST_DUE",
    "PUT",
    "SET_LAST_JOB",
    "SKIP",
    "guard_params",
    "put_params",
    "schedule_values",
]

_COLUMNS = sql.SQL(", ").join(map(sql.Identifier, SCHEDULE_COLUMNS))
_PLACEHOLDERS = sql.SQL(", ").join(sql.Placeholder(c) for c in SCHEDULE_COLUMNS)
# Replacing a schedule takes every column from the new value but the
# revision, which counts the replacements.
_REPLACE = sql.SQL(", ").join(
    sql.SQL("{0} = excluded.{0}").format(sql.Identifier(c))
    for c in SCHEDULE_COLUMNS
    if c not in ("name", "revision")
)
# Names sort by code point, as Python sorts them, whatever the collation.
_BY_NAME = sql.SQL('name COLLATE "C"')

_FRAGMENTS = {"columns": _COLUMNS, "by_name": _BY_NAME}

PUT = Statement(
    sql.SQL("""
    INSERT INTO {schedules} AS s ({columns}) VALUES ({values})
    ON CONFLICT (name) DO UPDATE SET {replace}, revision = s.revision + 1
    RETURNING {columns}
"""),
    values=_PLACEHOLDERS,
    replace=_REPLACE,
    **_FRAGMENTS,
)

DELETE = sql.SQL("DELETE FROM {schedules} WHERE name = %(name)s")

LIST_ALL = Statement(
    sql.SQL("SELECT {columns} FROM {schedules} ORDER BY {by_name}"),
    **_FRAGMENTS,
)

# The due end of schedules_due.
LIST_DUE = Statement(
    sql.SQL("""
    SELECT {columns} FROM {schedules}
    WHERE next_run_at <= %(due_at)s
    ORDER BY next_run_at, {by_name}
"""),
    **_FRAGMENTS,
)

# The exactly-once guard (module docstring): the row as the tick read it,
# locked only if no other transaction holds it.
_GUARD = """
    name = %(name)s AND revision = %(revision)s AND next_run_at = %(expected)s
    AND name IN (
        SELECT name FROM {schedules}
        WHERE name = %(name)s AND revision = %(revision)s AND next_run_at = %(expected)s
        FOR UPDATE SKIP LOCKED
    )
"""

ADVANCE = sql.SQL(
    "UPDATE {schedules} SET next_run_at = %(next_run_at)s, last_run_at = %(boundary)s WHERE"
    + _GUARD
)

SKIP = sql.SQL("UPDATE {schedules} SET next_run_at = %(next_run_at)s WHERE" + _GUARD)

# The row is locked by ADVANCE, in the same transaction.
SET_LAST_JOB = sql.SQL("UPDATE {schedules} SET last_job_id = %(job_id)s WHERE name = %(name)s")


def schedule_values(row: Sequence[Any]) -> list[Any]:
    """A stored row as the core's column values (instants in UTC)."""
    return [v.astimezone(UTC) if isinstance(v, datetime) else v for v in row]


def put_params(schedule: Schedule) -> dict[str, Any]:
    """:data:`PUT`'s parameters: the schedule's columns, at revision 1 if new."""
    params = dict(zip(SCHEDULE_COLUMNS, schedule_to_values(schedule), strict=True))
    params["revision"] = 1
    return params


def guard_params(schedule: Schedule, next_run_at: datetime) -> dict[str, Any]:
    """The parameters of the exactly-once guard (:data:`ADVANCE`,
    :data:`SKIP`): the row as the tick read it, and its next run."""
    return {
        "name": schedule.name,
        "revision": schedule.revision,
        "expected": schedule.next_run_at,
        "next_run_at": next_run_at,
    }
