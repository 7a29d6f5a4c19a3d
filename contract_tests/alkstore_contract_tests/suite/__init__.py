"""The contract suite's topic classes and their aggregate,
:class:`ContractSuite`.

Engines subclass :class:`ContractSuite` (never the topic classes one by
one), so a contract test added in a later release reaches every engine on
upgrade -- the lesson of SQLAlchemy's one-import suite over fsspec's
hand-listed test areas.
"""

from __future__ import annotations

from alkstore_contract_tests.suite.async_runtime import AsyncRuntimeTests
from alkstore_contract_tests.suite.async_surface import (
    AsyncConcurrencyTests,
    AsyncLoopTests,
    AsyncStatefulTests,
    AsyncSurfaceTests,
    AsyncTransactionalTests,
)
from alkstore_contract_tests.suite.async_worker import AsyncWorkerTests
from alkstore_contract_tests.suite.cases import HandedCaseTests
from alkstore_contract_tests.suite.claim import ClaimTests, HandleValidityTests
from alkstore_contract_tests.suite.completed import CompletedJobTests
from alkstore_contract_tests.suite.concurrency import (
    ForkTests,
    ProcessConcurrencyTests,
    ThreadConcurrencyTests,
)
from alkstore_contract_tests.suite.enqueue import IdTests, OptionResolutionTests, TimeTests
from alkstore_contract_tests.suite.handle_ops import (
    DeadLetterTests,
    FailTests,
    HeartbeatTests,
    ReleaseTests,
    RetryTests,
)
from alkstore_contract_tests.suite.lifecycle import ClosedStoreTests, EngineOptionTests, SchemaTests
from alkstore_contract_tests.suite.moves import AtomicMoveTests
from alkstore_contract_tests.suite.operations import (
    DeadLetterOpsTests,
    PauseTests,
    QueueNamesTests,
    RunNowTests,
)
from alkstore_contract_tests.suite.outbox import OutboxTests
from alkstore_contract_tests.suite.payload import ErrorTextTests, PayloadTests
from alkstore_contract_tests.suite.queue_ops import (
    AckBatchTests,
    AckManyTests,
    CancelTests,
    GetJobTests,
    IsolationTests,
    StatsTests,
    SweepTests,
)
from alkstore_contract_tests.suite.schedules import (
    SchedulerConcurrencyTests,
    ScheduleTests,
    SweeperTests,
)
from alkstore_contract_tests.suite.stateful import StatefulTests
from alkstore_contract_tests.suite.transactional import TransactionalEnqueueTests
from alkstore_contract_tests.suite.unique import UniqueKeyConcurrencyTests, UniqueKeyTests
from alkstore_contract_tests.suite.validation import ValidationTests
from alkstore_contract_tests.suite.wake import WakeTests
from alkstore_contract_tests.suite.worker import WorkerTests
from alkstore_contract_tests.suite.workers import (
    JobListingTests,
    ThroughputTests,
    WorkersRegistryTests,
)

__all__ = [
    "TOPICS",
    "AckBatchTests",
    "AckManyTests",
    "AsyncConcurrencyTests",
    "AsyncLoopTests",
    "AsyncRuntimeTests",
    "AsyncStatefulTests",
    "AsyncSurfaceTests",
    "AsyncTransactionalTests",
    "AsyncWorkerTests",
    "AtomicMoveTests",
    "CancelTests",
    "ClaimTests",
    "ClosedStoreTests",
    "CompletedJobTests",
    "ContractSuite",
    "DeadLetterOpsTests",
    "DeadLetterTests",
    "EngineOptionTests",
    "ErrorTextTests",
    "FailTests",
    "GetJobTests",
    "HandedCaseTests",
    "HandleValidityTests",
    "HeartbeatTests",
    "ReleaseTests",
    "IdTests",
    "IsolationTests",
    "JobListingTests",
    "OptionResolutionTests",
    "OutboxTests",
    "PauseTests",
    "PayloadTests",
    "ForkTests",
    "ProcessConcurrencyTests",
    "QueueNamesTests",
    "RetryTests",
    "RunNowTests",
    "ScheduleTests",
    "SchedulerConcurrencyTests",
    "SchemaTests",
    "StatefulTests",
    "StatsTests",
    "SweepTests",
    "SweeperTests",
    "ThreadConcurrencyTests",
    "ThroughputTests",
    "TimeTests",
    "TransactionalEnqueueTests",
    "UniqueKeyConcurrencyTests",
    "UniqueKeyTests",
    "ValidationTests",
    "WakeTests",
    "WorkerTests",
    "WorkersRegistryTests",
]


class ContractSuite(
    OptionResolutionTests,
    IdTests,
    TimeTests,
    ValidationTests,
    PayloadTests,
    ErrorTextTests,
    ClaimTests,
    HandleValidityTests,
    RetryTests,
    FailTests,
    HeartbeatTests,
    ReleaseTests,
    DeadLetterTests,
    AckBatchTests,
    AckManyTests,
    CancelTests,
    GetJobTests,
    CompletedJobTests,
    SweepTests,
    StatsTests,
    IsolationTests,
    WakeTests,
    TransactionalEnqueueTests,
    UniqueKeyTests,
    PauseTests,
    DeadLetterOpsTests,
    RunNowTests,
    QueueNamesTests,
    JobListingTests,
    WorkersRegistryTests,
    ThroughputTests,
    ScheduleTests,
    SweeperTests,
    OutboxTests,
    ClosedStoreTests,
    EngineOptionTests,
    SchemaTests,
    HandedCaseTests,
    ThreadConcurrencyTests,
    UniqueKeyConcurrencyTests,
    AtomicMoveTests,
    ProcessConcurrencyTests,
    ForkTests,
    SchedulerConcurrencyTests,
    StatefulTests,
    WorkerTests,
    AsyncWorkerTests,
    AsyncSurfaceTests,
    AsyncLoopTests,
    AsyncConcurrencyTests,
    AsyncTransactionalTests,
    AsyncStatefulTests,
    AsyncRuntimeTests,
):
    """The whole alkstore contract (docs/contract.md §2, §3, the regression cases, and
    the operations, schedules and outbox of docs/operations.md,
    docs/schedules.md and docs/outbox.md).

    Plug an engine in with one class in a test module::

        from alkstore_contract_tests import ContractSuite
        from my_engine_tests.harness import MyHarness

        class TestMyEngineContract(ContractSuite, MyHarness):
            pass

    where ``MyHarness`` subclasses :class:`~alkstore_contract_tests.EngineHarness`
    and overrides its ``alkstore_target`` fixture. Optional harness
    capabilities (``app_connection``, ``dead_letter_inserts_fail``,
    ``spawned_processes_can_open``, ``stores_survive_fork``) enable the tests that need them; the
    rest skip with a reason.

    The ``Async...Tests`` run the same contract through the async surface
    (:func:`alkstore.open_async` on the same target; docs/async.md), so an
    engine with only sync primitives is tested through the core's thread
    adapter, and one with native async primitives through its own.

    Tests marked ``slow`` (processes, the state machines, case 003) run by
    default; deselect them with ``-m "not slow"`` for a quick loop.
    """


#: Every topic class, in the order :class:`ContractSuite` mixes them.
TOPICS: tuple[type, ...] = ContractSuite.__bases__
