"""What an engine author builds on: the primitives' argument types and the
helpers every engine shares. Application code does not need this module.

With it, the thread primitives (``Lock``, ``Event``, ``Condition``,
``Spawned``, ``spawn``, ``join``, ``sleep``, ``wait_event``) whose asyncio
twins :mod:`alkstore.engine_async` gives, for an engine whose sync modules
are generated from async sources by ``tools/async_to_sync.py``, as the
PostgreSQL engine's are (:mod:`alkstore._acompat` defines them).

See ``docs/engine-authors.md`` for the walk-through.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from alkstore import _acompat
from alkstore._acompat import *  # noqa: F403 (the thread side of the pairs, re-exported)
from alkstore.contract.handle import FAILED, MAX_ATTEMPTS_EXCEEDED
from alkstore.contract.job import JOB_FIELDS, job_from_values
from alkstore.contract.latch import WakeLatch
from alkstore.contract.schedule import (
    SCHEDULE_COLUMNS,
    Schedule,
    UnreadableSchedule,
    read_schedule,
    schedule_from_values,
    schedule_to_values,
)
from alkstore.errors import SchemaVersionError, ValidationError
from alkstore.logic.codec import EncodedPayload, decode_payload
from alkstore.logic.duration import duration, duration_us
from alkstore.logic.redact import redact_url
from alkstore.logic.resolution import Resolved
from alkstore.logic.validation import duration_s, int_in_range

__all__ = [
    "COMMON_OPTIONS",
    "EXPIRED",
    "FAILED",
    "JOB_FIELDS",
    "MAX_ATTEMPTS_EXCEEDED",
    "SCHEDULE_COLUMNS",
    "EncodedPayload",
    "Resolved",
    "Schedule",
    "UnreadableSchedule",
    "WakeLatch",
    "check_engine_options",
    "check_schema_version",
    "decode_payload",
    "duration",
    "duration_s",
    "duration_us",
    "int_in_range",
    "job_from_values",
    "read_schedule",
    "redact_url",
    "schedule_from_values",
    "schedule_to_values",
]
# The thread sides of the pairs (alkstore._acompat).
__all__ += _acompat.__all__

#: ``last_error`` of a job that ``sweep_expired`` moved to the dead table.
EXPIRED = "expired"
#: Engine options every engine accepts (docs/contract.md §2).
COMMON_OPTIONS = frozenset({"clock", "rng", "migrate"})


def check_engine_options(options: Mapping[str, object], own: Iterable[str] = ()) -> None:
    """Refuse engine options that neither docs/contract.md §2 nor the engine defines.

    Raises
    ------
    ValidationError
        Naming the unknown options and the accepted ones.
    """
    allowed = COMMON_OPTIONS | set(own)
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValidationError(
            f"unknown engine option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(allowed))}"
        )
    if not isinstance(options.get("migrate", True), bool):
        raise ValidationError("migrate must be a bool")


def check_schema_version(
    found: int | None, code: int, *, migrating: bool, where: str = "the database"
) -> None:
    """Apply docs/contract.md §3 "Schema" to the version found in the database.

    Parameters
    ----------
    found
        The stored schema version, ``None`` when there is no schema.
    code
        The newest version this engine's code knows.
    migrating
        Whether the caller is about to migrate (``migrate=True``).
    where
        What was opened, for the message: the database file, or the
        schema and database.

    Raises
    ------
    SchemaVersionError
        If ``found`` is newer than ``code``, or missing while not migrating;
        its ``found`` and ``expected`` are the two versions.
    """
    if found is not None and found > code:
        raise SchemaVersionError(
            f"the alkstore schema of {where} is version {found}, newer than this "
            f"code's {code}; upgrade alkstore",
            found=found,
            expected=code,
        )
    if found is None and not migrating:
        raise SchemaVersionError(
            f"{where} has no alkstore schema yet: create it with `alkstore migrate` "
            "(with the same --url or --app) or alkstore.open(url, migrate=True)",
            expected=code,
        )
