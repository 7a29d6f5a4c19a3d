"""Schedules, the :class:`~alkstore.Scheduler` and the
:class:`~alkstore.Sweeper` (docs/schedules.md, docs/operations.md).

Every schedule here is ``@every`` or cron in UTC unless a test says
otherwise; T0 (2030-01-01T00:00:00Z) is a whole multiple of every
``@every`` interval used, so boundaries fall on ``T0 + k * interval``.
"""

from __future__ import annotations

import json
import logging
import threading
import traceback
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alkstore import (
    QueueOpts,
    Schedule,
    Scheduler,
    Store,
    Sweeper,
    SweepResult,
    UnreadableSchedule,
    ValidationError,
    enqueue_options,
    resolve,
)
from alkstore.engine import EncodedPayload
from alkstore_contract_tests import _children
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import (
    ContractFixtures,
    StoreFactory,
    assert_utc,
    at,
    claim_exactly,
    job,
)
from alkstore_contract_tests.harness import JOB_INSERT_FAULT, StoreTarget
from alkstore_contract_tests.suite.concurrency import (
    BARRIER_TIMEOUT_S,
    ProcessConcurrencyTests,
    _Crew,
    _Spawner,
    rounds,
)
from alkstore_contract_tests.suite.operations import _assert_closed, _bury
from alkstore_contract_tests.suite.wake import WAKE_TIMEOUT_S

__all__ = ["ScheduleTests", "SchedulerConcurrencyTests", "SweeperTests"]

MICRO = timedelta(microseconds=1)
#: The maintenance task name :class:`Sweeper` takes its turns under.
SWEEP_TASK = "sweep_expired"


def _only(store: Store) -> Schedule:
    """The store's one schedule."""
    (schedule,) = store.schedules()
    return schedule


def _named(store: Store, name: str) -> Schedule:
    """The store's schedule ``name``."""
    (schedule,) = [s for s in store.schedules() if s.name == name]
    return schedule


def _with_option(schedule: Schedule, key: str, value: object) -> str:
    """``schedule``'s stored options text with ``key`` set to ``value``."""
    options = json.loads(schedule.options_json)
    options[key] = value
    return json.dumps(options)


def _with_queue_option(schedule: Schedule, key: str, value: object) -> str:
    """``schedule``'s stored options text with the queue option ``key``
    set to ``value``."""
    options = json.loads(schedule.options_json)
    options["queue_opts"][key] = value
    return json.dumps(options)


def _fire(store: Store, schedule: Schedule, boundary: datetime, next_run_at: datetime) -> Any:
    """Call the engine's ``_fire_schedule`` as a tick holding ``schedule``
    (a possibly stale snapshot) would."""
    resolved = resolve(store._now(), schedule.queue_opts, enqueue_options(run_at=boundary))
    payload = EncodedPayload(schedule.payload_bytes, schedule.content_type)
    return store._fire_schedule(schedule, boundary, next_run_at, resolved, payload)


