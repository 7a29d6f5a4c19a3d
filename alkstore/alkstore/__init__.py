"""alkstore: durable background jobs without a broker.

Open a store with :func:`open` (embedded SQLite by default, PostgreSQL by
URL), take a :class:`Queue` with :meth:`Store.queue`, enqueue payloads and
claim them as :class:`JobHandle` objects; or register functions as tasks on
an :class:`App` and run them with a :class:`Worker` (``alkstore worker``),
which hands a task registered with ``takes_context=True`` its
:class:`JobContext`.
:func:`open_async` gives the same contract to asyncio code
(:class:`AsyncStore`, docs/async.md), and :class:`AsyncOutbox`,
:class:`AsyncScheduler` and :class:`AsyncSweeper` the runtime's async forms
(imported on first use, so that ``import alkstore`` imports no asyncio). The
contract every engine keeps is docs/contract.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alkstore.contract.handle import JobHandle
from alkstore.contract.handle_async import AsyncJobHandle
from alkstore.contract.job import Job, JobState, ListedState, QueueStats, SweepResult
from alkstore.contract.queue import Queue
from alkstore.contract.queue_async import AsyncQueue
from alkstore.contract.registry import DEFAULT_URL, open, open_async, register
from alkstore.contract.schedule import Schedule, UnreadableSchedule
from alkstore.contract.store import Store
from alkstore.contract.store_async import AsyncStore
from alkstore.contract.subscription import Subscription
from alkstore.contract.subscription_async import AsyncSubscription
from alkstore.contract.vacuum import HorizonHolder, TableVacuum, VacuumReport, VacuumReporting
from alkstore.contract.workers import ThroughputPoint, WorkerInfo
from alkstore.errors import (
    AlkstoreError,
    EngineError,
    SchemaVersionError,
    StoreClosedError,
    UnknownEngineError,
    ValidationError,
)
from alkstore.logic.backoff import Rng, backoff_ceiling_s, backoff_delay_s
from alkstore.logic.clock import Clock
from alkstore.logic.codec import MAX_NESTING, MAX_PAYLOAD_BYTES, decode_payload, encode_payload
from alkstore.logic.options import QueueOpts
from alkstore.logic.resolution import enqueue_options, resolve
from alkstore.runtime.app import App
from alkstore.runtime.context import JobContext
from alkstore.runtime.outbox import Outbox
from alkstore.runtime.outcome import Fail, Retry
from alkstore.runtime.scheduler import Scheduler
from alkstore.runtime.sweeper import Sweeper
from alkstore.runtime.task import Task
from alkstore.runtime.worker import Worker, WorkerCounts

if TYPE_CHECKING:
    from alkstore.runtime.outbox_async import AsyncOutbox
    from alkstore.runtime.scheduler_async import AsyncScheduler
    from alkstore.runtime.sweeper_async import AsyncSweeper

__all__ = [
    "DEFAULT_URL",
    "MAX_NESTING",
    "MAX_PAYLOAD_BYTES",
    "AlkstoreError",
    "App",
    "AsyncJobHandle",
    "AsyncOutbox",
    "AsyncQueue",
    "AsyncScheduler",
    "AsyncStore",
    "AsyncSubscription",
    "AsyncSweeper",
    "Clock",
    "EngineError",
    "Fail",
    "HorizonHolder",
    "Job",
    "JobContext",
    "JobHandle",
    "JobState",
    "ListedState",
    "Outbox",
    "Queue",
    "QueueOpts",
    "QueueStats",
    "Retry",
    "Rng",
    "Schedule",
    "Scheduler",
    "SchemaVersionError",
    "Store",
    "StoreClosedError",
    "Subscription",
    "SweepResult",
    "TableVacuum",
    "Sweeper",
    "Task",
    "ThroughputPoint",
    "UnknownEngineError",
    "UnreadableSchedule",
    "VacuumReport",
    "VacuumReporting",
    "ValidationError",
    "Worker",
    "WorkerCounts",
    "WorkerInfo",
    "backoff_ceiling_s",
    "backoff_delay_s",
    "decode_payload",
    "encode_payload",
    "enqueue_options",
    "open",
    "open_async",
    "register",
    "resolve",
]

__version__ = "0.1.0"

#: The runtime's async classes, by name: their modules import asyncio.
_ASYNC_RUNTIME = {
    "AsyncOutbox": "alkstore.runtime.outbox_async",
    "AsyncScheduler": "alkstore.runtime.scheduler_async",
    "AsyncSweeper": "alkstore.runtime.sweeper_async",
}


def __getattr__(name: str) -> Any:
    """Import the runtime's async classes on first use (PEP 562)."""
    module = _ASYNC_RUNTIME.get(name)
    if module is None:
        raise AttributeError(f"module 'alkstore' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
