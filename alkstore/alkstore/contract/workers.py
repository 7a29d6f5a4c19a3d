"""What the store knows of the workers serving it: :class:`WorkerInfo`, the
workers registry's record, and :class:`ThroughputPoint`, one minute of a
queue's outcomes as the workers report them (docs/contract.md §11 "Workers
registry" and "Throughput").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import NamedTuple

from alkstore.errors import ValidationError
from alkstore.logic import validation as v

__all__ = [
    "MAX_RUNNING_IDS",
    "MAX_WORKER_TTL_S",
    "ThroughputPoint",
    "WorkerInfo",
    "check_worker_info",
]

#: The longest silence a worker may ask to be listed through, seconds (a day).
MAX_WORKER_TTL_S = 86_400.0
#: The most running job ids one record keeps (a worker's concurrency is
#: bounded by its threads; a record is not a job log).
MAX_RUNNING_IDS = 10_000


@dataclass(frozen=True)
class WorkerInfo:
    """One worker as the registry records it (docs/contract.md §11
    "Workers registry"; Oban's and River's producer records).

    Attributes
    ----------
    id
        The worker id it claims with (``Worker.worker_id``).
    host, pid
        Where it runs.
    queues
        The queues it serves, in its own order.
    concurrency
        How many jobs it runs at once at most.
    started_at
        When it first recorded itself (UTC).
    last_seen_at
        When it last refreshed its record, by the store's clock (UTC); the
        store sets it on every :meth:`Store.register_worker`.
    running
        The ids of the jobs it was running at its last refresh, increasing.
    ttl_s
        Seconds of silence after ``last_seen_at`` past which the store no
        longer lists it (it died without saying so).
    """

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    started_at: datetime
    last_seen_at: datetime
    running: tuple[int, ...]
    ttl_s: float


class ThroughputPoint(NamedTuple):
    """One minute of a queue's finished jobs, summed over the workers that
    reported them (docs/contract.md §11 "Throughput").

    ``minute`` is the start of a UTC minute; ``completed``, ``retried`` and
    ``dead`` count jobs whose handler succeeded, raised and was retried, or
    was dead-lettered in that minute.
    """

    minute: datetime
    completed: int
    retried: int
    dead: int


def check_worker_info(info: object) -> WorkerInfo:
    """Check a :class:`WorkerInfo` handed to ``register_worker``; return it
    with ``running`` sorted.

    Raises
    ------
    ValidationError
        For anything but a ``WorkerInfo``, or a field outside its rules: an
        invalid worker id or queue name, an empty or over-255-character
        host, a pid or concurrency below 1, a naive ``started_at``, more
        than :data:`MAX_RUNNING_IDS` running ids or an id out of range, a
        ``ttl_s`` outside ``(0, MAX_WORKER_TTL_S]``.
    """
    if not isinstance(info, WorkerInfo):
        raise ValidationError(f"expected a WorkerInfo, not {type(info).__name__}")
    v.worker_id(info.id)
    v.host_name(info.host)
    v.int_in_range(info.pid, "pid", 1, 2**31 - 1)
    given: object = info.queues
    if not isinstance(given, list | tuple):
        raise ValidationError("queues must be a tuple or list of queue names")
    queues = tuple(v.queue_name(name) for name in given)
    v.int_in_range(info.concurrency, "concurrency", 1, 2**31 - 1)
    started_at = v.aware_utc(info.started_at, "started_at")
    running_ids: object = info.running
    if not isinstance(running_ids, list | tuple) or len(running_ids) > MAX_RUNNING_IDS:
        raise ValidationError(f"running must be a sequence of at most {MAX_RUNNING_IDS} job ids")
    running = tuple(
        sorted(
            v.int_in_range(job_id, "running job id", -(2**63), 2**63 - 1) for job_id in running_ids
        )
    )
    ttl_s = v.duration_s(info.ttl_s, "ttl_s")
    if not 0 < ttl_s <= MAX_WORKER_TTL_S:
        raise ValidationError(f"ttl_s must be in (0, {MAX_WORKER_TTL_S:g}] seconds")
    return replace(info, queues=queues, started_at=started_at, running=running, ttl_s=ttl_s)