class ScheduleTests(ContractFixtures):
    """``Store.schedule``/``unschedule``/``schedules`` and
    ``Scheduler.tick``, with the test's clock."""

    # -- saving ---------------------------------------------------------------

    def test_schedule_returns_what_is_stored(self, store: Store, clock: ManualClock) -> None:
        clock.set(at(3))
        saved = store.schedule("tick", "@every 10s", "jobs", {"n": 1})
        assert isinstance(saved, Schedule)
        assert (saved.name, saved.spec, saved.timezone, saved.queue) == (
            "tick",
            "@every 10s",
            "UTC",
            "jobs",
        )
        assert (saved.payload, saved.payload_bytes, saved.content_type) == (
            {"n": 1},
            b'{"n":1}',
            "application/json",
        )
        assert (saved.priority, saved.max_attempts, saved.expires_s) == (None, None, None)
        assert (saved.queue_opts, saved.catch_up) == (QueueOpts(), "latest")
        assert (saved.revision, saved.created_at, saved.next_run_at) == (1, at(3), at(10))
        assert (saved.last_run_at, saved.last_job_id) == (None, None)
        for instant in (saved.created_at, saved.next_run_at):
            assert_utc(instant)
        assert store.schedules() == [saved]
        assert store.queue("jobs").stats() == (0, 0, 0, 0)

    def test_next_run_at_is_strictly_after_now(self, store: Store) -> None:
        """Saved exactly on a boundary, the first boundary is the next one."""
        assert store.schedule("s", "@every 10s", "jobs", 1).next_run_at == at(10)
        assert store.schedule("m", "* * * * *", "jobs", 1).next_run_at == at(60)
        assert store.schedule("d", "@daily", "jobs", 1).next_run_at == at(86_400)

    def test_options_and_a_queue_handle_are_stored(self, store: Store) -> None:
        opts = QueueOpts(visibility_timeout_s=7, max_attempts=9, priority=2, expires_s=50)
        saved = store.schedule(
            "s",
            "30 2 * * *",
            store.queue("reports", opts),
            b"\x00raw",
            timezone="America/New_York",
            catch_up="skip",
            priority=4,
            max_attempts=3,
            expires=timedelta(seconds=20),
        )
        assert (saved.queue, saved.queue_opts, saved.catch_up) == ("reports", opts, "skip")
        assert (saved.priority, saved.max_attempts, saved.expires_s) == (4, 3, 20)
        assert (saved.payload, saved.content_type) == (b"\x00raw", "application/octet-stream")
        assert (saved.spec, saved.timezone) == ("30 2 * * *", "America/New_York")
        # T0 is 2029-12-31 19:00 in New York: the next 02:30 there is 07:30Z
        assert saved.next_run_at == datetime(2030, 1, 1, 7, 30, tzinfo=UTC)
        assert store.schedules() == [saved]

    def test_replacing_bumps_the_revision_and_restarts(
        self, store: Store, clock: ManualClock
    ) -> None:
        store.schedule("s", "@every 10s", "jobs", "old")
        clock.set(at(10))
        (fired,) = Scheduler(store).tick()
        fired_once = _only(store)
        assert (fired_once.revision, fired_once.last_run_at, fired_once.last_job_id) == (
            1,
            at(10),
            fired,
        )
        assert fired_once.next_run_at == at(20)
        clock.set(at(12))
        replaced = store.schedule("s", "@every 1m", "other", "new", priority=1)
        assert (replaced.revision, replaced.created_at, replaced.next_run_at) == (2, at(12), at(60))
        assert (replaced.last_run_at, replaced.last_job_id) == (None, None)
        assert (replaced.spec, replaced.queue, replaced.payload, replaced.priority) == (
            "@every 1m",
            "other",
            "new",
            1,
        )
        assert store.schedules() == [replaced]
        assert store.schedule("s", "@every 1m", "other", "new").revision == 3
        assert job(store.queue("jobs"), fired).payload == "old"

    def test_saving_the_same_definition_again_keeps_a_due_boundary(
        self, store: Store, clock: ManualClock
    ) -> None:
        """Startup code saving its schedules on every start must not drop the
        boundary that came due just before (docs/schedules.md)."""
        saved = store.schedule("s", "@every 10s", "jobs", {"k": 1}, priority=2)
        clock.set(at(10) + MICRO)  # due, not yet ticked
        again = store.schedule("s", "@every 10s", "jobs", {"k": 1}, priority=2)
        assert again == saved
        assert again.revision == 1
        (fired,) = Scheduler(store).tick()
        assert job(store.queue("jobs"), fired).run_at == at(10)

    def test_a_re_save_that_enqueues_the_same_jobs_is_the_same_definition(
        self, store: Store, clock: ManualClock
    ) -> None:
        """Defaults spelled out and JSON key order do not change the jobs;
        a payload of another JSON type does (``True`` is not ``1``)."""
        saved = store.schedule("s", "@every 10s", "jobs", {"a": 1, "b": 2})
        assert store.schedule("s", "@every 10s", "jobs", {"b": 2, "a": 1}) == saved
        assert store.schedule("s", "@every 10s", "jobs", {"a": 1, "b": 2}, priority=0) == saved
        assert store.schedule("s", "@every 10s", "jobs", {"a": 1, "b": 2}, max_attempts=5) == saved
        assert store.schedule("s", "@every 10s", "jobs", {"a": True, "b": 2}).revision == 2
        assert store.schedule("s", "@every 10s", "jobs", {"a": 1.0, "b": 2}).revision == 3

    def test_schedules_are_listed_by_name(self, store: Store) -> None:
        for name in ("b", "a", "C", "a.1"):
            store.schedule(name, "@hourly", "jobs", name)
        assert [s.name for s in store.schedules()] == ["C", "a", "a.1", "b"]

    def test_unschedule(self, store: Store) -> None:
        store.schedule("a", "@hourly", "jobs", 1)
        store.schedule("b", "@hourly", "jobs", 2)
        assert store.unschedule("a") is True
        assert store.unschedule("a") is False
        assert store.unschedule("never") is False
        assert [s.name for s in store.schedules()] == ["b"]
        assert store.schedule("a", "@hourly", "jobs", 3).revision == 1

    @pytest.mark.parametrize(
        ("arguments", "options"),
        [
            (("", "@every 10s", "jobs", 1), {}),
            (("a b", "@every 10s", "jobs", 1), {}),
            (("__alkstore_x", "@every 10s", "jobs", 1), {}),
            (("s" * 129, "@every 10s", "jobs", 1), {}),
            ((5, "@every 10s", "jobs", 1), {}),
            (("s", "not a cron", "jobs", 1), {}),
            (("s", "61 * * * *", "jobs", 1), {}),
            (("s", "* * * *", "jobs", 1), {}),
            (("s", "0 0 30 2 *", "jobs", 1), {}),
            (("s", "@every 0s", "jobs", 1), {}),
            (("s", "@every", "jobs", 1), {}),
            (("s", "@reboot", "jobs", 1), {}),
            (("s", "", "jobs", 1), {}),
            (("s", 5, "jobs", 1), {}),
            (("s", "@hourly", "jobs", 1), {"timezone": "Mars/Olympus_Mons"}),
            (("s", "@hourly", "jobs", 1), {"timezone": ""}),
            (("s", "@hourly", "jobs", 1), {"timezone": "localtime"}),
            (("s", "@hourly", "jobs", 1), {"timezone": None}),
            (("s", "@hourly", "bad name!", 1), {}),
            (("s", "@hourly", "", 1), {}),
            (("s", "@hourly", None, 1), {}),
            (("s", "@hourly", "jobs", float("nan")), {}),
            (("s", "@hourly", "jobs", {1: "int key"}), {}),
            (("s", "@hourly", "jobs", ("tuple",)), {}),
            (("s", "@hourly", "jobs", 1), {"delay": 5}),
            (("s", "@hourly", "jobs", 1), {"delay": 0}),
            (("s", "@hourly", "jobs", 1), {"run_at": T0}),
            (("s", "@hourly", "jobs", 1), {"foo": 1}),
            (("s", "@hourly", "jobs", 1), {"priority": True}),
            (("s", "@hourly", "jobs", 1), {"priority": 2**31}),
            (("s", "@hourly", "jobs", 1), {"max_attempts": 0}),
            (("s", "@hourly", "jobs", 1), {"expires": 0}),
            (("s", "@hourly", "jobs", 1), {"expires": -1}),
            (("s", "@hourly", "jobs", 1), {"catch_up": "all"}),
            (("s", "@hourly", "jobs", 1), {"catch_up": "LATEST"}),
            (("s", "@hourly", "jobs", 1), {"catch_up": None}),
        ],
        ids=repr,
    )
    def test_invalid_schedule_is_refused_and_nothing_written(
        self,
        store: Store,
        clock: ManualClock,
        arguments: tuple[Any, ...],
        options: dict[str, Any],
    ) -> None:
        kept = store.schedule("s", "@every 10s", "jobs", "kept")
        with pytest.raises(ValidationError):
            store.schedule(*arguments, **options)
        assert store.schedules() == [kept]
        clock.set(at(10))
        (job_id,) = Scheduler(store).tick()
        assert job(store.queue("jobs"), job_id).payload == "kept"

    def test_a_queue_of_another_store_is_refused(
        self, store: Store, open_store: StoreFactory
    ) -> None:
        with pytest.raises(ValidationError):
            store.schedule("s", "@hourly", open_store().queue("jobs"), 1)
        with pytest.raises(ValidationError):
            store.unschedule("bad name!")
        assert store.schedules() == []

    # -- ticking ----------------------------------------------------------------

    def test_tick_fires_at_the_boundary_and_not_before(
        self, store: Store, clock: ManualClock
    ) -> None:
        opts = QueueOpts(
            visibility_timeout_s=7,
            max_attempts=9,
            priority=2,
            backoff_base_s=3,
            backoff_cap_s=30,
            expires_s=50,
        )
        q = store.queue("jobs", opts)
        store.schedule("s", "@every 10s", q, {"k": "v"}, priority=4, max_attempts=3, expires=20)
        scheduler = Scheduler(store)
        clock.set(at(10) - MICRO)
        assert scheduler.tick() == []
        assert q.stats() == (0, 0, 0, 0)
        clock.set(at(10))
        fired = scheduler.tick()
        assert len(fired) == 1
        got = job(q, fired[0])
        assert (got.queue, got.state, got.payload, got.attempts) == (
            "jobs",
            "pending",
            {"k": "v"},
            0,
        )
        assert (got.run_at, got.enqueued_at, got.expires_at) == (at(10), at(10), at(30))
        assert (got.priority, got.max_attempts, got.visibility_timeout_s) == (4, 3, 7)
        assert (got.backoff_base_s, got.backoff_cap_s) == (3, 30)
        assert (got.worker_id, got.claim_deadline, got.last_error, got.died_at) == (
            None,
            None,
            None,
            None,
        )
        after = _only(store)
        assert (after.revision, after.next_run_at, after.last_run_at, after.last_job_id) == (
            1,
            at(20),
            at(10),
            fired[0],
        )
        assert scheduler.tick() == []
        clock.set(at(20) - MICRO)
        assert scheduler.tick() == []
        assert q.stats() == (1, 0, 0, 0)
        clock.set(at(23))  # three seconds late: the boundary still fires
        (late,) = scheduler.tick()
        got = job(q, late)
        assert (got.run_at, got.enqueued_at, got.expires_at) == (at(20), at(23), at(43))
        assert late > fired[0]
        assert _only(store).next_run_at == at(30)

    def test_the_queue_opts_stamp_what_the_schedule_leaves_open(
        self, store: Store, clock: ManualClock
    ) -> None:
        opts = QueueOpts(visibility_timeout_s=7, max_attempts=9, priority=2, expires_s=50)
        store.schedule("opts", "@every 10s", store.queue("a", opts), "a")
        store.schedule("plain", "@every 10s", "b", "b")
        clock.set(at(10))
        fired = Scheduler(store).tick()
        assert len(fired) == 2
        first, second = sorted(fired, key=lambda i: store.queue("a").get_job(i) is None)
        got = job(store.queue("a"), first)
        assert (got.priority, got.max_attempts, got.visibility_timeout_s, got.expires_at) == (
            2,
            9,
            7,
            at(60),
        )
        got = job(store.queue("b"), second)
        assert (got.priority, got.max_attempts, got.visibility_timeout_s, got.expires_at) == (
            0,
            5,
            30,
            None,
        )
        assert (got.backoff_base_s, got.backoff_cap_s, got.run_at) == (4, 3600, at(10))

    def test_a_cron_schedule_fires_in_its_time_zone(self, store: Store, clock: ManualClock) -> None:
        store.schedule("s", "30 2 * * *", "jobs", 1, timezone="America/New_York")
        boundary = datetime(2030, 1, 1, 7, 30, tzinfo=UTC)
        clock.set(boundary - MICRO)
        assert Scheduler(store).tick() == []
        clock.set(boundary)
        (job_id,) = Scheduler(store).tick()
        assert job(store.queue("jobs"), job_id).run_at == boundary
        assert _only(store).next_run_at == boundary + timedelta(days=1)

    def test_two_schedulers_at_the_same_instant_fire_once(
        self, store: Store, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        store.schedule("s", "@every 10s", "jobs", 1)
        clock.set(at(10))
        other = Scheduler(open_store())
        (job_id,) = Scheduler(store).tick()
        assert other.tick() == []
        assert Scheduler(store).tick() == []
        assert store.queue("jobs").stats() == (1, 0, 0, 0)
        assert _only(store).last_job_id == job_id

    def test_catch_up_latest_fires_the_latest_missed_boundary_once(
        self, store: Store, clock: ManualClock
    ) -> None:
        q = store.queue("jobs")
        store.schedule("s", "@every 10s", "jobs", "x", expires=100)
        scheduler = Scheduler(store, misfire_grace_s=2)
        clock.set(at(35))  # an outage over the boundaries 10, 20 and 30
        (caught_up,) = scheduler.tick()
        got = job(q, caught_up)
        assert (got.run_at, got.enqueued_at, got.expires_at) == (at(30), at(35), at(135))
        assert (_only(store).last_run_at, _only(store).next_run_at) == (at(30), at(40))
        assert scheduler.tick() == []
        clock.set(at(40))
        (on_time,) = scheduler.tick()
        assert job(q, on_time).run_at == at(40)
        clock.set(at(10_005))  # far past any grace: "latest" still fires, once
        (long_after,) = scheduler.tick()
        assert job(q, long_after).run_at == at(10_000)
        assert scheduler.tick() == []
        assert q.stats() == (3, 0, 0, 0)

    def test_catch_up_skip_fires_no_boundary_older_than_the_grace(
        self, store: Store, clock: ManualClock
    ) -> None:
        q = store.queue("jobs")
        store.schedule("s", "@every 10s", "jobs", "x", catch_up="skip")
        scheduler = Scheduler(store, misfire_grace_s=2)
        clock.set(at(35))  # boundaries 10, 20 and 30 missed; 30 is 5 s old
        assert scheduler.tick() == []
        skipped = _only(store)
        assert (skipped.next_run_at, skipped.last_run_at, skipped.last_job_id) == (
            at(40),
            None,
            None,
        )
        assert q.stats() == (0, 0, 0, 0)
        assert scheduler.tick() == []
        clock.set(at(40))
        (on_time,) = scheduler.tick()
        assert job(q, on_time).run_at == at(40)
        clock.set(at(52))  # exactly the grace late: fires
        (late,) = scheduler.tick()
        assert (job(q, late).run_at, job(q, late).enqueued_at) == (at(50), at(52))
        clock.set(at(62) + MICRO)  # just over the grace: skipped
        assert scheduler.tick() == []
        assert _only(store).next_run_at == at(70)
        assert q.stats() == (2, 0, 0, 0)

    def test_a_replaced_schedule_does_not_fire_its_stale_revision(
        self, store: Store, clock: ManualClock
    ) -> None:
        """A tick that read revision 1 and fires after a replacement fires
        nothing: ``_fire_schedule``'s guard (docs/schedules.md)."""
        q = store.queue("jobs")
        stale = store.schedule("s", "@every 10s", "jobs", "old")
        current = store.schedule("s", "@every 10s", "jobs", "new")
        assert (stale.next_run_at, current.next_run_at, current.revision) == (at(10), at(10), 2)
        clock.set(at(10))
        assert _fire(store, stale, at(10), at(20)) is None
        assert store._skip_schedule(stale, at(20)) is False
        assert q.stats() == (0, 0, 0, 0)
        assert store.schedules() == [current]
        (job_id,) = Scheduler(store).tick()
        assert job(q, job_id).payload == "new"

    def test_a_fired_boundary_does_not_fire_again_from_a_stale_read(
        self, store: Store, clock: ManualClock
    ) -> None:
        """A tick that read the schedule before another tick fired the same
        boundary fires nothing."""
        q = store.queue("jobs")
        store.schedule("s", "@every 10s", "jobs", "x")
        clock.set(at(10))
        (read_early,) = store._list_schedules(clock())
        assert isinstance(read_early, Schedule)
        (job_id,) = Scheduler(store).tick()
        assert _fire(store, read_early, at(10), at(20)) is None
        assert store._skip_schedule(read_early, at(20)) is False
        assert q.stats() == (1, 0, 0, 0)
        assert _only(store).last_job_id == job_id
        assert _only(store).next_run_at == at(20)

    def test_a_deleted_schedule_does_not_fire_from_a_stale_read(
        self, store: Store, clock: ManualClock
    ) -> None:
        stale = store.schedule("s", "@every 10s", "jobs", "x")
        assert store.unschedule("s")
        clock.set(at(10))
        assert _fire(store, stale, at(10), at(20)) is None
        assert store._skip_schedule(stale, at(20)) is False
        assert store.schedules() == []
        assert store.queue("jobs").stats() == (0, 0, 0, 0)

    def test_unschedule_stops_firing(self, store: Store, clock: ManualClock) -> None:
        q = store.queue("jobs")
        store.schedule("s", "@every 10s", "jobs", "x")
        clock.set(at(10))
        (job_id,) = Scheduler(store).tick()
        assert store.unschedule("s") is True
        for second in (20, 30, 1000):
            clock.set(at(second))
            assert Scheduler(store).tick() == []
        assert q.stats() == (1, 0, 0, 0)
        assert job(q, job_id).run_at == at(10)

    def test_only_due_schedules_fire_in_boundary_order(
        self, store: Store, clock: ManualClock
    ) -> None:
        store.schedule("later", "@every 30s", "jobs", "later")
        store.schedule("sooner", "@every 20s", "jobs", "sooner")
        store.schedule("never", "@daily", "jobs", "never")
        clock.set(at(30))
        q = store.queue("jobs")
        fired = Scheduler(store).tick()
        assert [job(q, i).payload for i in fired] == ["sooner", "later"]
        assert [job(q, i).run_at for i in fired] == [at(20), at(30)]

    def test_a_fire_wakes_the_queue_and_lands_in_a_paused_queue(
        self, store: Store, clock: ManualClock
    ) -> None:
        q = store.queue("jobs")
        assert q.pause()
        store.schedule("s", "@every 10s", "jobs", "x")
        clock.set(at(10))
        with store.listen("jobs") as sub:
            (job_id,) = Scheduler(store).tick()
            assert sub.wait(WAKE_TIMEOUT_S) is True
        assert q.claim_one("w") is None
        assert q.stats() == (1, 0, 0, 0)
        assert q.resume()
        claim_exactly(q, job_id)

    # -- one schedule that cannot fire (regression case 014) -------------------------

    #: Healthy schedules beside the bad one in case 014, and boundaries ticked.
    CASE_014_SCHEDULES = 100
    CASE_014_BOUNDARIES = 5

    @staticmethod
    def _scheduler_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
        """The ERROR messages the scheduler logged so far."""
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "alkstore.scheduler" and r.levelno >= logging.ERROR
        ]

    def _save_case_014(self, store: Store) -> None:
        """The 100 healthy ``@every 60s`` schedules, payloads 0 to 99."""
        for i in range(self.CASE_014_SCHEDULES):
            store.schedule(f"s{i:03d}", "@every 60s", "jobs", i)

    def _tick_case_014(self, store: Store, scheduler: Scheduler, clock: ManualClock) -> None:
        """Tick five boundaries: each fires every healthy schedule once."""
        q = store.queue("jobs")
        for k in range(1, self.CASE_014_BOUNDARIES + 1):
            clock.set(at(60 * k))
            fired = scheduler.tick()
            assert sorted(job(q, i).payload for i in fired) == list(
                range(self.CASE_014_SCHEDULES)
            ), f"boundary {k}"
            assert {job(q, i).run_at for i in fired} == {at(60 * k)}
        assert q.stats() == (self.CASE_014_SCHEDULES * self.CASE_014_BOUNDARIES, 0, 0, 0)

    def test_case_014_a_schedule_whose_job_cannot_be_inserted_stops_no_other(
        self,
        store: Store,
        clock: ManualClock,
        alkstore_target: StoreTarget,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Its insert fails every time (a trigger): the others fire on every
        boundary, its row is left exactly as it was (the failed fire wrote
        nothing, so the guard of D17 holds), it is reported once, and it
        fires its latest boundary once as soon as the fault is gone."""
        self._save_case_014(store)
        store.schedule("poisoned", "@every 60s", "poison", "p")
        scheduler = Scheduler(store)
        poison = store.queue("poison")
        with (
            caplog.at_level(logging.INFO, logger="alkstore.scheduler"),
            self.job_inserts_fail(alkstore_target, "poison"),
        ):
            self._tick_case_014(store, scheduler, clock)
            stuck = _named(store, "poisoned")
            assert (stuck.revision, stuck.next_run_at, stuck.last_run_at, stuck.last_job_id) == (
                1,
                at(60),
                None,
                None,
            )
            assert poison.stats() == (0, 0, 0, 0)
        (error,) = self._scheduler_errors(caplog)
        assert "'poisoned'" in error
        assert JOB_INSERT_FAULT in error
        # the fault is gone: retried on the next tick, its latest boundary once
        (late,) = scheduler.tick()
        assert (job(poison, late).payload, job(poison, late).run_at) == ("p", at(300))
        assert scheduler.tick() == []
        healed = _named(store, "poisoned")
        assert (healed.next_run_at, healed.last_run_at, healed.last_job_id) == (
            at(360),
            at(300),
            late,
        )
        clock.set(at(360))
        assert len(scheduler.tick()) == self.CASE_014_SCHEDULES + 1
        assert self._scheduler_errors(caplog) == [error]
        assert store.unschedule("poisoned") is True
        assert len(store.schedules()) == self.CASE_014_SCHEDULES

    def test_case_014_a_schedule_row_from_a_newer_release_stops_no_other(
        self,
        store: Store,
        clock: ManualClock,
        alkstore_target: StoreTarget,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A stored row with a queue option this version does not know (a
        newer release saved it during a rolling deploy) is unreadable here:
        skipped by every tick and reported once, named by
        ``unreadable_schedules()``, and it stops neither the listing, nor
        saving other schedules, nor deleting or replacing it (docs/decisions.md
        D27)."""
        self._save_case_014(store)
        newer = store.schedule("newer", "@every 60s", "jobs", "newer")
        self.overwrite_schedule_column(
            alkstore_target, "newer", "options", _with_queue_option(newer, "lease_renewal_s", 5)
        )
        scheduler = Scheduler(store)
        with caplog.at_level(logging.INFO, logger="alkstore.scheduler"):
            self._tick_case_014(store, scheduler, clock)
        (error,) = self._scheduler_errors(caplog)
        assert "'newer'" in error
        assert "lease_renewal_s" in error
        listed = store.schedules()
        assert [s.name for s in listed] == [f"s{i:03d}" for i in range(self.CASE_014_SCHEDULES)]
        (unreadable,) = store.unreadable_schedules()
        assert isinstance(unreadable, UnreadableSchedule)
        assert (unreadable.name, unreadable.revision) == ("newer", 1)
        assert "lease_renewal_s" in unreadable.reason
        store.schedule("another", "@every 60s", "jobs", "another")
        replaced = store.schedule("newer", "@every 60s", "jobs", "replaced")
        assert (replaced.revision, replaced.payload) == (2, "replaced")
        assert replaced.next_run_at == at(360)
        assert store.unreadable_schedules() == []
        clock.set(at(360))
        fired = scheduler.tick()
        payloads = [job(store.queue("jobs"), i).payload for i in fired]
        assert len(payloads) == self.CASE_014_SCHEDULES + 2
        assert {"another", "replaced"} <= set(payloads)
        assert self._scheduler_errors(caplog) == [error]
        self.overwrite_schedule_column(
            alkstore_target, "newer", "options", _with_queue_option(replaced, "lease_renewal_s", 5)
        )
        assert store.unschedule("newer") is True
        assert store.unreadable_schedules() == []
        assert "newer" not in {s.name for s in store.schedules()}

    @pytest.mark.parametrize(
        ("column", "value", "reason"),
        [
            ("options", lambda s: _with_queue_option(s, "lease_renewal_s", 5), "lease_renewal_s"),
            ("options", lambda s: _with_option(s, "jitter_s", 10), "jitter_s"),
            ("options", lambda s: _with_queue_option(s, "max_attempts", 0), "max_attempts"),
            ("options", lambda s: _with_option(s, "priority", 2**40), "priority"),
            ("options", lambda s: _with_option(s, "catch_up", "all"), "'all'"),
            ("options", lambda s: "{not json", "options"),
            ("options", lambda s: "[]", "options"),
            ("spec", lambda s: "@fortnightly", "@fortnightly"),
            ("timezone", lambda s: "Nowhere/Zone", "Nowhere/Zone"),
            ("queue", lambda s: "bad queue!", "bad queue!"),
            ("content_type", lambda s: "application/msgpack", "application/msgpack"),
            ("payload_bytes", lambda s: b"\xff{", "payload"),
        ],
        ids=[
            "unknown-queue-option",
            "unknown-schedule-option",
            "queue-option-out-of-rule",
            "priority-out-of-rule",
            "unknown-catch-up",
            "options-not-json",
            "options-not-an-object",
            "unknown-spec",
            "unknown-zone",
            "bad-queue-name",
            "unknown-content-type",
            "payload-not-json",
        ],
    )
    def test_an_unreadable_schedule_is_skipped_listed_replaced_and_deleted(
        self,
        *,
        store: Store,
        clock: ManualClock,
        alkstore_target: StoreTarget,
        caplog: pytest.LogCaptureFixture,
        column: str,
        value: Any,
        reason: str,
    ) -> None:
        """Whatever makes a stored row unusable here, it is the only one
        skipped: ordered first by ``next_run_at`` (it never advances), it
        does not starve the schedules after it."""
        bad = store.schedule("bad", "@every 10s", "jobs", "bad")
        store.schedule("gone", "@every 10s", "jobs", "gone")
        store.schedule("a", "@every 20s", "jobs", "a")
        store.schedule("z", "@every 20s", "jobs", "z")
        for name in ("bad", "gone"):
            self.overwrite_schedule_column(alkstore_target, name, column, value(bad))
        q = store.queue("jobs")
        scheduler = Scheduler(store)
        with caplog.at_level(logging.INFO, logger="alkstore.scheduler"):
            for second in (20, 40, 60):
                clock.set(at(second))
                assert sorted(job(q, i).payload for i in scheduler.tick()) == ["a", "z"]
        errors = self._scheduler_errors(caplog)
        assert len(errors) == 2, errors  # once per schedule and revision
        assert all(reason in error for error in errors), errors
        assert [s.name for s in store.schedules()] == ["a", "z"]
        unreadable = store.unreadable_schedules()
        assert [(u.name, u.revision) for u in unreadable] == [("bad", 1), ("gone", 1)]
        assert all(reason in u.reason for u in unreadable), unreadable
        assert store.unschedule("gone") is True
        assert store.unschedule("gone") is False
        fixed = store.schedule("bad", "@every 10s", "jobs", "fixed")
        assert (fixed.revision, fixed.next_run_at) == (2, at(70))
        assert store.unreadable_schedules() == []
        clock.set(at(80))
        assert sorted(job(q, i).payload for i in scheduler.tick()) == ["a", "fixed", "z"]
        assert len(self._scheduler_errors(caplog)) == 2

    def test_scheduler_validation(self, store: Store) -> None:
        for grace in (-1, float("nan"), True, "60"):
            with pytest.raises(ValidationError):
                Scheduler(store, misfire_grace_s=grace)
        Scheduler(store, misfire_grace_s=0)

    def test_schedules_on_a_closed_store_raise(self, store: Store) -> None:
        store.schedule("s", "@hourly", "jobs", 1)
        scheduler = Scheduler(store)
        store.close()
        _assert_closed(
            {
                "schedule": lambda: store.schedule("s", "@hourly", "jobs", 1),
                "schedule-bad": lambda: store.schedule("", "nonsense", "", float("nan")),
                "unschedule": lambda: store.unschedule("s"),
                "unschedule-bad": lambda: store.unschedule(""),
                "schedules": store.schedules,
                "unreadable_schedules": store.unreadable_schedules,
                "tick": scheduler.tick,
            }
        )


class SchedulerConcurrencyTests(ContractFixtures):
    """Exactly one job per boundary however many schedulers tick at once:
    threads with their own stores, and separate processes."""

    TICKERS = 6
    TICKING_PROCESSES = 4

    def test_threads_ticking_together_fire_each_boundary_once(
        self, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        total = rounds("ALKSTORE_SCHEDULER_RACE_ROUNDS", 30)
        owner = open_store()
        owner.schedule("ten", "@every 10s", "jobs", "ten")
        owner.schedule("twenty", "@every 20s", "jobs", "twenty")
        schedulers = [Scheduler(open_store()) for _ in range(self.TICKERS)]
        q = owner.queue("jobs")
        for round_ in range(1, total + 1):
            clock.set(at(10 * round_))
            barrier = threading.Barrier(self.TICKERS)
            fired: list[list[int]] = [[] for _ in range(self.TICKERS)]

            def ticker(
                index: int, barrier: threading.Barrier = barrier, fired: list[Any] = fired
            ) -> None:
                barrier.wait(BARRIER_TIMEOUT_S)
                fired[index] = schedulers[index].tick() + schedulers[index].tick()

            with _Crew(self.TICKERS, ticker) as crew:
                pass
            assert crew.errors == [], crew.errors[0] if crew.errors else ""
            ids = [i for got in fired for i in got]
            expected = ["ten", "twenty"] if round_ % 2 == 0 else ["ten"]
            assert len(ids) == len(set(ids))
            assert sorted(job(q, i).payload for i in ids) == expected, f"round {round_}: {fired}"
            assert {job(q, i).run_at for i in ids} == {at(10 * round_)}
            assert q.ack_batch([claim.id for claim in q.claim_batch("w", 10)]) == len(ids)

    @pytest.fixture
    def spawner(self, alkstore_target: StoreTarget) -> Iterator[_Spawner]:
        """As :class:`ProcessConcurrencyTests`' ``spawn``."""
        if not self.spawned_processes_can_open:
            pytest.skip("this engine's harness cannot open its target in a spawned process")
        spawner = _Spawner(
            (
                alkstore_target.url,
                dict(alkstore_target.options),
                T0.isoformat(),
                tuple(self.child_process_imports),
            )
        )
        yield spawner
        spawner.stop()

    @pytest.mark.slow
    def test_processes_ticking_together_fire_each_boundary_once(
        self, spawner: _Spawner, store: Store, clock: ManualClock
    ) -> None:
        """Four processes tick the same due boundaries at once, three times
        each per boundary (their clocks are one shared value the parent
        moves): one job per boundary in total."""
        total = rounds("ALKSTORE_SCHEDULER_PROCESS_ROUNDS", 20)
        store.schedule("ten", "@every 10s", "jobs", "ten")
        q = store.queue("jobs")
        ctx: Any = spawner.ctx
        micros = ctx.Value("q", _children.epoch_us(T0), lock=False)
        barrier = ctx.Barrier(self.TICKING_PROCESSES + 1)
        results = ctx.Queue()
        processes = [
            spawner(
                _children.scheduler_tick_child,
                index=i,
                rounds=total,
                ticks=3,
                micros=micros,
                barrier=barrier,
                results=results,
            )
            for i in range(self.TICKING_PROCESSES)
        ]
        fired: Counter[datetime] = Counter()
        try:
            for round_ in range(total):
                boundary = at(10 * (round_ + 1))
                micros.value = _children.epoch_us(boundary)
                clock.set(boundary)
                barrier.wait(BARRIER_TIMEOUT_S)
                barrier.wait(BARRIER_TIMEOUT_S)
                reports = ProcessConcurrencyTests.collect(
                    results, self.TICKING_PROCESSES, processes
                )
                errors = [r[4] for r in reports if r[4] is not None]
                assert errors == [], errors[0] if errors else ""
                assert {r[1] for r in reports} == {round_}
                ids = [i for r in reports for i in r[3]]
                assert len(ids) == 1, f"boundary {boundary}: {reports}"
                fired[job(q, ids[0]).run_at] += 1
        except BaseException:
            barrier.abort()
            raise
        assert fired == Counter(at(10 * (r + 1)) for r in range(total))
        assert q.stats() == (total, 0, 0, 0)
        assert _only(store).next_run_at == at(10 * (total + 1))


class SweeperTests(ContractFixtures):
    """``Sweeper.run_once``: every queue swept with its retention, by one
    sweeper per database at a time and per interval."""

    def test_run_once_sweeps_every_queue_with_its_retention(
        self, store: Store, clock: ManualClock
    ) -> None:
        a, b, c, d = (store.queue(n) for n in "abcd")
        expiring = a.enqueue("x", expires=10)
        working = b.enqueue("y", expires=10)
        claim_exactly(b, working)
        purged = _bury(c, "old")
        kept = _bury(d, "kept")
        assert store.queue("e").pause()
        clock.set(at(10))
        sweeper = Sweeper(
            store, interval_s=60, retention={"c": 10, "d": None, "unused": timedelta(seconds=1)}
        )
        assert sweeper.interval_s == 60
        result = sweeper.run_once()
        assert result == {
            "a": (1, 0),
            "b": (1, 0),
            "c": (0, 1),
            "d": (0, 0),
            "e": (0, 0),
        }
        assert result is not None
        assert all(isinstance(r, SweepResult) for r in result.values())
        assert (job(a, expiring).state, job(a, expiring).last_error) == ("dead", "expired")
        assert (job(b, working).state, job(b, working).died_at) == ("dead", at(10))
        assert c.get_job(purged) is None
        assert job(d, kept).state == "dead"

    def test_run_once_purges_completed_jobs_with_each_queues_retention(
        self, store: Store, clock: ManualClock
    ) -> None:
        """docs/contract.md §3 "Completed jobs": ``keep_completed`` maps a
        queue to its completed-job retention; queues not named keep theirs."""
        done = {}
        for name in "fg":
            queue = store.queue(name, QueueOpts(keep_completed_s=3600))
            done[name] = queue.enqueue(name)
            assert claim_exactly(queue, done[name]).ack({"from": name})
        clock.set(at(60))
        sweeper = Sweeper(store, interval_s=60, keep_completed={"f": 60, "h": None})
        assert sweeper.run_once() == {"f": (0, 1), "g": (0, 0)}
        assert store.queue("f").get_job(done["f"]) is None
        assert job(store.queue("g"), done["g"]).result == {"from": "g"}
        with pytest.raises(ValidationError, match="keep_completed"):
            Sweeper(store, keep_completed={"f": -1})

    def test_once_per_interval(self, store: Store, clock: ManualClock) -> None:
        q = store.queue("jobs")
        sweeper = Sweeper(store, interval_s=60)
        assert sweeper.run_once() == {}
        expiring = q.enqueue("x", expires=30)
        clock.set(at(60) - MICRO)
        assert sweeper.run_once() is None
        assert job(q, expiring).state == "pending"
        clock.set(at(60))
        assert sweeper.run_once() == {"jobs": (1, 0)}
        clock.set(at(61))
        assert sweeper.run_once() is None
        clock.set(at(120))
        assert sweeper.run_once() == {"jobs": (0, 0)}

    def test_two_stores_on_one_target_take_turns(
        self, store: Store, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        one, two = Sweeper(store, interval_s=60), Sweeper(open_store(), interval_s=60)
        assert one.run_once() == {}
        assert two.run_once() is None
        clock.set(at(60))
        assert two.run_once() == {}
        assert one.run_once() is None
        assert two.run_once() is None
        clock.set(at(119))
        assert one.run_once() is None

    def test_each_sweeper_counts_its_own_interval_from_the_last_sweep(
        self, store: Store, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        """A daily sweeper does not silence a per-minute one: the record is
        when the last sweep ran, and each caller applies its own interval."""
        daily = Sweeper(store, interval_s=86_400)
        minutely = Sweeper(open_store(), interval_s=60)
        assert daily.run_once() == {}
        clock.set(at(60) - MICRO)
        assert minutely.run_once() is None
        clock.set(at(60))
        assert minutely.run_once() == {}
        clock.set(at(3600))
        assert daily.run_once() is None  # 3,540 s since the last sweep, anyone's
        assert minutely.run_once() == {}
        clock.set(at(3600 + 86_400))
        assert daily.run_once() == {}

    def test_a_turn_in_progress_excludes_every_other_sweeper(
        self, store: Store, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        """ "At most one caller per database while it is held", even when a
        sweep outlasts its interval."""
        other = Sweeper(open_store(), interval_s=60)
        outcome: list[object] = []

        def sweep_elsewhere() -> None:
            try:
                outcome.append(other.run_once())
            except BaseException:
                outcome.append(traceback.format_exc())

        with store._maintenance_turn(SWEEP_TASK, 60) as mine:
            assert mine is True
            clock.set(at(1000))
            thread = threading.Thread(target=sweep_elsewhere, daemon=True)
            thread.start()
            thread.join(BARRIER_TIMEOUT_S)
            assert not thread.is_alive(), "a sweeper waited for the held turn"
        assert outcome == [None]
        assert other.run_once() == {}

    def test_sweeper_validation(self, store: Store) -> None:
        bad: list[dict[str, Any]] = [
            {"interval_s": 0},
            {"interval_s": -1},
            {"interval_s": float("nan")},
            {"interval_s": True},
            {"retention": {"bad name!": 10}},
            {"retention": {"jobs": -1}},
            {"retention": {"jobs": "10"}},
        ]
        for options in bad:
            with pytest.raises(ValidationError):
                Sweeper(store, **options)

    def test_sweeper_on_a_closed_store_raises(self, store: Store) -> None:
        sweeper = Sweeper(store)
        store.close()
        _assert_closed({"run_once": sweeper.run_once})
