"""Operating queues: pause and resume, the dead-letter operations
(``dead_jobs``, ``requeue``, ``purge_dead``) and ``Store.queue_names``
(docs/operations.md)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from alkstore import Job, Queue, QueueOpts, Store, StoreClosedError, ValidationError
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import (
    ContractFixtures,
    StoreFactory,
    at,
    claim_exactly,
    job,
)
from alkstore_contract_tests.suite.wake import WAKE_TIMEOUT_S

__all__ = ["DeadLetterOpsTests", "PauseTests", "QueueNamesTests", "RunNowTests"]

MICRO = timedelta(microseconds=1)


def _bury(queue: Queue, payload: object, error: str = "bad", **options: Any) -> int:
    """Enqueue ``payload`` and fail its first claim: a dead job of ``queue``."""
    job_id = queue.enqueue(payload, **options)
    assert claim_exactly(queue, job_id).fail(error)
    return job_id


def _assert_closed(calls: dict[str, Callable[[], object]]) -> None:
    """Every call raises ``StoreClosedError`` (all are tried, all reported)."""
    wrong = {}
    for name, call in calls.items():
        try:
            call()
        except StoreClosedError:
            continue
        except Exception as exc:
            wrong[name] = repr(exc)
        else:
            wrong[name] = "returned"
    assert wrong == {}


class PauseTests(ContractFixtures):
    """``Queue.pause``/``resume``/``is_paused``: a paused queue hands out
    nothing and writes nothing on claim; enqueues still land; resume wakes
    the subscribers."""

    def test_pause_and_resume_report_changes(self, queue: Queue) -> None:
        assert queue.is_paused() is False
        assert queue.resume() is False
        assert queue.pause() is True
        assert queue.is_paused() is True
        assert queue.pause() is False
        assert queue.is_paused() is True
        assert queue.resume() is True
        assert queue.is_paused() is False
        assert queue.resume() is False
        assert queue.pause() is True

    def test_a_paused_queue_hands_out_nothing(self, queue: Queue) -> None:
        ids = queue.enqueue_many(["a", "b", "c"])
        before = [job(queue, i) for i in ids]
        assert queue.pause() is True
        assert queue.claim_one("w") is None
        assert queue.claim_batch("w", 10) == []
        assert [job(queue, i) for i in ids] == before
        assert queue.stats() == (3, 0, 0, 0)
        assert queue.resume() is True
        handles = queue.claim_batch("w", 10)
        assert [(h.id, h.attempts) for h in handles] == [(i, 1) for i in ids]

    def test_enqueues_land_while_paused(self, queue: Queue, clock: ManualClock) -> None:
        assert queue.pause()
        first = queue.enqueue("now")
        later = queue.enqueue_many(["x", "y"], delay=10)
        assert queue.stats() == (1, 2, 0, 0)
        assert job(queue, first).state == "pending"
        clock.set(at(10))
        assert queue.claim_batch("w", 5) == []
        assert queue.stats() == (3, 0, 0, 0)
        assert queue.resume()
        assert [h.id for h in queue.claim_batch("w", 5)] == [first, *later]

    def test_a_paused_claim_neither_reclaims_nor_dead_letters(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        """The pre-claim dead-lettering of exhausted lapsed claims is a write
        of the claim: a paused queue does not do it either."""
        exhausted = queue.enqueue("exhausted", max_attempts=1)
        lapsing = queue.enqueue("lapsing", max_attempts=3)
        claim_exactly(queue, exhausted, "w1")
        claim_exactly(queue, lapsing, "w2")
        clock.set(at(30))  # both claims lapsed
        assert queue.pause()
        assert queue.claim_one("w") is None
        assert queue.claim_batch("w", 5) == []
        gone = job(queue, exhausted)
        assert (gone.state, gone.attempts, gone.worker_id, gone.died_at) == (
            "processing",
            1,
            "w1",
            None,
        )
        lapsed = job(queue, lapsing)
        assert (lapsed.state, lapsed.attempts, lapsed.worker_id) == ("processing", 1, "w2")
        assert queue.stats() == (0, 0, 2, 0)
        clock.set(at(40))
        assert queue.resume()
        handle = claim_exactly(queue, lapsing, "w3")
        assert (handle.attempts, handle.claim_deadline) == (2, at(70))
        dead = job(queue, exhausted)
        assert (dead.state, dead.last_error, dead.died_at, dead.attempts) == (
            "dead",
            "max attempts exceeded",
            at(40),
            1,
        )

    def test_claims_made_before_the_pause_run_on(self, queue: Queue, clock: ManualClock) -> None:
        first, second, third = queue.enqueue_many(["a", "b", "c"])
        one, two, three = queue.claim_batch("w", 3)
        assert queue.pause()
        clock.set(at(10))
        assert one.ack() is True
        assert two.heartbeat(100) is True
        assert three.retry("again", delay=0) is True
        assert queue.get_job(first) is None
        assert job(queue, second).claim_deadline == at(110)
        assert job(queue, third).state == "pending"
        assert queue.claim_one("w") is None
        assert two.fail("no") is True
        assert queue.stats() == (1, 0, 0, 1)

    def test_pausing_one_queue_leaves_another_claimable(self, store: Store) -> None:
        paused, running = store.queue("paused"), store.queue("running")
        paused_id = paused.enqueue("p")
        running_id = running.enqueue("r")
        assert paused.pause()
        assert running.is_paused() is False
        claim_exactly(running, running_id)
        assert paused.claim_one("w") is None
        assert store.queue("paused").is_paused() is True
        assert paused.resume()
        claim_exactly(paused, paused_id)

    def test_the_pause_is_per_name_not_per_handle(self, store: Store) -> None:
        job_id = store.queue("jobs").enqueue("x")
        assert store.queue("jobs", QueueOpts(priority=5)).pause() is True
        assert store.queue("jobs").is_paused() is True
        assert store.queue("jobs").claim_one("w") is None
        assert store.queue("jobs", QueueOpts(max_attempts=1)).resume() is True
        claim_exactly(store.queue("jobs"), job_id)

    def test_the_pause_is_visible_to_another_store(
        self, queue: Queue, open_store: StoreFactory
    ) -> None:
        job_id = queue.enqueue("x")
        other = open_store().queue("jobs")
        assert queue.pause() is True
        assert other.is_paused() is True
        assert other.pause() is False
        assert other.claim_one("w") is None
        assert other.resume() is True
        assert queue.is_paused() is False
        assert queue.resume() is False
        claim_exactly(queue, job_id)

    def test_resume_wakes_a_subscriber(self, store: Store, queue: Queue) -> None:
        assert queue.pause()
        job_id = queue.enqueue("x")
        with store.listen("jobs") as sub:
            assert queue.resume() is True
            assert sub.wait(WAKE_TIMEOUT_S) is True
        claim_exactly(queue, job_id)

    def test_resume_through_another_store_wakes(
        self, store: Store, queue: Queue, open_store: StoreFactory
    ) -> None:
        other = open_store().queue("jobs")
        assert queue.pause()
        with store.listen("jobs") as sub:
            assert other.resume() is True
            assert sub.wait(WAKE_TIMEOUT_S) is True

    def test_pause_on_a_closed_store_raises(self, store: Store, queue: Queue) -> None:
        store.close()
        _assert_closed({"pause": queue.pause, "resume": queue.resume, "paused": queue.is_paused})


class QueueNamesTests(ContractFixtures):
    """``Store.queue_names``: the queues holding live or dead jobs or paused,
    sorted."""

    def test_names_of_live_dead_and_paused_queues(self, store: Store) -> None:
        assert store.queue_names() == []
        b, a, c = store.queue("b"), store.queue("a"), store.queue("c")
        d = store.queue("D")
        live = b.enqueue("live")
        _bury(a, "dead")
        assert c.pause()
        d.enqueue("x", delay=100)
        store.queue("never-used")
        assert store.queue_names() == ["D", "a", "b", "c"]
        assert claim_exactly(b, live).ack()
        assert a.purge_dead() == 1
        assert store.queue_names() == ["D", "c"]
        assert c.resume()
        assert store.queue_names() == ["D"]

    def test_queue_names_on_a_closed_store_raises(self, store: Store) -> None:
        store.close()
        _assert_closed({"queue_names": store.queue_names})


class DeadLetterOpsTests(ContractFixtures):
    """``Queue.dead_jobs``, ``requeue`` and ``purge_dead``."""

    # -- dead_jobs ------------------------------------------------------------

    def test_dead_jobs_pages_in_id_order(self, store: Store, queue: Queue) -> None:
        other = store.queue("other")
        ids = queue.enqueue_many([f"j{i}" for i in range(5)])
        live = queue.enqueue("live")
        handles = {h.id: h for h in queue.claim_batch("w", 5)}
        for job_id in (ids[3], ids[0], ids[4], ids[1], ids[2]):  # die out of id order
            assert handles[job_id].fail(f"e{job_id}")
        _bury(other, "foreign")
        first = queue.dead_jobs(limit=2)
        assert all(isinstance(j, Job) for j in first)
        assert [j.id for j in first] == ids[:2]
        second = queue.dead_jobs(limit=2, after_id=first[-1].id)
        assert [j.id for j in second] == ids[2:4]
        third = queue.dead_jobs(limit=2, after_id=second[-1].id)
        assert [j.id for j in third] == ids[4:]
        assert queue.dead_jobs(limit=2, after_id=ids[4]) == []
        assert [j.id for j in queue.dead_jobs()] == ids
        assert [j.id for j in queue.dead_jobs(after_id=0)] == ids
        assert [j.id for j in queue.dead_jobs(limit=10_000, after_id=ids[1] - 1)] == ids[1:]
        assert [j.id for j in queue.dead_jobs(1, ids[2])] == [ids[3]]
        assert queue.dead_jobs(after_id=10**12) == []
        for dead in queue.dead_jobs():
            assert dead == job(queue, dead.id)
            assert (dead.state, dead.last_error, dead.died_at) == ("dead", f"e{dead.id}", T0)
        assert live not in [j.id for j in queue.dead_jobs()]
        assert [j.payload for j in other.dead_jobs()] == ["foreign"]
        assert store.queue("empty").dead_jobs() == []

    @pytest.mark.parametrize(
        "arguments",
        [
            {"limit": 0},
            {"limit": -1},
            {"limit": 10_001},
            {"limit": True},
            {"limit": 1.0},
            {"limit": "5"},
            {"limit": None},
            {"after_id": -1},
            {"after_id": True},
            {"after_id": "1"},
            {"after_id": 1.5},
        ],
        ids=repr,
    )
    def test_dead_jobs_validation(self, queue: Queue, arguments: dict[str, Any]) -> None:
        _bury(queue, "x")
        with pytest.raises(ValidationError):
            queue.dead_jobs(**arguments)

    # -- requeue ----------------------------------------------------------------

    def test_requeue_restores_a_pending_job_with_its_fields(
        self, store: Store, clock: ManualClock
    ) -> None:
        q = store.queue(
            "jobs", QueueOpts(visibility_timeout_s=7, backoff_base_s=2, backoff_cap_s=50)
        )
        job_id = q.enqueue({"k": [1, "é"]}, priority=3, max_attempts=2, delay=5, expires=100)
        clock.set(at(5))
        assert claim_exactly(q, job_id, "w1").retry("first", delay=0)
        clock.set(at(15))
        assert claim_exactly(q, job_id, "w2").fail("final\x00error")
        died = job(q, job_id)
        assert (died.state, died.attempts, died.died_at) == ("dead", 2, at(15))
        clock.set(at(50))
        assert q.requeue(job_id, delay=10) is True
        back = job(q, job_id)
        assert back.state == "pending"
        # Attempts are kept (claims only count up), the budget renewed: 2 more.
        assert (back.id, back.queue, back.attempts, back.max_attempts) == (job_id, "jobs", 2, 4)
        assert (back.payload, back.payload_bytes, back.content_type) == (
            died.payload,
            died.payload_bytes,
            died.content_type,
        )
        assert (back.priority, back.enqueued_at) == (3, T0)
        assert (back.visibility_timeout_s, back.backoff_base_s, back.backoff_cap_s) == (7, 2, 50)
        assert (back.worker_id, back.claim_deadline, back.died_at) == (None, None, None)
        assert back.last_error == "final\ufffderror"
        # due after the delay; its 100 s expiry (expires_at - enqueued_at) again
        assert (back.run_at, back.expires_at) == (at(60), at(160))
        assert q.stats() == (0, 1, 0, 0)
        assert q.dead_jobs() == []
        clock.set(at(60) - MICRO)
        assert q.claim_one("w") is None
        clock.set(at(60))
        handle = claim_exactly(q, job_id, "w3")
        assert (handle.attempts, handle.claim_deadline, handle.expires_at) == (3, at(67), at(160))
        assert handle.retry("again", delay=0) is True
        handle = claim_exactly(q, job_id, "w4")
        assert (handle.attempts, handle.max_attempts) == (4, 4)
        assert handle.retry("last") is True  # at its budget again: dead
        again = job(q, job_id)
        assert (again.state, again.last_error, again.died_at) == (
            "dead",
            "max attempts exceeded",
            at(60),
        )

    def test_requeue_without_delay_is_due_now_and_keeps_no_expiry(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = _bury(queue, "x", "boom", delay=0)
        clock.set(at(500))
        assert queue.requeue(job_id) is True
        back = job(queue, job_id)
        assert (back.run_at, back.expires_at, back.attempts, back.last_error) == (
            at(500),
            None,
            1,
            "boom",
        )
        assert back.max_attempts == 6  # the default 5, renewed after its one claim
        assert queue.stats() == (1, 0, 0, 0)
        assert claim_exactly(queue, job_id).attempts == 2

    def test_requeue_gives_an_expired_job_its_window_again(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("x", delay=2, expires=10)
        clock.set(at(10))
        assert queue.sweep_expired() == (1, 0)
        assert job(queue, job_id).last_error == "expired"
        clock.set(at(100))
        assert queue.requeue(job_id, delay=timedelta(seconds=1)) is True
        back = job(queue, job_id)
        assert (back.run_at, back.expires_at, back.last_error) == (at(101), at(111), "expired")
        clock.set(at(101))
        claim_exactly(queue, job_id)

    @pytest.mark.parametrize("death", ["expired", "lapsed-on-its-last-attempt"])
    def test_a_handle_from_before_the_death_never_touches_the_requeued_claim(
        self, queue: Queue, clock: ManualClock, death: str
    ) -> None:
        """A claim is (id, attempts): requeue keeps attempts, so the claim after
        it is never mistaken for the one before (docs/contract.md §3 "Claim
        identity and handle validity")."""
        if death == "expired":
            job_id = queue.enqueue("x", expires=10)
            old = claim_exactly(queue, job_id, "w1")
            clock.advance(11)
            assert queue.sweep_expired() == (1, 0)
        else:
            job_id = queue.enqueue("x", max_attempts=1)
            old = claim_exactly(queue, job_id, "w1")
            clock.advance(31)
            assert queue.claim_one("w") is None  # the pre-claim sweep buries it
        assert job(queue, job_id).state == "dead"
        assert queue.requeue(job_id) is True
        new = claim_exactly(queue, job_id, "w2")
        assert new.attempts == old.attempts + 1
        deadline = new.claim_deadline
        assert old.heartbeat(60) is False
        assert old.retry("boom", delay=0) is False
        assert old.fail("boom") is False
        assert old.ack() is False
        now = job(queue, job_id)
        assert (now.state, now.worker_id, now.claim_deadline) == ("processing", "w2", deadline)
        assert new.ack() is True

    def test_requeue_renews_the_budget_up_to_its_ceiling(
        self, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = _bury(queue, "x", max_attempts=2**31 - 1)
        assert queue.requeue(job_id) is True
        back = job(queue, job_id)
        assert (back.attempts, back.max_attempts) == (1, 2**31 - 1)

    def test_requeue_of_a_live_unknown_or_foreign_job_is_false(
        self, store: Store, queue: Queue
    ) -> None:
        other = store.queue("other")
        working = queue.enqueue("working")
        claim_exactly(queue, working)
        pending = queue.enqueue("pending")
        foreign = _bury(other, "foreign")
        before = {i: job(queue, i) for i in (pending, working)}
        assert queue.requeue(pending) is False
        assert queue.requeue(working) is False
        assert queue.requeue(foreign) is False
        assert queue.requeue(10**12) is False
        assert queue.requeue(2**63) is False
        assert queue.requeue(-1) is False
        assert {i: job(queue, i) for i in (pending, working)} == before
        assert job(other, foreign).state == "dead"
        assert queue.stats() == (1, 0, 1, 0)
        assert other.stats() == (0, 0, 0, 1)

    def test_a_second_requeue_is_false(self, queue: Queue, clock: ManualClock) -> None:
        job_id = _bury(queue, "x")
        assert queue.requeue(job_id) is True
        clock.set(at(1))
        assert queue.requeue(job_id) is False
        assert queue.requeue(job_id, delay=5) is False
        assert job(queue, job_id).run_at == T0
        assert queue.stats() == (1, 0, 0, 0)

    def test_a_requeued_job_wakes_a_subscriber(self, store: Store, queue: Queue) -> None:
        job_id = _bury(queue, "x")
        with store.listen("jobs") as sub:
            assert queue.requeue(job_id) is True
            assert sub.wait(WAKE_TIMEOUT_S) is True
        assert claim_exactly(queue, job_id).payload == "x"

    def test_requeue_through_another_store(self, queue: Queue, open_store: StoreFactory) -> None:
        job_id = _bury(queue, "x")
        other = open_store().queue("jobs")
        assert other.requeue(job_id) is True
        assert queue.requeue(job_id) is False
        claim_exactly(queue, job_id)

    @pytest.mark.parametrize(
        "arguments",
        [
            {"job_id": "1"},
            {"job_id": None},
            {"job_id": True},
            {"job_id": 1.0},
            {"delay": -1},
            {"delay": float("nan")},
            {"delay": float("inf")},
            {"delay": True},
            {"delay": "5"},
            {"delay": timedelta(days=36526)},
        ],
        ids=repr,
    )
    def test_requeue_validation(self, queue: Queue, arguments: dict[str, Any]) -> None:
        job_id = _bury(queue, "x")
        options = {"job_id": job_id, **arguments}
        with pytest.raises(ValidationError):
            queue.requeue(options.pop("job_id"), **options)
        assert job(queue, job_id).state == "dead"

    # -- purge_dead ---------------------------------------------------------------

    def test_purge_dead_all(self, store: Store, queue: Queue) -> None:
        other = store.queue("other")
        ids = [_bury(queue, i) for i in range(3)]
        foreign = _bury(other, "foreign")
        live = queue.enqueue("live")
        assert queue.purge_dead() == 3
        assert [queue.get_job(i) for i in ids] == [None] * 3
        assert job(queue, live).state == "pending"
        assert job(other, foreign).state == "dead"
        assert queue.purge_dead() == 0
        assert queue.stats() == (1, 0, 0, 0)
        assert other.stats() == (0, 0, 0, 1)

    def test_purge_dead_older_than_boundary(self, store: Store, clock: ManualClock) -> None:
        """Purged iff ``died_at + older_than <= now``, the boundary included."""
        q = store.queue("jobs")
        other = store.queue("other")
        early = _bury(q, "early")
        foreign = _bury(other, "foreign")
        clock.set(at(50))
        middle = _bury(q, "middle")
        clock.set(at(60))
        late = _bury(q, "late")
        clock.set(at(150))
        assert q.purge_dead(older_than=100) == 2  # early (0 + 100 < 150), middle (50 + 100 == 150)
        assert q.get_job(early) is None
        assert q.get_job(middle) is None
        assert job(q, late).died_at == at(60)
        assert job(other, foreign).state == "dead"
        assert q.purge_dead(timedelta(seconds=90) + MICRO) == 0
        assert q.purge_dead(90) == 1
        assert q.get_job(late) is None
        assert q.purge_dead(0) == 0
        assert other.purge_dead(timedelta(seconds=150) + MICRO) == 0
        assert other.purge_dead(0) == 1

    def test_purge_dead_zero_purges_what_died_now(self, queue: Queue) -> None:
        job_id = _bury(queue, "x")
        assert queue.purge_dead(older_than=0) == 1
        assert queue.get_job(job_id) is None

    @pytest.mark.parametrize(
        "older_than",
        [-1, -0.5, float("nan"), True, "10", timedelta(seconds=-1), timedelta(days=36526)],
        ids=repr,
    )
    def test_purge_dead_validation(self, queue: Queue, older_than: object) -> None:
        job_id = _bury(queue, "x")
        with pytest.raises(ValidationError):
            queue.purge_dead(older_than)
        assert job(queue, job_id).state == "dead"

    def test_dead_letter_ops_on_a_closed_store_raise_before_validation(
        self, store: Store, queue: Queue
    ) -> None:
        job_id = _bury(queue, "x")
        store.close()
        _assert_closed(
            {
                "dead_jobs": queue.dead_jobs,
                "dead_jobs-bad": lambda: queue.dead_jobs(limit=0),
                "requeue": lambda: queue.requeue(job_id),
                "requeue-bad": lambda: queue.requeue(job_id, delay=-1),
                "purge_dead": queue.purge_dead,
                "purge_dead-bad": lambda: queue.purge_dead(-1),
            }
        )


class RunNowTests(ContractFixtures):
    """docs/contract.md §4 "Run now": a waiting job made due at once."""

    def test_a_job_waiting_out_its_backoff_runs_now(self, queue: Queue, clock: ManualClock) -> None:
        job_id = queue.enqueue("x", priority=3, expires=3600)
        assert claim_exactly(queue, job_id).retry("busy", delay=600)
        clock.advance(1)
        assert queue.claim_one("w") is None
        assert queue.run_now(job_id)
        waiting = job(queue, job_id)
        assert (waiting.state, waiting.run_at, waiting.attempts) == ("pending", at(1), 1)
        assert (waiting.priority, waiting.last_error, waiting.expires_at) == (3, "busy", at(3600))
        assert queue.stats() == (1, 0, 0, 0)
        assert claim_exactly(queue, job_id).attempts == 2

    def test_a_delayed_job_runs_now_and_wakes_the_queue(
        self, store: Store, queue: Queue, clock: ManualClock
    ) -> None:
        job_id = queue.enqueue("later", run_at=at(3600))
        with store.listen("jobs") as sub:
            assert queue.run_now(job_id)
            assert sub.wait(WAKE_TIMEOUT_S) is True
        assert job(queue, job_id).run_at == at(0)
        assert not queue.run_now(job_id)  # due already
        claim_exactly(queue, job_id)

    def test_only_a_waiting_job_of_this_queue_is_made_due(
        self, store: Store, queue: Queue, clock: ManualClock
    ) -> None:
        due = queue.enqueue("due")
        running = queue.enqueue("running")
        claim_exactly(queue, due)
        dead = queue.enqueue("dead")
        claim_exactly(queue, running)
        claim_exactly(queue, dead).fail("boom")
        expired = queue.enqueue("expired", delay=60, expires=100)
        elsewhere = store.queue("other").enqueue("elsewhere", delay=60)
        clock.advance(100)
        for job_id in (due, running, dead, expired, elsewhere, 10**15, -1, 2**70):
            assert not queue.run_now(job_id), job_id
        assert job(store.queue("other"), elsewhere).run_at == at(60)
        with pytest.raises(ValidationError):
            queue.run_now("1")  # type: ignore[arg-type]

    def test_a_closed_store_refuses_it(self, store: Store, queue: Queue) -> None:
        job_id = queue.enqueue("x", delay=60)
        store.close()
        _assert_closed({"run_now": lambda: queue.run_now(job_id)})
