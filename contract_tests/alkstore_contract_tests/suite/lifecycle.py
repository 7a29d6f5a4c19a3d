"""Opening, migrating and closing a store (docs/contract.md §2 "Engine options", §3
"Closed store", "Schema")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import pytest

from alkstore import (
    AlkstoreError,
    Queue,
    SchemaVersionError,
    Store,
    StoreClosedError,
    ValidationError,
)
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, StoreFactory, claim_exactly, job
from alkstore_contract_tests.harness import StoreTarget

__all__ = ["ClosedStoreTests", "EngineOptionTests", "SchemaTests"]


class ClosedStoreTests(ContractFixtures):
    """docs/contract.md §3 "Closed store": ``StoreClosedError`` first, before argument
    validation and the ``n <= 0`` shortcut; close is idempotent; attribute
    reads keep working."""

    def test_every_method_raises_store_closed_first(
        self, store: Store, queue: Queue, clock: ManualClock
    ) -> None:
        handle = claim_exactly(queue, queue.enqueue("x"))
        sub = store.listen("jobs")
        store.close()
        calls: dict[str, Callable[[], object]] = {
            "queue": lambda: store.queue("jobs"),
            "queue-bad-name": lambda: store.queue("bad name!"),
            "listen": lambda: store.listen("jobs"),
            "listen-bad-name": lambda: store.listen(""),
            "migrate": store.migrate,
            "enqueue": lambda: queue.enqueue("x"),
            "enqueue-bad": lambda: queue.enqueue(float("nan"), delay=-1),
            "enqueue_many": lambda: queue.enqueue_many(["x"]),
            "enqueue_many-bad": lambda: queue.enqueue_many("not a list"),
            "enqueue_many-empty": lambda: queue.enqueue_many([]),
            "enqueue_tx": lambda: queue.enqueue_tx(object(), "x"),
            "enqueue_tx-bad": lambda: queue.enqueue_tx(None, float("nan")),
            "claim_one": lambda: queue.claim_one("w"),
            "claim_one-bad": lambda: queue.claim_one(""),
            "claim_batch": lambda: queue.claim_batch("w", 3),
            "claim_batch-zero": lambda: queue.claim_batch("w", 0),
            "claim_batch-negative": lambda: queue.claim_batch("w", -1),
            "claim_batch-bad": lambda: queue.claim_batch("", True),
            "ack_batch": lambda: queue.ack_batch([handle.id]),
            "ack_batch-empty": lambda: queue.ack_batch([]),
            "ack_batch-bad": lambda: queue.ack_batch("x"),  # type: ignore[arg-type]
            "ack_many": lambda: queue.ack_many([handle]),
            "ack_many-empty": lambda: queue.ack_many([]),
            "ack_many-bad": lambda: queue.ack_many("x"),  # type: ignore[arg-type]
            "cancel": lambda: queue.cancel(handle.id),
            "cancel-bad": lambda: queue.cancel("x"),  # type: ignore[arg-type]
            "get_job": lambda: queue.get_job(handle.id),
            "get_job-bad": lambda: queue.get_job(None),  # type: ignore[arg-type]
            "sweep_expired": queue.sweep_expired,
            "stats": queue.stats,
            "ack": handle.ack,
            "retry": lambda: handle.retry("e"),
            "retry-bad": lambda: handle.retry(5, delay=-1),  # type: ignore[arg-type]
            "fail": handle.fail,
            "fail-bad": lambda: handle.fail(5),  # type: ignore[arg-type]
            "heartbeat": handle.heartbeat,
            "heartbeat-bad": lambda: handle.heartbeat(0),
            "wait": lambda: sub.wait(0),
            "wait-bad": lambda: sub.wait(-1),
        }
        wrong = {}
        for name, call in calls.items():
            try:
                call()
            except StoreClosedError:
                continue
            except Exception as exc:  # report every method, not the first
                wrong[name] = repr(exc)
            else:
                wrong[name] = "returned"
        sub.close()
        assert wrong == {}

    def test_close_is_idempotent_and_attributes_stay_readable(self, store: Store) -> None:
        q = store.queue("jobs")
        handle = claim_exactly(q, q.enqueue({"a": 1}, priority=3))
        sub = store.listen("jobs")
        store.close()
        store.close()
        sub.close()
        sub.close()
        with store:
            pass
        assert (q.name, q.opts.visibility_timeout_s) == ("jobs", 30)
        assert (handle.job.payload, handle.payload, handle.priority, handle.attempts) == (
            {"a": 1},
            {"a": 1},
            3,
            1,
        )
        assert handle.enqueued_at == T0

    def test_context_manager_closes(self, open_store: StoreFactory) -> None:
        with open_store() as store:
            q = store.queue("jobs")
            q.enqueue("x")
        with pytest.raises(StoreClosedError):
            q.stats()
        with pytest.raises(StoreClosedError):
            store.queue("jobs")

    def test_closing_one_store_leaves_others_working(self, open_store: StoreFactory) -> None:
        one, two = open_store(), open_store()
        job_id = one.queue("jobs").enqueue("x")
        one.close()
        assert job(two.queue("jobs"), job_id).payload == "x"

    def test_store_closed_error_is_an_alkstore_error(self) -> None:
        assert issubclass(StoreClosedError, AlkstoreError)
        assert issubclass(ValidationError, AlkstoreError)
        assert issubclass(ValidationError, ValueError)


class EngineOptionTests(ContractFixtures):
    """docs/contract.md §2 "Engine options"."""

    def test_unknown_option_is_refused(self, alkstore_target: StoreTarget) -> None:
        with pytest.raises(ValidationError):
            self.open_store(alkstore_target, clock=ManualClock(), no_such_option=1)

    @pytest.mark.parametrize(
        "clock",
        [5, "2030-01-01T00:00:00+00:00", T0, lambda: datetime(2030, 1, 1), lambda: "now"],
        ids=["int", "str", "datetime", "naive", "returns-str"],
    )
    def test_bad_clock_is_refused(self, alkstore_target: StoreTarget, clock: object) -> None:
        with pytest.raises(ValidationError):
            self.open_store(alkstore_target, clock=clock)

    def test_async_clock_and_rng_are_refused(self, alkstore_target: StoreTarget) -> None:
        """Case 012's kind: an ``async def`` clock or ``randint`` would hand
        back a coroutine, not an instant or a number."""

        async def clock() -> datetime:
            return T0

        class AsyncRng:
            async def randint(self, a: int, b: int) -> int:
                return a

        with pytest.raises(ValidationError, match="the clock must be a plain function"):
            self.open_store(alkstore_target, clock=clock)
        with pytest.raises(ValidationError, match=r"rng\.randint must be a plain function"):
            self.open_store(alkstore_target, clock=ManualClock(), rng=AsyncRng())

    def test_clock_and_rng_are_used(self, open_store: StoreFactory) -> None:
        class AlwaysLow:
            def randint(self, a: int, b: int) -> int:
                return a

        store = open_store(clock=ManualClock(T0), rng=AlwaysLow())
        q = store.queue("jobs")
        job_id = q.enqueue("x")
        assert claim_exactly(q, job_id).retry("e")
        assert job(q, job_id).run_at == T0.replace(second=2)


class SchemaTests(ContractFixtures):
    """docs/contract.md §3 "Schema"."""

    def test_migrate_false_on_a_fresh_target_is_refused(self, alkstore_target: StoreTarget) -> None:
        with pytest.raises(SchemaVersionError):
            self.open_store(alkstore_target, clock=ManualClock(), migrate=False)
        store = self.open_store(alkstore_target, clock=ManualClock())
        try:
            job_id = store.queue("jobs").enqueue("x")
        finally:
            store.close()
        again = self.open_store(alkstore_target, clock=ManualClock(), migrate=False)
        try:
            assert job(again.queue("jobs"), job_id).payload == "x"
        finally:
            again.close()

    def test_migrate_is_idempotent(self, store: Store, open_store: StoreFactory) -> None:
        q = store.queue("jobs")
        job_id = q.enqueue("kept")
        store.migrate()
        store.migrate()
        open_store().migrate()
        assert job(q, job_id).payload == "kept"
        assert claim_exactly(q, job_id).ack()
        assert q.enqueue("next") > job_id
