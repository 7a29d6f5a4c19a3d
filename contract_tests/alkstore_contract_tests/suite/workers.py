"""What a dashboard reads (docs/contract.md §11): the workers registry, the
job pages by state, and the per-minute throughput the workers report."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from alkstore import Queue, QueueOpts, Store, ThroughputPoint, ValidationError, WorkerInfo
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, StoreFactory, at, claim_exactly

__all__ = ["JobListingTests", "ThroughputTests", "WorkersRegistryTests"]


def _info(worker_id: str = "w1", /, **changes: object) -> WorkerInfo:
    fields: dict[str, object] = {
        "id": worker_id,
        "host": "host-a",
        "pid": 4242,
        "queues": ("emails", "reports"),
        "concurrency": 8,
        "started_at": at(0),
        "last_seen_at": at(-999),  # the store sets it
        "running": (),
        "ttl_s": 60.0,
    }
    fields.update(changes)
    return WorkerInfo(**fields)  # type: ignore[arg-type]


class WorkersRegistryTests(ContractFixtures):
    """Workers record themselves, refresh, leave, and drop off when silent."""

    def test_a_registered_worker_is_listed_as_stored(
        self, store: Store, clock: ManualClock
    ) -> None:
        clock.advance(5)
        stored = store.register_worker(_info(running=[30, 10, 20]))
        expected = _info(last_seen_at=at(5), running=(10, 20, 30))
        assert stored == expected
        assert store.workers() == [expected]

    def test_a_refresh_replaces_the_record_and_moves_last_seen(
        self, store: Store, clock: ManualClock
    ) -> None:
        store.register_worker(_info(running=(1,)))
        clock.advance(10)
        store.register_worker(_info(running=(2, 3), concurrency=4))
        assert store.workers() == [_info(last_seen_at=at(10), running=(2, 3), concurrency=4)]

    def test_a_silent_worker_drops_off_at_its_ttl(self, store: Store, clock: ManualClock) -> None:
        store.register_worker(_info(ttl_s=30.0))
        clock.advance(29.999999)
        assert [w.id for w in store.workers()] == ["w1"]
        clock.advance(0.000001)  # last_seen_at + ttl_s <= now: gone
        assert store.workers() == []

    def test_a_refresh_deletes_the_silent_records_not_just_hides_them(
        self, store: Store, clock: ManualClock
    ) -> None:
        store.register_worker(_info("old", ttl_s=10.0))
        store.register_worker(_info("live", ttl_s=3600.0))
        clock.advance(20)
        store.register_worker(_info("live", ttl_s=3600.0))
        clock.set(at(5))  # inside old's ttl again: it would show if it were only hidden
        assert [w.id for w in store.workers()] == ["live"]

    def test_unregister_removes_the_record_once(self, store: Store) -> None:
        store.register_worker(_info("a"))
        store.register_worker(_info("b"))
        assert store.unregister_worker("a")
        assert not store.unregister_worker("a")
        assert [w.id for w in store.workers()] == ["b"]

    def test_workers_are_listed_by_start_then_id(self, store: Store) -> None:
        store.register_worker(_info("c", started_at=at(-5)))
        store.register_worker(_info("b", started_at=at(-10)))
        store.register_worker(_info("a", started_at=at(-5)))
        assert [w.id for w in store.workers()] == ["b", "a", "c"]

    def test_another_store_on_the_database_sees_the_registry(
        self, store: Store, open_store: StoreFactory
    ) -> None:
        store.register_worker(_info())
        assert [w.id for w in open_store().workers()] == ["w1"]

    @pytest.mark.parametrize(
        "changes",
        [
            {"id": ""},
            {"host": ""},
            {"pid": 0},
            {"queues": ("__alkstore_x",)},
            {"queues": "emails"},
            {"concurrency": 0},
            {"running": (2**63,)},
            {"running": ("12",)},
            {"ttl_s": 0},
            {"ttl_s": 86_401},
        ],
    )
    def test_a_bad_record_is_refused_before_anything_is_written(
        self, store: Store, changes: dict[str, object]
    ) -> None:
        with pytest.raises(ValidationError):
            store.register_worker(_info(**changes))
        assert store.workers() == []

    def test_only_a_worker_info_is_accepted(self, store: Store) -> None:
        with pytest.raises(ValidationError, match="WorkerInfo"):
            store.register_worker({"id": "w1"})  # type: ignore[arg-type]


class JobListingTests(ContractFixtures):
    """``Queue.jobs``: every state's rows, by id, a page at a time, as
    ``stats()`` counts them."""

    def _fill(self, store: Store, clock: ManualClock) -> tuple[Queue, dict[str, list[int]]]:
        keeping = store.queue("jobs", QueueOpts(keep_completed_s=3600, max_attempts=1))
        done, dying, claimed, lapsing = keeping.enqueue_many(["done", "dying", "held", "lapse"])
        due = keeping.enqueue_many(["a", "b", "c"])
        expiring = keeping.enqueue("x", expires=5)
        later = keeping.enqueue("later", delay=3600)
        for job_id in (done, dying, claimed):
            handle = claim_exactly(keeping, job_id)
            assert handle.ack({"r": 1}) if job_id == done else True
            if job_id == dying:
                assert handle.fail("boom")
        assert claim_exactly(keeping, lapsing, "w2") is not None
        clock.advance(31)  # the lapse's claim deadline passes; the expiry too
        store.queue("other").enqueue("elsewhere")
        expected = {
            "pending": [*due, expiring],
            "scheduled": [later],
            "processing": [claimed, lapsing],
            "completed": [done],
            "dead": [dying],
        }
        return keeping, expected

    def test_each_state_lists_its_jobs_by_id(self, store: Store, clock: ManualClock) -> None:
        keeping, expected = self._fill(store, clock)
        listed = {state: [j.id for j in keeping.jobs(state)] for state in expected}  # type: ignore[arg-type]
        assert listed == expected
        stats = keeping.stats()
        assert [len(expected[s]) for s in ("pending", "scheduled", "processing", "dead")] == [
            stats.pending,
            stats.scheduled,
            stats.processing,
            stats.dead,
        ]
        assert keeping.completed_count() == 1

    def test_listed_jobs_are_full_snapshots(self, store: Store, clock: ManualClock) -> None:
        keeping, _ = self._fill(store, clock)
        (completed,) = keeping.jobs("completed")
        assert (completed.state, completed.result, completed.payload) == (
            "completed",
            {"r": 1},
            "done",
        )
        (scheduled,) = keeping.jobs("scheduled")
        assert (scheduled.state, scheduled.run_at) == ("pending", at(3600))
        (dead,) = keeping.jobs("dead")
        assert (dead.state, dead.last_error) == ("dead", "boom")
        assert [j.state for j in keeping.jobs("processing")] == ["processing", "processing"]

    def test_pages_follow_after_id(self, store: Store, clock: ManualClock) -> None:
        keeping, expected = self._fill(store, clock)
        pending = expected["pending"]
        first = keeping.jobs("pending", limit=2)
        assert [j.id for j in first] == pending[:2]
        rest = keeping.jobs("pending", limit=10, after_id=first[-1].id)
        assert [j.id for j in rest] == pending[2:]
        assert keeping.jobs("pending", after_id=pending[-1]) == []
        assert keeping.jobs("pending", after_id=2**63 - 1) == []

    def test_another_queue_lists_none_of_them(self, store: Store, clock: ManualClock) -> None:
        self._fill(store, clock)
        other = store.queue("other")
        assert [j.payload for j in other.jobs("pending")] == ["elsewhere"]
        for state in ("scheduled", "processing", "completed", "dead"):
            assert other.jobs(state) == []
        assert other.completed_count() == 0

    @pytest.mark.parametrize(
        ("state", "limit", "after_id"),
        [("waiting", 10, None), ("pending", 0, None), ("pending", 10_001, None), ("dead", 1, -1)],
    )
    def test_bad_arguments_are_refused(
        self, queue: Queue, state: str, limit: int, after_id: int | None
    ) -> None:
        with pytest.raises(ValidationError):
            queue.jobs(state, limit=limit, after_id=after_id)  # type: ignore[arg-type]


class ThroughputTests(ContractFixtures):
    """Reports add up per queue and minute; old minutes go."""

    def test_reports_add_up_per_minute(self, queue: Queue, clock: ManualClock) -> None:
        clock.advance(10)
        queue.record_throughput(completed=3, dead=1)
        clock.advance(40)  # 00:00:50, the same minute
        queue.record_throughput(completed=2, retried=4)
        clock.advance(15)  # 00:01:05
        queue.record_throughput(completed=1)
        assert queue.throughput() == [
            ThroughputPoint(at(0), 5, 4, 1),
            ThroughputPoint(at(60), 1, 0, 0),
        ]

    def test_the_window_starts_at_the_minute_holding_its_start(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        queue.record_throughput(completed=1)  # minute 0
        clock.advance(120)
        queue.record_throughput(completed=2)  # minute 2
        clock.advance(30)  # now 00:02:30
        assert [p.minute for p in queue.throughput(window_s=90)] == [at(60 * 2)]
        assert [p.minute for p in queue.throughput(window_s=150)] == [at(0), at(120)]
        assert [p.minute for p in queue.throughput(window_s=timedelta(minutes=3))] == [
            at(0),
            at(120),
        ]

    def test_queues_keep_their_own_counts(self, store: Store, queue: Queue) -> None:
        queue.record_throughput(completed=1)
        store.queue("other").record_throughput(dead=7)
        assert queue.throughput() == [ThroughputPoint(at(0), 1, 0, 0)]
        assert store.queue("other").throughput() == [ThroughputPoint(at(0), 0, 0, 7)]

    def test_minutes_older_than_a_day_are_deleted_by_the_next_report(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        queue.record_throughput(completed=1)
        clock.advance(86_400 + 60)
        queue.record_throughput(completed=2)
        assert queue.throughput(window_s=2 * 86_400) == [ThroughputPoint(at(86_400 + 60), 2, 0, 0)]

    def test_an_empty_report_writes_nothing_and_bad_counts_are_refused(self, queue: Queue) -> None:
        queue.record_throughput()
        assert queue.throughput() == []
        for bad in ({"completed": -1}, {"retried": 2**31}, {"dead": 1.5}):
            with pytest.raises(ValidationError):
                queue.record_throughput(**bad)
        assert queue.throughput() == []

    def test_concurrent_reports_all_count(self, open_store: StoreFactory) -> None:
        threads_n, reports = 8, 25
        stores = [open_store() for _ in range(threads_n)]
        barrier = threading.Barrier(threads_n)
        errors: list[BaseException] = []

        def report(store: Store) -> None:
            try:
                queue = store.queue("jobs")
                barrier.wait()
                for _ in range(reports):
                    queue.record_throughput(completed=1, retried=2)
            except BaseException as exc:  # re-raised by the test
                errors.append(exc)

        threads = [threading.Thread(target=report, args=(s,)) for s in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        n = threads_n * reports
        assert stores[0].queue("jobs").throughput() == [ThroughputPoint(at(0), n, 2 * n, 0)]
