"""A hypothesis state machine: random operation sequences against the engine
and :mod:`alkstore_contract_tests.model`, compared after every step.

Runtime is modest by default (50 examples of up to 30 steps); raise it with
``ALKSTORE_STATEFUL_EXAMPLES`` and ``ALKSTORE_STATEFUL_STEPS``. Every other
hypothesis setting (a registered profile, ``--hypothesis-seed``) applies as
usual.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from alkstore import Job, JobHandle, Queue, QueueOpts, Store, ValidationError
from alkstore.logic.codec import encode_result
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, StoreFactory
from alkstore_contract_tests.model import ModelHandle, ModelJob, ModelStore

__all__ = ["StatefulTests", "machine_for", "stateful_settings"]

#: The queue handles the machine acts through: one queue name ("main") with
#: differing opts, so stamps come from the enqueueing handle and decisions
#: from the row; and a second queue ("other") for isolation.
HANDLE_OPTS: dict[str, tuple[str, QueueOpts]] = {
    "main": ("main", QueueOpts(max_attempts=3, backoff_base_s=2, backoff_cap_s=10)),
    "short": (
        "main",
        QueueOpts(
            visibility_timeout_s=10,
            max_attempts=2,
            backoff_base_s=0,
            priority=1,
            expires_s=50,
            dead_letter_retention_s=0,
        ),
    ),
    "keep": (
        "main",
        QueueOpts(
            visibility_timeout_s=20,
            max_attempts=1,
            backoff_base_s=5,
            backoff_cap_s=5,
            dead_letter_retention_s=40,
            keep_completed_s=25,
        ),
    ),
    "other": ("other", QueueOpts(visibility_timeout_s=15, max_attempts=2, backoff_base_s=1)),
}
QUEUE_NAMES = ("main", "other")
JOB_FIELDS = [f.name for f in fields(Job) if f.name not in ("payload_bytes", "content_type")]

_via = st.sampled_from(sorted(HANDLE_OPTS))
_workers = st.sampled_from(["w1", "w2", "w3"])
_priority = st.none() | st.sampled_from([-1, 0, 1, 2])
_delay = st.none() | st.sampled_from([0, 5, 30, 45])
_max_attempts = st.none() | st.integers(1, 3)
_expires = st.none() | st.sampled_from([10, 40, 100])
_index = st.integers(0, 10_000)
#: ``run_at`` as an index into the instants where rows are due (or now):
#: jobs of one priority then often tie on ``run_at`` across the claim's
#: paths (a due job, one that came due, a reclaim), where only ``id``
#: orders them.
_tie = st.none() | _index
#: Few keys, so enqueues often meet a live holder (docs/contract.md §3 "Unique keys").
_key = st.none() | st.sampled_from(["k1", "k2"])
_invalid = st.booleans()

_run = itertools.count()


def stateful_settings() -> settings:
    """The machine's settings: modest by default, raised by environment."""
    return settings(
        max_examples=int(os.environ.get("ALKSTORE_STATEFUL_EXAMPLES", "50")),
        stateful_step_count=int(os.environ.get("ALKSTORE_STATEFUL_STEPS", "30")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def _describe(job: Job | ModelJob | None) -> dict[str, Any] | None:
    if job is None:
        return None
    return {name: getattr(job, name) for name in JOB_FIELDS}


class QueueMachine(RuleBasedStateMachine):
    """Drives one engine store and a :class:`ModelStore` side by side.

    Each example opens a fresh store (on the test's target) with a fresh
    :class:`ManualClock` at ``T0`` and uses queue names of its own, so
    examples do not see each other's rows.
    """

    open_store: Callable[..., Store]

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(T0)
        self.store = self.open_store(clock=self.clock, rng=random.Random(0))
        run = next(_run)
        self.names = {name: f"sm{run}-{name}" for name in QUEUE_NAMES}
        self.queues: dict[str, Queue] = {
            via: self.store.queue(self.names[name], opts)
            for via, (name, opts) in HANDLE_OPTS.items()
        }
        self.model = ModelStore()
        self.handles: list[tuple[JobHandle, ModelHandle]] = []
        self.ids: dict[int, str] = {}  # every id ever returned -> queue key

    def teardown(self) -> None:
        self.store.close()

    # -- helpers --------------------------------------------------------------

    def q(self, via: str) -> tuple[Queue, str]:
        """The engine queue handle and the model's queue name."""
        return self.queues[via], self.queues[via].name

    def pick_handle(self, index: int, invalid: bool) -> tuple[JobHandle, ModelHandle]:
        """A handle; with ``invalid``, preferably one whose job another claim
        has since taken over, else one whose claim is otherwise no longer
        valid (but that was never spent), so the sequences that probe handle
        validity are not left to chance."""
        pool = self.handles
        if invalid:
            now = self.clock()
            unspent = [(h, m) for h, m in pool if not m.spent]
            stale = [(h, m) for h, m in unspent if not self.model.valid_row(m, now)]
            taken_over = [
                (h, m)
                for h, m in stale
                if (row := self.model.live.get(m.job_id)) is not None
                and row.state == "processing"
                and row.attempts != m.attempts
            ]
            pool = taken_over or stale or pool
        return pool[index % len(pool)]

    def pick_ids(self, indexes: list[int]) -> list[int]:
        known = sorted(self.ids)
        return [known[i % len(known)] if known and i % 7 else 10**12 + i for i in indexes]

    # -- rules ----------------------------------------------------------------

    @initialize(
        jobs=st.lists(
            st.tuples(_via, _priority, _delay, _max_attempts, _expires), min_size=1, max_size=4
        )
    )
    def seed_jobs(
        self, jobs: list[tuple[str, int | None, int | None, int | None, int | None]]
    ) -> None:
        """Start every example with a few jobs, so claims have a choice."""
        for i, (via, priority, delay, max_attempts, expires) in enumerate(jobs):
            self.enqueue(
                via=via,
                count=1,
                many=False,
                payload=i,
                priority=priority,
                delay=delay,
                max_attempts=max_attempts,
                expires=expires,
                tie=None,
                key=None,
            )

    @rule(
        via=_via,
        count=st.integers(0, 3),
        many=st.booleans(),
        payload=st.integers(0, 999) | st.text(max_size=5),
        priority=_priority,
        delay=_delay,
        max_attempts=_max_attempts,
        expires=_expires,
        tie=_tie,
        key=_key,
    )
    def enqueue(
        self,
        *,
        via: str,
        count: int,
        many: bool,
        payload: Any,
        priority: int | None,
        delay: int | None,
        max_attempts: int | None,
        expires: int | None,
        tie: int | None,
        key: str | None,
    ) -> None:
        """``enqueue`` or ``enqueue_many``; with ``tie``, ``run_at`` is an
        instant where a live row is due, or now (``delay`` still wins); with
        ``key``, ``enqueue_many`` gives it to its first and last items."""
        queue, name = self.q(via)
        options: dict[str, Any] = {
            "priority": priority,
            "delay": delay,
            "max_attempts": max_attempts,
            "expires": expires,
        }
        if tie is not None:
            instants = sorted({self.clock(), *(row.run_at for row in self.model.live.values())})
            options["run_at"] = instants[tie % len(instants)]
        payloads = [payload] * count if many else [payload]
        keys: list[str | None] = [None] * len(payloads)
        if key is not None and payloads:
            keys[0] = keys[-1] = key
        keyed = {"unique_keys": keys} if many else {"unique_key": key}
        try:
            resolution = self.model.resolve(self.clock(), queue.opts, **options)
        except ValidationError:
            refused: Callable[[], object] = (
                (lambda: queue.enqueue_many(payloads, **options, **keyed))
                if many
                else (lambda: queue.enqueue(payload, **options, **keyed))
            )
            with pytest.raises(ValidationError):
                refused()
            return
        ids = (
            queue.enqueue_many(payloads, **options, **keyed)
            if many
            else [queue.enqueue(payload, **options, **keyed)]
        )
        assert len(ids) == len(payloads)
        held = {self.model.holder(name, k) for k in keys if k is not None} - {None}
        new = list(dict.fromkeys(i for i in ids if i not in held))
        assert all(i not in self.ids for i in new), "an id was reused"
        assert new == sorted(new)
        assert ids == self.model.insert(name, ids, payloads, resolution, keys)
        for i in ids:
            self.ids[i] = name

    def _compare_claims(self, got: list[JobHandle], expected: list[ModelHandle]) -> None:
        assert [h.id for h in got] == [m.job_id for m in expected]
        for handle, model in zip(got, expected, strict=True):
            assert _describe(handle.job) == _describe(model.snapshot)
            self.handles.append((handle, model))

    @rule(via=_via, worker=_workers, n=st.none() | st.integers(1, 4) | st.sampled_from([-1, 0]))
    def claim(self, via: str, worker: str, n: int | None) -> None:
        """``claim_one`` when ``n`` is ``None``, else ``claim_batch(n)``."""
        queue, name = self.q(via)
        if n is None:
            handle = queue.claim_one(worker)
            got = [] if handle is None else [handle]
        else:
            got = queue.claim_batch(worker, n)
        expected = self.model.claim(name, worker, 1 if n is None else n, self.clock())
        self._compare_claims(got, expected)

    @precondition(lambda self: self.handles)
    @rule(
        op=st.sampled_from(["ack", "retry", "fail", "heartbeat", "release"]),
        index=_index,
        invalid=_invalid,
        delay=st.none() | st.sampled_from([0, 3, 20]),
        error=st.none() | st.text(max_size=4),
        extend=st.none() | st.sampled_from([1, 15, 60]),
        result=st.none() | st.sampled_from([0, "done", {"n": [1, 2]}]),
    )
    def handle_op(
        self,
        *,
        op: str,
        index: int,
        invalid: bool,
        delay: int | None,
        error: str | None,
        extend: int | None,
        result: object,
    ) -> None:
        """One operation through a handle, valid or (with ``invalid``)
        preferably not; an ack through a handle claimed from a queue handle
        that keeps completed jobs keeps it, with ``result``."""
        handle, model = self.pick_handle(index, invalid)
        now = self.clock()
        if op == "ack":
            keep = handle._queue.opts.keep_completed_s is not None
            expected = self.model.ack(model, now, keep, encode_result(result))
            assert handle.ack(result) == expected
        elif op == "fail":
            assert handle.fail(error) == self.model.fail(model, error, now)
        elif op == "heartbeat":
            assert handle.heartbeat(extend) == self.model.heartbeat(model, extend, now)
        elif op == "release":
            assert handle.release() == self.model.release(model, now)
        else:
            text = error or ""
            took = handle.retry(text, delay=delay)
            queue = self.queues["main" if handle.queue == self.names["main"] else "other"]

            def draw(low: int, high: int) -> int:
                row = queue.get_job(handle.id)
                assert row is not None
                assert row.state == "pending"
                waited = (row.run_at - now).total_seconds()
                assert waited == int(waited), waited
                assert low <= waited <= high, (low, waited, high)
                return int(waited)

            assert took == self.model.retry(model, text, now, delay, draw=draw)

    @rule(
        op=st.sampled_from(["cancel", "ack_batch", "sweep_expired", "purge_dead", "dead_jobs"]),
        via=_via,
        indexes=st.lists(_index, min_size=1, max_size=5),
        seconds=st.none() | st.sampled_from([0, 5, 20]),
    )
    def queue_op(self, op: str, via: str, indexes: list[int], seconds: int | None) -> None:
        """``cancel``, ``ack_batch`` (known ids, repeats and unknown ids),
        ``sweep_expired`` (with the handle's retention), ``purge_dead``
        (older than ``seconds``) or a page of ``dead_jobs`` (after a picked
        id)."""
        queue, name = self.q(via)
        now = self.clock()
        ids = self.pick_ids(indexes)
        if op == "cancel":
            assert queue.cancel(ids[0]) == self.model.cancel(name, ids[0])
        elif op == "ack_batch":
            keep = queue.opts.keep_completed_s is not None
            assert queue.ack_batch(ids) == self.model.ack_batch(name, ids, now, keep)
        elif op == "purge_dead":
            assert queue.purge_dead(seconds) == self.model.purge_dead(name, seconds, now)
        elif op == "dead_jobs":
            after = None if seconds is None else max(0, ids[0])
            limit = len(indexes)
            got = [_describe(j) for j in queue.dead_jobs(limit, after)]
            assert got == [_describe(j) for j in self.model.dead_jobs(name, limit, after)]
        else:
            retention, keep_s = queue.opts.dead_letter_retention_s, queue.opts.keep_completed_s
            expected = self.model.sweep_expired(name, retention, now, keep_s)
            assert tuple(queue.sweep_expired()) == expected

    @precondition(lambda self: self.model.dead)
    @rule(via=_via, index=_index, other=st.booleans(), delay=st.none() | st.sampled_from([0, 5]))
    def requeue(self, via: str, index: int, other: bool, delay: int | None) -> None:
        """``requeue`` of a dead job through ``via``: of that queue, or (with
        ``other``) of any queue, or a live or unknown id."""
        queue, name = self.q(via)
        now = self.clock()
        pool = sorted(i for i, row in self.model.dead.items() if other or row.queue == name)
        target = pool[index % len(pool)] if pool else self.pick_ids([index])[0]
        run_at = now + timedelta(seconds=delay or 0)
        assert queue.requeue(target, delay=delay) == self.model.requeue(name, target, run_at)

    @rule(seconds=st.sampled_from([0.5, 1, 5, 9, 10, 20, 29, 30, 31, 60]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(timedelta(seconds=seconds))

    @rule(index=_index, offset_us=st.sampled_from([-1, 0, 0, 1]))
    def advance_to_a_boundary(self, index: int, offset_us: int) -> None:
        """Move the clock to just before, at or just after an instant where
        a rule's boundary lies: a due time, an expiry, a claim deadline, the
        end of a dead row's retention."""
        now = self.clock()
        retentions = [
            opts.dead_letter_retention_s
            for _, opts in HANDLE_OPTS.values()
            if opts.dead_letter_retention_s is not None
        ]
        instants = []
        for row in self.model.live.values():
            instants += [row.run_at, row.expires_at, row.claim_deadline]
        for row in self.model.dead.values():
            assert row.died_at is not None
            instants += [row.died_at + timedelta(seconds=r) for r in retentions]
        future = sorted({i for i in instants if i is not None and i > now})
        if future:
            target = future[index % len(future)] + timedelta(microseconds=offset_us)
            self.clock.set(max(now, target))

    # -- the comparison --------------------------------------------------------

    @invariant()
    def engine_matches_model(self) -> None:
        now: datetime = self.clock()
        for key, name in self.names.items():
            queue = self.queues[key]
            assert tuple(queue.stats()) == self.model.stats(name, now), name
        for job_id, name in self.ids.items():
            queue = self.queues["main"] if name == self.names["main"] else self.queues["other"]
            assert _describe(queue.get_job(job_id)) == _describe(
                self.model.get_job(name, job_id)
            ), job_id
            other = self.queues["other"] if queue is self.queues["main"] else self.queues["main"]
            assert other.get_job(job_id) is None


def machine_for(open_store: Callable[..., Store]) -> type[QueueMachine]:
    """A :class:`QueueMachine` subclass whose examples open stores with
    ``open_store(clock=..., rng=...)``."""
    return type("EngineQueueMachine", (QueueMachine,), {"open_store": staticmethod(open_store)})


class StatefulTests(ContractFixtures):
    """The engine against the model over random operation sequences."""

    @pytest.mark.slow
    def test_engine_agrees_with_the_model(self, open_store: StoreFactory) -> None:
        run_state_machine_as_test(machine_for(open_store), settings=stateful_settings())
