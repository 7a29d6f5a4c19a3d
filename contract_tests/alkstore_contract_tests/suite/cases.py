"""The regression cases that apply to every engine (``shared/cases/``), with
their exact expected values. Cases 001 and 010 live with the concurrency
and transactional tests (``test_case_001_*``, ``TransactionalEnqueueTests``);
004 and 005 are PostgreSQL-only and belong to that engine's own tests."""

from __future__ import annotations

import math
import random
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from alkstore import (
    AlkstoreError,
    Queue,
    QueueOpts,
    Store,
    SweepResult,
    ValidationError,
    backoff_delay_s,
)
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import (
    ContractFixtures,
    StoreFactory,
    at,
    claim_exactly,
    job,
)
from alkstore_contract_tests.harness import StoreTarget
from alkstore_contract_tests.suite.wake import WAKE_TIMEOUT_S

__all__ = ["HandedCaseTests"]


def _one_table(queue: Queue, job_id: int) -> str:
    """Assert the job is in exactly one of the live and dead tables (the
    queue holds only this job) and return its state."""
    found = queue.get_job(job_id)
    assert found is not None, f"job {job_id} is in neither table"
    stats = queue.stats()
    assert sum(stats) == 1, f"job {job_id} counted {sum(stats)} times: {stats}"
    return found.state


