"""The fixtures and helpers every topic class of the suite shares.

Fixtures are defined on :class:`ContractFixtures`, the base of every topic
class, so an engine needs no conftest: subclassing :class:`ContractSuite`
together with its harness is the whole plug-in.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, Protocol

import pytest

from alkstore import Job, JobHandle, Queue, QueueOpts, Store
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests.harness import EngineHarness, StoreTarget

__all__ = [
    "ContractFixtures",
    "RecordingRng",
    "StoreFactory",
    "TickingClock",
    "assert_utc",
    "at",
    "claim_exactly",
    "job",
    "s",
]


class StoreFactory(Protocol):
    """The ``open_store`` fixture: open another store on the test's target.

    ``clock`` defaults to the test's :class:`ManualClock`; every store it
    opens is closed at teardown.
    """

    def __call__(self, **options: Any) -> Store: ...


class TickingClock:
    """A clock that moves one microsecond forward at every reading, so two
    readings are never equal: a test sees how many times a value was read."""

    def __init__(self, start: datetime = T0) -> None:
        self._next = start
        self._lock = threading.Lock()
        self.reads = 0

    def __call__(self) -> datetime:
        with self._lock:
            now = self._next
            self._next += timedelta(microseconds=1)
            self.reads += 1
            return now


class RecordingRng:
    """An ``rng=`` that records each ``randint(a, b)`` and answers ``b``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def randint(self, a: int, b: int) -> int:
        self.calls.append((a, b))
        return b


def s(seconds: float) -> timedelta:
    """``timedelta(seconds=seconds)``."""
    return timedelta(seconds=seconds)


def at(seconds: float) -> datetime:
    """The instant ``T0 + seconds``."""
    return T0 + timedelta(seconds=seconds)


def assert_utc(value: datetime | None) -> None:
    """docs/contract.md §2: every datetime alkstore returns is aware UTC."""
    if value is None:
        return
    assert isinstance(value, datetime), value
    assert value.tzinfo is not None, f"{value!r} is naive"
    assert value.utcoffset() == timedelta(0), f"{value!r} is not UTC"


def job(queue: Queue, job_id: int) -> Job:
    """``queue.get_job(job_id)``, asserting that it exists."""
    found = queue.get_job(job_id)
    assert found is not None, f"job {job_id} not found in {queue.name!r}"
    return found


def claim_exactly(queue: Queue, job_id: int, worker_id: str = "w") -> JobHandle:
    """Claim one job and assert that it is ``job_id``."""
    handle = queue.claim_one(worker_id)
    assert handle is not None, f"expected to claim job {job_id}, got nothing"
    assert handle.id == job_id, f"expected to claim job {job_id}, got {handle.id}"
    return handle


class ContractFixtures(EngineHarness):
    """Fixtures shared by every topic class (all function-scoped).

    ``clock``
        A :class:`ManualClock` at ``T0`` (2030-01-01T00:00:00Z).
    ``store``
        A store on the test's fresh target, with ``clock=clock``.
    ``open_store``
        A factory for more stores on the same target (own connections; for
        multi-store and multi-thread tests).
    ``queue``
        ``store.queue("jobs")`` with default :class:`QueueOpts`: visibility
        timeout 30 s, 5 attempts, priority 0, backoff base 4 s, cap 3600 s,
        no expiry, dead letters kept forever. Empty.
    """

    @pytest.fixture
    def clock(self) -> ManualClock:
        """A :class:`ManualClock` standing at ``T0``."""
        return ManualClock(T0)

    @pytest.fixture(name="open_store")
    def open_store_factory(
        self, alkstore_target: StoreTarget, clock: ManualClock
    ) -> Iterator[StoreFactory]:
        """A factory opening stores on the test's target (``clock=clock``
        unless given); closes each at teardown."""
        opened: list[Store] = []

        def factory(**options: Any) -> Store:
            options.setdefault("clock", clock)
            store = self.open_store(alkstore_target, **options)
            opened.append(store)
            return store

        yield factory
        for store in opened:
            store.close()

    @pytest.fixture
    def store(self, open_store: StoreFactory) -> Store:
        """A store on an empty target, with the test's ``clock`` and a seeded
        ``rng`` (``random.Random(0)``)."""
        return open_store(rng=random.Random(0))

    @pytest.fixture
    def queue(self, store: Store) -> Queue:
        """The empty queue ``"jobs"`` with default options."""
        return store.queue("jobs", QueueOpts())
