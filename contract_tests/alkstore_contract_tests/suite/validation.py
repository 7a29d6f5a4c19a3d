"""Validation: every invalid input raises ``ValidationError`` before any I/O
and writes nothing (docs/contract.md §2 "Durations", §3 "Validation")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from typing import Any, NamedTuple

import pytest

from alkstore import Job, JobHandle, Queue, QueueOpts, QueueStats, Store, ValidationError
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, at, claim_exactly, job
from alkstore_contract_tests.harness import StoreTarget

__all__ = ["ValidationTests"]

#: 100 years of 365.25 days: the longest duration docs/contract.md §2 accepts.
HUNDRED_YEARS = timedelta(days=36525)

BAD_QUEUE_NAMES: list[object] = [
    "",
    "q" * 129,
    "a b",
    'q"uote',
    "it's",
    "x'); DROP TABLE jobs; --",
    "名前",
    "semi;colon",
    "slash/name",
    "tab\tname",
    "new\nline",
    "nul\x00",
    "__alkstore_",
    "__alkstore_jobs",
    5,
    None,
    b"jobs",
]
GOOD_QUEUE_NAMES = [
    "image-worker-queue",
    "Foo",
    "0",
    "a.b:c-d_e",
    "q" * 63,
    "q" * 64,
    "q" * 128,
    "_alkstore_jobs",
    "__alkstore",
    "jobs__alkstore_",
]
BAD_WORKER_IDS: list[object] = ["", "w" * 256, 5, None, b"w"]
GOOD_WORKER_IDS = ["w", "w" * 255, "ワーカー-1", "host:1234/thread 7"]

#: Durations outside ``>= 0``, finite, at most 100 years, int/float/timedelta.
BAD_DURATIONS: list[object] = [
    -1,
    -0.001,
    timedelta(microseconds=-1),
    float("nan"),
    float("inf"),
    float("-inf"),
    HUNDRED_YEARS + timedelta(seconds=1),
    HUNDRED_YEARS.total_seconds() + 1,
    # Past float's range: float() of these overflows.
    10**400,
    -(10**400),
    True,
    "5",
    b"5",
]
#: Durations that must be ``> 0``: the above and zero.
BAD_POSITIVE_DURATIONS: list[object] = [*BAD_DURATIONS, 0, 0.0, timedelta(0)]
BAD_INT32_PRIORITIES: list[object] = [2**31, -(2**31) - 1, True, 1.0, "1", None]
BAD_MAX_ATTEMPTS: list[object] = [0, -1, 2**31, True, 1.0, "3"]
BAD_RUN_AT: list[object] = [datetime(2030, 1, 1), "2030-01-01T00:00:00+00:00", 1_893_456_000]
BAD_N: list[object] = [True, False, 1.0, "1", None]
BAD_ERRORS: list[object] = [5, None, b"boom", ["boom"]]


class _BrokenZone(tzinfo):
    """A ``tzinfo`` whose ``utcoffset`` Python refuses, raises, or gives no
    offset: a datetime in it looks aware but names no instant."""

    def __init__(self, offset: Callable[[], object]) -> None:
        self._offset = offset

    def utcoffset(self, dt: datetime | None) -> Any:
        return self._offset()

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str:
        return "Broken"


def _raise() -> object:
    raise LookupError("no such zone in the tz database")


#: Zones whose datetimes are refused as ``run_at`` and as clock readings.
BROKEN_ZONES = {
    "offset-24h": _BrokenZone(lambda: timedelta(hours=24)),
    "offset-minus-25h": _BrokenZone(lambda: -timedelta(hours=25)),
    "offset-not-a-timedelta": _BrokenZone(lambda: 3600),
    "utcoffset-raises": _BrokenZone(_raise),
    "no-offset": _BrokenZone(lambda: None),
}


class Scene(NamedTuple):
    """The bystander rows of :meth:`ValidationTests.scene`."""

    queue: Queue
    due: int
    exhausted: int
    stats: QueueStats
    jobs: tuple[Job, Job]
    handle: JobHandle


class ValidationTests(ContractFixtures):
    """docs/contract.md §3 "Validation": a clear ``ValidationError``, raised before any
    I/O, nothing written."""

    @pytest.fixture
    def scene(self, store: Store, clock: ManualClock) -> Scene:
        """Queue ``"jobs"`` at ``T0+30``: a due pending job; a job with
        ``max_attempts=1`` claimed at ``T0`` whose claim has just lapsed, so
        that any claim that reaches the database dead-letters it; and a live
        handle on a third job claimed at ``T0`` with a one-hour visibility
        timeout."""
        q = store.queue("jobs")
        exhausted = q.enqueue("exhausted", max_attempts=1, priority=9)
        live = store.queue("jobs", QueueOpts(visibility_timeout_s=3600)).enqueue("live")
        exhausted_handle, handle = q.claim_batch("w", 2)
        assert (exhausted_handle.id, handle.id) == (exhausted, live)
        clock.set(at(30))
        due = q.enqueue("due")
        stats = q.stats()
        assert stats == (1, 0, 2, 0)
        return Scene(q, due, exhausted, stats, (job(q, due), job(q, exhausted)), handle)

    @staticmethod
    def assert_untouched(scene: Scene) -> None:
        q = scene.queue
        assert q.stats() == scene.stats
        assert (job(q, scene.due), job(q, scene.exhausted)) == scene.jobs
        assert job(q, scene.handle.id) == scene.handle.job

    # -- queue names --------------------------------------------------------

    @pytest.mark.parametrize("name", BAD_QUEUE_NAMES, ids=repr)
    def test_bad_queue_name_is_refused(self, store: Store, name: Any) -> None:
        with pytest.raises(ValidationError):
            store.queue(name)
        with pytest.raises(ValidationError):
            store.listen(name)

    @pytest.mark.parametrize("name", GOOD_QUEUE_NAMES, ids=lambda n: f"{n[:20]}-{len(n)}")
    def test_good_queue_name_completes_a_cycle(self, store: Store, name: str) -> None:
        q = store.queue(name)
        assert q.name == name
        job_id = q.enqueue({"name": name})
        handle = claim_exactly(q, job_id)
        assert handle.payload == {"name": name}
        assert handle.queue == name
        assert handle.ack()
        assert q.stats() == (0, 0, 0, 0)
        with store.listen(name):
            pass

    def test_queue_opts_must_be_queue_opts(self, store: Store) -> None:
        with pytest.raises(ValidationError):
            store.queue("jobs", {"max_attempts": 3})  # type: ignore[arg-type]

    # -- QueueOpts ----------------------------------------------------------

    @pytest.mark.parametrize(
        "options",
        [
            *({"visibility_timeout_s": d} for d in BAD_POSITIVE_DURATIONS),
            *({"max_attempts": v} for v in BAD_MAX_ATTEMPTS if v is not None),
            *({"priority": v} for v in BAD_INT32_PRIORITIES if v is not None),
            {"backoff_base_s": -1},
            {"backoff_base_s": 1.5},
            {"backoff_base_s": True},
            {"backoff_cap_s": 3601},
            {"backoff_cap_s": -1},
            {"backoff_cap_s": 2.5},
            *({"expires_s": d} for d in BAD_POSITIVE_DURATIONS),
            *({"dead_letter_retention_s": d} for d in BAD_DURATIONS),
        ],
        ids=repr,
    )
    def test_bad_queue_opts_are_refused(self, options: dict[str, Any]) -> None:
        with pytest.raises(ValidationError):
            QueueOpts(**options)

    def test_edge_queue_opts_are_accepted(self, store: Store) -> None:
        opts = QueueOpts(
            visibility_timeout_s=HUNDRED_YEARS.total_seconds(),
            max_attempts=2**31 - 1,
            priority=-(2**31),
            backoff_base_s=0,
            backoff_cap_s=3600,
            expires_s=0.001,
            dead_letter_retention_s=0,
        )
        assert (opts.visibility_timeout_s, opts.dead_letter_retention_s) == (3_155_760_000, 0)
        assert QueueOpts(backoff_cap_s=0, backoff_base_s=HUNDRED_YEARS.days).backoff_cap_s == 0
        q = store.queue("edges", opts)
        got = job(q, q.enqueue("x"))
        assert (got.max_attempts, got.priority) == (2**31 - 1, -(2**31))

    # -- enqueue arguments --------------------------------------------------

    @pytest.mark.parametrize(
        "options",
        [
            *({"delay": d} for d in BAD_DURATIONS),
            *({"expires": d} for d in BAD_POSITIVE_DURATIONS),
            *({"run_at": r} for r in BAD_RUN_AT),
            *({"priority": p} for p in BAD_INT32_PRIORITIES if p is not None),
            *({"max_attempts": m} for m in BAD_MAX_ATTEMPTS),
        ],
        ids=repr,
    )
    def test_bad_enqueue_option_writes_nothing(self, scene: Scene, options: dict[str, Any]) -> None:
        q = scene.queue
        with pytest.raises(ValidationError):
            q.enqueue("x", **options)
        with pytest.raises(ValidationError):
            q.enqueue_many(["x", "y"], **options)
        self.assert_untouched(scene)

    @pytest.mark.parametrize("zone", BROKEN_ZONES.values(), ids=BROKEN_ZONES.keys())
    def test_run_at_in_a_broken_zone_writes_nothing(self, scene: Scene, zone: tzinfo) -> None:
        """A ``tzinfo`` whose ``utcoffset`` Python would refuse later (24 h
        or more, not a ``timedelta``), raises, or is ``None``: the same
        ``ValidationError`` as a naive ``run_at``, never the tzinfo's own
        exception."""
        run_at = datetime(2030, 1, 1, tzinfo=zone)
        q = scene.queue
        with pytest.raises(ValidationError, match="run_at must be timezone-aware"):
            q.enqueue("x", run_at=run_at)
        with pytest.raises(ValidationError, match="run_at must be timezone-aware"):
            q.enqueue_many(["x", "y"], run_at=run_at)
        with pytest.raises(ValidationError, match="run_at must be timezone-aware"):
            q.enqueue("x", run_at=run_at, delay=0)  # delay wins, but run_at is checked
        self.assert_untouched(scene)

    @pytest.mark.parametrize("zone", BROKEN_ZONES.values(), ids=BROKEN_ZONES.keys())
    def test_a_clock_reading_in_a_broken_zone_is_refused(
        self, alkstore_target: StoreTarget, zone: tzinfo
    ) -> None:
        with pytest.raises(ValidationError, match="the clock's reading must be timezone-aware"):
            self.open_store(alkstore_target, clock=lambda: T0.replace(tzinfo=zone))

    def test_edge_enqueue_options_are_accepted(self, queue: Queue) -> None:
        far = job(queue, queue.enqueue("x", delay=HUNDRED_YEARS))
        assert far.run_at == T0 + HUNDRED_YEARS
        assert job(queue, queue.enqueue("x", expires=HUNDRED_YEARS)).expires_at == (
            T0 + HUNDRED_YEARS
        )
        extremes = [
            job(queue, queue.enqueue("x", priority=p, max_attempts=m))
            for p, m in ((2**31 - 1, 1), (-(2**31), 2**31 - 1))
        ]
        assert [(j.priority, j.max_attempts) for j in extremes] == [
            (2**31 - 1, 1),
            (-(2**31), 2**31 - 1),
        ]

    def test_enqueue_many_refuses_a_non_list(self, scene: Scene) -> None:
        for payloads in ("abc", b"abc", {"a": 1}, 5):
            with pytest.raises(ValidationError):
                scene.queue.enqueue_many(payloads)  # type: ignore[arg-type]
        self.assert_untouched(scene)

    def test_enqueue_many_names_the_refused_item_and_writes_nothing(self, scene: Scene) -> None:
        with pytest.raises(ValidationError, match=r"^payloads\[2\]: payload\['b'\] is of type set"):
            scene.queue.enqueue_many([1, "two", {"b": {3}}, 4])
        self.assert_untouched(scene)

    # -- claim arguments ----------------------------------------------------

    @pytest.mark.parametrize("worker_id", BAD_WORKER_IDS, ids=repr)
    def test_bad_worker_id_claims_nothing(self, scene: Scene, worker_id: Any) -> None:
        with pytest.raises(ValidationError):
            scene.queue.claim_one(worker_id)
        with pytest.raises(ValidationError):
            scene.queue.claim_batch(worker_id, 3)
        with pytest.raises(ValidationError):
            scene.queue.claim_batch(worker_id, 0)
        self.assert_untouched(scene)

    @pytest.mark.parametrize("worker_id", GOOD_WORKER_IDS, ids=lambda w: f"{w[:10]}-{len(w)}")
    def test_good_worker_id_is_recorded(self, queue: Queue, worker_id: str) -> None:
        job_id = queue.enqueue("x")
        handle = claim_exactly(queue, job_id, worker_id)
        assert handle.worker_id == worker_id
        assert job(queue, job_id).worker_id == worker_id

    @pytest.mark.parametrize("n", BAD_N, ids=repr)
    def test_claim_batch_n_must_be_an_int(self, scene: Scene, n: Any) -> None:
        with pytest.raises(ValidationError):
            scene.queue.claim_batch("w", n)
        self.assert_untouched(scene)

    # -- handle arguments, whatever the handle's state -----------------------

    @staticmethod
    def bad_handle_calls() -> list[Callable[[JobHandle], object]]:
        def call(method: str, *args: Any, **kwargs: Any) -> Callable[[JobHandle], object]:
            return lambda handle: getattr(handle, method)(*args, **kwargs)

        calls = [call("retry", error) for error in BAD_ERRORS]
        calls += [call("fail", error) for error in BAD_ERRORS if error is not None]
        calls += [call("retry", "e", delay=d) for d in BAD_DURATIONS]
        calls += [call("heartbeat", d) for d in BAD_POSITIVE_DURATIONS]
        return calls

    def test_bad_handle_arguments_on_a_valid_handle(self, scene: Scene) -> None:
        for call in self.bad_handle_calls():
            with pytest.raises(ValidationError):
                call(scene.handle)
        self.assert_untouched(scene)
        assert scene.handle.ack()

    def test_bad_handle_arguments_on_spent_lapsed_and_stale_handles(
        self, store: Store, clock: ManualClock
    ) -> None:
        q = store.queue("jobs")
        spent = claim_exactly(q, q.enqueue("spent"))
        assert spent.ack()
        stale = claim_exactly(q, q.enqueue("stale"))
        clock.advance(30)
        lapsed_id = q.enqueue("lapsed")
        reclaim = claim_exactly(q, stale.id, "w2")
        lapsed = claim_exactly(q, lapsed_id, "w2")
        clock.advance(30)
        assert lapsed.claim_deadline == clock()
        before = q.stats()
        for handle in (spent, stale, lapsed):
            for call in self.bad_handle_calls():
                with pytest.raises(ValidationError):
                    call(handle)
        assert q.stats() == before
        assert job(q, reclaim.id) == reclaim.job

    # -- other queue operations ---------------------------------------------

    def test_subscription_timeout_is_a_duration(self, store: Store) -> None:
        with store.listen("jobs") as sub:
            for bad in BAD_DURATIONS:
                with pytest.raises(ValidationError):
                    sub.wait(bad)  # type: ignore[arg-type]
