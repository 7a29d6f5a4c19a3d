"""alkstore: durable background jobs without a broker.

Open a store with :func:`open` (embedded SQLite by default, PostgreSQL by
URL), take a :class:`Queue` with :meth:`Store.queue`, enqueue payloads and
claim them as :class:`JobHandle` objects; or register functions as tasks on an
:class:`App` and run them with a :class:`Worker` (``alkstore worker``). The
contract every engine keeps is docs/contract.md.
"""

from __future__ import annotations

from alkstore._app import App
from alkstore._backoff import Rng, backoff_ceiling_s, backoff_delay_s
from alkstore._clock import Clock
from alkstore._codec import MAX_NESTING, MAX_PAYLOAD_BYTES, decode_payload, encode_payload
from alkstore._handle import JobHandle
from alkstore._job import Job, JobState, QueueStats, SweepResult
from alkstore._options import QueueOpts
from alkstore._outbox import Outbox
from alkstore._outcome import Fail, Retry
from alkstore._queue import Queue
from alkstore._registry import DEFAULT_URL, open, register
from alkstore._resolution import enqueue_options, resolve
from alkstore._schedule import Schedule, UnreadableSchedule
from alkstore._scheduler import Scheduler
from alkstore._store import Store
from alkstore._subscription import Subscription
from alkstore._sweeper import Sweeper
from alkstore._task import Task
from alkstore._worker import Worker, WorkerCounts
from alkstore.errors import (
    AlkstoreError,
    EngineError,
    SchemaVersionError,
    StoreClosedError,
    UnknownEngineError,
    ValidationError,
)

__all__ = [
    "DEFAULT_URL",
    "MAX_NESTING",
    "MAX_PAYLOAD_BYTES",
    "AlkstoreError",
    "App",
    "Clock",
    "EngineError",
    "Fail",
    "Job",
    "JobHandle",
    "JobState",
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
    "Sweeper",
    "Task",
    "UnknownEngineError",
    "UnreadableSchedule",
    "ValidationError",
    "Worker",
    "WorkerCounts",
    "backoff_ceiling_s",
    "backoff_delay_s",
    "decode_payload",
    "encode_payload",
    "enqueue_options",
    "open",
    "register",
    "resolve",
]

__version__ = "0.1.0"