class HandedCaseTests(ContractFixtures):
    """Regression cases 002, 003, 006, 007, 008, 009 and 011."""

    # -- 002 -----------------------------------------------------------------

    def test_case_002_dead_worker_last_attempt(self, queue: Queue, clock: ManualClock) -> None:
        j1 = queue.enqueue("J1", max_attempts=1)
        dropped = queue.claim_one("w1")
        assert dropped is not None
        assert dropped.id == j1
        del dropped  # the worker died
        clock.set(at(29))
        assert queue.claim_one("w2") is None
        assert job(queue, j1).state == "processing"
        clock.set(at(31))
        assert queue.claim_one("w2") is None
        dead = job(queue, j1)
        assert (dead.state, dead.attempts, dead.last_error) == ("dead", 1, "max attempts exceeded")

        # control: a job with a second attempt left comes back
        j2 = queue.enqueue("J2", max_attempts=2)
        claim_exactly(queue, j2, "w2")
        clock.set(at(62))
        again = claim_exactly(queue, j2, "w3")
        assert again.attempts == 2

        # poison: three drops, 31 s apart, then dead, never a fourth claim
        j3 = queue.enqueue("J3", max_attempts=3)
        seen = []
        for _ in range(3):
            handle = claim_exactly(queue, j3, "w4")
            seen.append(handle.attempts)
            clock.advance(31)
        assert seen == [1, 2, 3]
        assert queue.claim_one("w5") is None
        dead = job(queue, j3)
        assert (dead.state, dead.attempts, dead.last_error) == ("dead", 3, "max attempts exceeded")
        clock.advance(1000)
        assert queue.claim_one("w5") is None

    # -- 003 -----------------------------------------------------------------

    @pytest.mark.slow
    def test_case_003_backoff_at_huge_attempt_counts(
        self, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        store = open_store(rng=random.Random(3))
        q = store.queue("jobs", QueueOpts(max_attempts=100_000, backoff_base_s=1))
        job_id = q.enqueue("x")
        checkpoints = {1, 2, 12, 13, 31, 32, 64, 1025, 5000}
        for attempt in range(1, max(checkpoints) + 1):
            handle = claim_exactly(q, job_id)
            assert handle.attempts == attempt
            if attempt not in checkpoints:
                assert handle.retry("e", delay=0)
                continue
            assert handle.retry("e")
            got = job(q, job_id)
            d = (got.run_at - clock()).total_seconds()
            e = min(2 ** (attempt - 1), 3600)
            assert d == int(d), (attempt, d)
            assert math.ceil(e / 2) <= d <= e, (attempt, d)
            if attempt >= 13:
                assert 1800 <= d <= 3600
            clock.set(got.run_at)

    def test_case_003_core_backoff_function(self) -> None:
        rng = random.Random(0)
        for base in (0, 1, 10**9):
            for attempt in (1, 31, 63, 64, 1024, 1025, 10**6):
                d = backoff_delay_s(attempt, base, 3600, rng)
                assert type(d) is int
                assert 0 <= d <= 3600
                if base == 0:
                    assert d == 0
                else:
                    assert d > 0
                    e = min(base * 2 ** min(attempt - 1, 20), 3600)
                    assert math.ceil(e / 2) <= d <= e

        def timed(attempt: int) -> float:
            started = time.perf_counter()
            for _ in range(2000):
                backoff_delay_s(attempt, 1, 3600, rng)
            return time.perf_counter() - started

        timed(1)
        assert timed(10**6) < 5 * timed(1) + 0.01

    # -- 006 -----------------------------------------------------------------

    CASE_006_NAMES: tuple[tuple[str, bool], ...] = (
        ("image-worker-queue", True),
        ("Foo", True),
        ("a b", False),
        ('q"uote', False),
        ("it's", False),
        ("x'); DROP TABLE jobs; --", False),
        ("名前", False),
        ("semi;colon", False),
        ("", False),
        ("q" * 63, True),
        ("q" * 64, True),
        ("q" * 128, True),
        ("q" * 129, False),
    )

    def test_case_006_hostile_and_long_queue_names(self, store: Store) -> None:
        control = store.queue("control")
        control_id = control.enqueue({"control": True})
        for name, accepted in self.CASE_006_NAMES:
            if not accepted:
                with pytest.raises(ValidationError):
                    store.queue(name)
                with pytest.raises(ValidationError):
                    store.listen(name)
                continue
            q = store.queue(name)
            with store.listen(name) as sub:
                job_id = q.enqueue({"name": name})
                assert sub.wait(WAKE_TIMEOUT_S) is True, name
            handle = claim_exactly(q, job_id)
            assert handle.payload == {"name": name}
            assert handle.ack()
            assert q.stats() == (0, 0, 0, 0)
        assert job(control, control_id).payload == {"control": True}
        assert control.stats() == (1, 0, 0, 0)

    def test_case_006_names_sharing_63_characters(self, store: Store) -> None:
        one_name, two_name = "q" * 63 + "-one", "q" * 63 + "-two"
        one, two = store.queue(one_name), store.queue(two_name)
        with store.listen(one_name) as one_sub, store.listen(two_name) as two_sub:
            first = one.enqueue("one")
            assert one_sub.wait(WAKE_TIMEOUT_S) is True
            assert two.claim_one("w") is None
            assert two.get_job(first) is None
            second = two.enqueue("two")
            assert two_sub.wait(WAKE_TIMEOUT_S) is True
        assert claim_exactly(one, first).payload == "one"
        assert claim_exactly(two, second).payload == "two"

    # -- 007 -----------------------------------------------------------------

    CASE_007: tuple[tuple[str, Any, bool], ...] = (
        ("nul-in-value", {"s": "a\u0000b"}, True),
        ("nul-in-key", {"k\u0000": 1}, True),
        ("nul-alone", "\u0000", True),
        ("lone-surrogate", {"s": "\ud800"}, False),
        ("nan", float("nan"), False),
        ("inf", {"v": float("inf")}, False),
        ("datetime", {"when": datetime.now(UTC)}, False),
        ("object", {"o": object()}, False),
        ("int-key", {1: "int key"}, False),
        ("raw-bytes", b"\xff\xfe\x00", True),
    )

    def test_case_007_nul_and_unencodable_payloads(self, queue: Queue) -> None:
        for label, payload, accepted in self.CASE_007:
            if not accepted:
                with pytest.raises(ValidationError):
                    queue.enqueue(payload)
                assert queue.stats() == (0, 0, 0, 0), label
                continue
            job_id = queue.enqueue(payload)
            handle = claim_exactly(queue, job_id)
            assert handle.payload == payload, label
            assert type(handle.payload) is type(payload), label
            assert handle.ack()

    def test_case_007_error_text_with_nul(self, queue: Queue) -> None:
        failed, retried = queue.enqueue("f"), queue.enqueue("r")
        assert claim_exactly(queue, failed).fail("boom\u0000tail") is True
        assert claim_exactly(queue, retried).retry("\u0000") is True
        assert job(queue, failed).last_error == "boom\ufffdtail"
        assert job(queue, retried).last_error == "\ufffd"

    # -- 008 -----------------------------------------------------------------

    @pytest.mark.parametrize(
        "payload",
        [
            "x" * 65_537,
            ["y" * 70] * 900,
            "z" * (5 * 2**20),
            bytes(range(256)) * (16 * 2**20 // 256),
        ],
        ids=["65537-chars", "900-item-list", "5-MiB-str", "16-MiB-bytes"],
    )
    def test_case_008_big_payloads_are_never_truncated(self, queue: Queue, payload: object) -> None:
        job_id = queue.enqueue(payload)
        assert job(queue, job_id).payload == payload
        handle = claim_exactly(queue, job_id)
        assert handle.payload == payload
        if isinstance(payload, bytes):
            assert handle.payload_bytes == payload
            assert len(handle.payload_bytes) == 16 * 2**20

    def test_case_008_deep_nesting_round_trips_or_is_refused(self, queue: Queue) -> None:
        payload: list[Any] = []
        for _ in range(999):
            payload = [payload]
        try:
            job_id = queue.enqueue(payload)
        except ValidationError:
            assert queue.stats() == (0, 0, 0, 0)
            return
        assert claim_exactly(queue, job_id).payload == payload

    # -- 009 -----------------------------------------------------------------

    def _case_009_setup(self, queue: Queue) -> dict[str, int]:
        return {
            "A": queue.enqueue("A", priority=0),
            "B": queue.enqueue("B", priority=10),
            "C": queue.enqueue("C", priority=-5),
            "D": queue.enqueue("D", priority=10),
            "E": queue.enqueue("E"),
        }

    def test_case_009_priority_direction(self, store: Store) -> None:
        one_by_one = store.queue("one-by-one")
        names = {v: k for k, v in self._case_009_setup(one_by_one).items()}
        got = []
        for _ in range(5):
            handle = one_by_one.claim_one("w")
            assert handle is not None
            got.append(names[handle.id])
        assert got == ["B", "D", "A", "E", "C"]
        assert one_by_one.claim_one("w") is None

        batch = store.queue("batch")
        names = {v: k for k, v in self._case_009_setup(batch).items()}
        assert [names[h.id] for h in batch.claim_batch("w", 5)] == ["B", "D", "A", "E", "C"]

    def test_case_009_a_future_job_is_never_early(self, queue: Queue, clock: ManualClock) -> None:
        f = queue.enqueue("F", priority=10, run_at=at(60))
        g = queue.enqueue("G", priority=0)
        handle = claim_exactly(queue, g)
        assert handle.payload == "G"
        assert handle.ack()
        assert queue.claim_one("w") is None
        assert queue.claim_batch("w", 5) == []
        clock.set(at(60))
        claim_exactly(queue, f)

    # -- 011 -----------------------------------------------------------------

    @staticmethod
    def _refused(call: Any) -> object:
        """Call; an ``AlkstoreError`` is an allowed outcome, returned as
        ``"raised"`` after checking that it wraps the driver's error."""
        try:
            return call()
        except AlkstoreError as exc:
            error = exc
        assert error.__cause__ is not None, "the driver error must be the cause"
        assert not isinstance(error, ValidationError)
        return "raised"

    def test_case_011_dead_letter_move_is_atomic(
        self, store: Store, clock: ManualClock, alkstore_target: StoreTarget
    ) -> None:
        q_fail, q_retry = store.queue("fail"), store.queue("retry")
        q_lapse, q_expire = store.queue("lapse"), store.queue("expire")
        j_fail = q_fail.enqueue("fail", max_attempts=3)
        j_retry = q_retry.enqueue("retry", max_attempts=1)
        j_lapse = q_lapse.enqueue("lapse", max_attempts=1)
        j_expire = q_expire.enqueue("expire", expires=20)
        h_fail = claim_exactly(q_fail, j_fail)
        h_retry = claim_exactly(q_retry, j_retry)
        claim_exactly(q_lapse, j_lapse)
        with self.dead_letter_inserts_fail(alkstore_target):
            assert self._refused(lambda: h_fail.fail("boom")) in ("raised", False)
            assert _one_table(q_fail, j_fail) == "processing"
            assert self._refused(lambda: h_retry.retry("e")) in ("raised", False)
            assert _one_table(q_retry, j_retry) == "processing"
            clock.set(at(30))
            assert self._refused(lambda: q_lapse.claim_one("w")) in ("raised", None)
            assert _one_table(q_lapse, j_lapse) == "processing"
            assert self._refused(q_expire.sweep_expired) in ("raised", SweepResult(0, 0))
            assert _one_table(q_expire, j_expire) == "pending"
        # the trigger is gone: every path completes
        h_again = claim_exactly(q_fail, j_fail, "w2")
        assert h_again.attempts == 2
        assert h_again.fail("boom") is True
        dead = job(q_fail, j_fail)
        assert (dead.state, dead.last_error) == ("dead", "boom")
        assert _one_table(q_fail, j_fail) == "dead"
        assert q_retry.claim_one("w") is None
        assert job(q_retry, j_retry).last_error == "max attempts exceeded"
        assert q_lapse.claim_one("w") is None
        assert job(q_lapse, j_lapse).last_error == "max attempts exceeded"
        assert q_expire.sweep_expired() == (1, 0)
        assert job(q_expire, j_expire).last_error == "expired"
        for q, job_id in ((q_retry, j_retry), (q_lapse, j_lapse), (q_expire, j_expire)):
            assert _one_table(q, job_id) == "dead"
