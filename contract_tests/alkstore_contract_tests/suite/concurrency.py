"""Exactly-once hand-out under real concurrency: threads with their own
stores, threads sharing one store, and separate processes (docs/contract.md §3 "Claim",
"sweep_expired()", "Schema"; regression case 001).

No exception of any kind may escape a claim: every worker thread or process
records what it raised, and the tests assert that nothing was.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import select
import signal
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from alkstore import JobHandle, Queue, QueueOpts, Store
from alkstore_contract_tests import _children
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_contract_tests._fixtures import (
    ContractFixtures,
    StoreFactory,
    at,
    claim_exactly,
    job,
)
from alkstore_contract_tests.harness import StoreTarget
from alkstore_contract_tests.suite.wake import WAKE_TIMEOUT_S

__all__ = [
    "ForkTests",
    "ProcessConcurrencyTests",
    "SpawnFixtures",
    "ThreadConcurrencyTests",
    "rounds",
]

BARRIER_TIMEOUT_S = 120.0


def rounds(name: str, default: int) -> int:
    """A round count, overridable with the environment variable ``name``
    (e.g. ``ALKSTORE_CLAIM_RACE_ROUNDS=1000`` for a longer soak)."""
    return int(os.environ.get(name, default))


class _Crew:
    """Threads running one function each; exceptions are collected."""

    def __init__(self, count: int, target: Callable[[int], None]) -> None:
        self.errors: list[str] = []
        self._lock = threading.Lock()

        def run(index: int) -> None:
            try:
                target(index)
            except threading.BrokenBarrierError:
                pass  # a sibling failed; its error is recorded
            except BaseException:
                with self._lock:
                    self.errors.append(traceback.format_exc())

        self.threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]

    def __enter__(self) -> _Crew:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for thread in self.threads:
            thread.join(BARRIER_TIMEOUT_S)
        assert not any(t.is_alive() for t in self.threads), "a worker thread hung"


class ThreadConcurrencyTests(ContractFixtures):
    """Threads, each with its own store on the same target unless said."""

    CLAIM_RACE_THREADS = 8

    def test_case_001_claim_one_race_threads(self, open_store: StoreFactory) -> None:
        """Regression case 001, step 1: eight threads with their own stores claim
        one job together; exactly one wins, at attempt 1; repeated."""
        total = rounds("ALKSTORE_CLAIM_RACE_ROUNDS", 200)
        threads = self.CLAIM_RACE_THREADS
        queues = [open_store().queue("race") for _ in range(threads)]
        producer = open_store().queue("race")
        barrier = threading.Barrier(threads + 1)
        results: list[list[tuple[int, int] | None]] = [[None] * threads for _ in range(total)]
        errors: list[str] = []

        def worker(index: int) -> None:
            for round_ in range(total):
                barrier.wait(BARRIER_TIMEOUT_S)
                try:
                    handle = queues[index].claim_one(f"w{index}")
                    if handle is not None:
                        results[round_][index] = (handle.id, handle.attempts)
                        assert handle.ack(), "the winner's ack was refused"
                except BaseException:
                    errors.append(traceback.format_exc())
                barrier.wait(BARRIER_TIMEOUT_S)

        with _Crew(threads, worker) as crew:
            try:
                for round_ in range(total):
                    job_id = producer.enqueue(round_)
                    barrier.wait(BARRIER_TIMEOUT_S)
                    barrier.wait(BARRIER_TIMEOUT_S)
                    winners = [r for r in results[round_] if r is not None]
                    assert winners == [(job_id, 1)], f"round {round_}: {results[round_]}"
                    assert not errors, errors[0]
            except BaseException:
                barrier.abort()
                raise
        assert crew.errors == []
        assert errors == []
        assert producer.stats() == (0, 0, 0, 0)

    def test_case_001_claim_batch_race_threads(self, open_store: StoreFactory) -> None:
        """Regression case 001, step 2: 50 jobs, five threads with their own
        stores each ``claim_batch(20)`` together: every id handed out once,
        at attempt 1; repeated."""
        total = rounds("ALKSTORE_CLAIM_BATCH_ROUNDS", 20)
        threads = 5
        queues = [open_store().queue("race") for _ in range(threads)]
        producer = open_store().queue("race")
        for round_ in range(total):
            ids = producer.enqueue_many(list(range(50)))
            barrier = threading.Barrier(threads)
            got: list[list[JobHandle]] = [[] for _ in range(threads)]

            def worker(
                index: int, barrier: threading.Barrier = barrier, got: list[Any] = got
            ) -> None:
                barrier.wait(BARRIER_TIMEOUT_S)
                got[index] = queues[index].claim_batch(f"w{index}", 20)

            with _Crew(threads, worker) as crew:
                pass
            assert crew.errors == [], crew.errors[0] if crew.errors else ""
            handed = [h.id for batch in got for h in batch]
            assert Counter(handed) == Counter(ids), f"round {round_}"
            assert {h.attempts for batch in got for h in batch} == {1}
            for batch in got:
                assert [h.id for h in batch] == sorted(h.id for h in batch)
            assert producer.ack_batch(ids) == 50

    def test_reclaim_race_hands_a_lapsed_job_to_one_thread(
        self, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        total = rounds("ALKSTORE_RECLAIM_RACE_ROUNDS", 20)
        threads = 6
        queues = [open_store().queue("race") for _ in range(threads)]
        producer = open_store().queue("race")
        for round_ in range(total):
            job_id = producer.enqueue(round_)
            first = producer.claim_one("first")
            assert first is not None
            assert first.id == job_id
            clock.advance(30)
            barrier = threading.Barrier(threads)
            got: list[JobHandle | None] = [None] * threads

            def worker(
                index: int, barrier: threading.Barrier = barrier, got: list[Any] = got
            ) -> None:
                barrier.wait(BARRIER_TIMEOUT_S)
                got[index] = queues[index].claim_one(f"w{index}")

            with _Crew(threads, worker) as crew:
                pass
            assert crew.errors == [], crew.errors[0] if crew.errors else ""
            winners = [(h.id, h.attempts) for h in got if h is not None]
            assert winners == [(job_id, 2)], f"round {round_}"
            assert first.ack() is False
            assert producer.cancel(job_id)

    def test_dead_letter_race_moves_an_exhausted_job_once(
        self, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        """Many claims dead-letter the same exhausted lapsed claims at once:
        each job ends dead exactly once and no claim raises."""
        total = rounds("ALKSTORE_DEAD_LETTER_RACE_ROUNDS", 20)
        threads = 6
        queues = [open_store().queue("race") for _ in range(threads)]
        producer = open_store().queue("race")
        for round_ in range(total):
            ids = producer.enqueue_many([round_] * 3, max_attempts=1)
            assert [h.id for h in producer.claim_batch("first", 3)] == ids
            clock.advance(30)
            barrier = threading.Barrier(threads)

            def worker(index: int, barrier: threading.Barrier = barrier) -> None:
                barrier.wait(BARRIER_TIMEOUT_S)
                assert queues[index].claim_one(f"w{index}") is None

            with _Crew(threads, worker) as crew:
                pass
            assert crew.errors == [], crew.errors[0] if crew.errors else ""
            for job_id in ids:
                dead = job(producer, job_id)
                assert (dead.state, dead.last_error, dead.died_at) == (
                    "dead",
                    "max attempts exceeded",
                    clock(),
                )
            assert producer.stats() == (0, 0, 0, 3 * (round_ + 1))

    def test_concurrent_sweeps_expire_each_job_once(
        self, open_store: StoreFactory, clock: ManualClock
    ) -> None:
        threads = 5
        queues = [open_store().queue("sweep") for _ in range(threads)]
        producer = open_store().queue("sweep")
        ids = producer.enqueue_many(list(range(30)), expires=10)
        producer.claim_batch("w", 10)
        clock.set(at(10))
        barrier = threading.Barrier(threads)
        swept = [(0, 0)] * threads

        def worker(index: int) -> None:
            barrier.wait(BARRIER_TIMEOUT_S)
            result = queues[index].sweep_expired()
            swept[index] = (result.expired, result.purged)

        with _Crew(threads, worker) as crew:
            pass
        assert crew.errors == [], crew.errors[0] if crew.errors else ""
        assert sum(e for e, _ in swept) == 30
        assert {p for _, p in swept} == {0}
        assert producer.stats() == (0, 0, 0, 30)
        assert {job(producer, i).last_error for i in ids} == {"expired"}

    def test_threads_sharing_one_store_drain_a_queue_once(self, store: Store) -> None:
        """docs/contract.md §2: a store and its queues may be used from many threads."""
        q = store.queue("shared")
        ids = q.enqueue_many(list(range(200)))
        claimed: list[int] = []
        lock = threading.Lock()

        def worker(index: int) -> None:
            while True:
                handles = q.claim_batch(f"w{index}", 1 + index % 3)
                if not handles:
                    return
                for handle in handles:
                    assert handle.ack()
                with lock:
                    claimed.extend(h.id for h in handles)

        with _Crew(4, worker) as crew:
            pass
        assert crew.errors == [], crew.errors[0] if crew.errors else ""
        assert sorted(claimed) == ids
        assert q.stats() == (0, 0, 0, 0)

    def test_producers_and_consumers_hand_each_job_out_once(self, open_store: StoreFactory) -> None:
        """Enqueues and claims interleave; ids may commit out of order, yet
        every job is claimed exactly once."""
        per_producer, producers, consumers = 100, 2, 3
        done = threading.Event()
        claimed: list[int] = []
        produced: list[int] = []
        lock = threading.Lock()
        stores = [open_store().queue("mixed") for _ in range(producers + consumers)]

        def work(index: int) -> None:
            q = stores[index]
            if index < producers:
                for i in range(per_producer):
                    new = [q.enqueue(i)] if i % 2 else q.enqueue_many([i, i])
                    with lock:
                        produced.extend(new)
                return
            idle_since = time.monotonic()
            while True:
                handles = q.claim_batch(f"c{index}", 4)
                if handles:
                    idle_since = time.monotonic()
                    with lock:
                        claimed.extend(h.id for h in handles)
                    assert q.ack_batch([h.id for h in handles]) == len(handles)
                elif done.is_set() or time.monotonic() - idle_since > 30:
                    return

        producer_crew = _Crew(producers, work)
        consumer_crew = _Crew(consumers, lambda i: work(i + producers))
        with consumer_crew, producer_crew:
            for thread in producer_crew.threads:
                thread.join(BARRIER_TIMEOUT_S)
            done.set()
        errors = producer_crew.errors + consumer_crew.errors
        assert errors == [], errors[0] if errors else ""
        claimed.extend(h.id for h in stores[0].claim_batch("late", 1000))
        assert len(produced) == producers * per_producer * 3 // 2
        assert len(set(claimed)) == len(claimed)
        assert sorted(claimed) == sorted(produced)


class _Spawner:
    """Starts spawned children on one target and stops them at teardown."""

    def __init__(self, spec: _children.ChildSpec) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.spec = spec
        self.started: list[Any] = []

    def __call__(self, function: Callable[..., None], **kwargs: Any) -> Any:
        process = self.ctx.Process(target=function, args=(self.spec,), kwargs=kwargs, daemon=True)
        process.start()
        self.started.append(process)
        return process

    def stop(self) -> None:
        for process in self.started:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)


class SpawnFixtures(ContractFixtures):
    """The ``spawn`` fixture and :meth:`collect`, for the tests whose
    children are separate processes started with ``"spawn"`` (harness
    capability ``spawned_processes_can_open``)."""

    @pytest.fixture
    def spawn(self, alkstore_target: StoreTarget) -> Iterator[_Spawner]:
        """Start children running a function of :mod:`._children` with the
        target's spec; terminates any left running at teardown."""
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

    @staticmethod
    def collect(results: Any, count: int, processes: Sequence[Any]) -> list[tuple[Any, ...]]:
        got: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while len(got) < count:
            try:
                item = results.get(timeout=1)
            except queue_module.Empty:
                if time.monotonic() > deadline or not any(p.is_alive() for p in processes):
                    raise AssertionError(
                        f"children reported {len(got)} of {count}: {got}"
                    ) from None
                continue
            if item[0] == "crash":
                raise AssertionError(f"child {item[2]} crashed:\n{item[4]}")
            got.append(item)
        return got

    def run_together(
        self, spawn: _Spawner, function: Callable[..., None], count: int, **kwargs: Any
    ) -> list[tuple[Any, ...]]:
        """Start ``count`` children running ``function(spec, index=i,
        barrier=..., results=..., **kwargs)``, all on one barrier of
        ``count``; collect one report from each and assert that none
        reported an error."""
        barrier = spawn.ctx.Barrier(count)
        results = spawn.ctx.Queue()
        processes = [
            spawn(function, index=i, barrier=barrier, results=results, **kwargs)
            for i in range(count)
        ]
        reports = self.collect(results, count, processes)
        errors = [r[4] for r in reports if r[4] is not None]
        assert errors == [], errors[0] if errors else ""
        return reports


class ProcessConcurrencyTests(SpawnFixtures):
    """Separate processes started with ``"spawn"``; each opens the target with
    :func:`alkstore.open` and a fixed clock (harness capability
    ``spawned_processes_can_open``)."""

    PROCESSES = 4

    @pytest.mark.slow
    def test_case_001_claim_one_race_processes(self, spawn: _Spawner, store: Store) -> None:
        """Regression case 001, step 3: four processes claim one job together;
        exactly one wins at attempt 1; repeated."""
        total = rounds("ALKSTORE_PROCESS_RACE_ROUNDS", 100)
        producer = store.queue("race")
        ctx = spawn.ctx
        barrier = ctx.Barrier(self.PROCESSES + 1)
        results = ctx.Queue()
        processes = [
            spawn(
                _children.claim_race_child,
                index=i,
                queue_name="race",
                rounds=total,
                barrier=barrier,
                results=results,
            )
            for i in range(self.PROCESSES)
        ]
        try:
            for round_ in range(total):
                job_id = producer.enqueue(round_)
                barrier.wait(BARRIER_TIMEOUT_S)
                barrier.wait(BARRIER_TIMEOUT_S)
                reports = self.collect(results, self.PROCESSES, processes)
                errors = [r[4] for r in reports if r[4] is not None]
                assert errors == [], errors[0] if errors else ""
                assert {r[1] for r in reports} == {round_}
                winners = [r[3] for r in reports if r[3] is not None]
                assert winners == [(job_id, 1)], f"round {round_}: {reports}"
        except BaseException:
            barrier.abort()
            raise
        assert producer.stats() == (0, 0, 0, 0)

    @pytest.mark.slow
    def test_case_001_claim_batch_race_processes(self, spawn: _Spawner, store: Store) -> None:
        """50 jobs, four processes each ``claim_batch(20)`` together."""
        producer = store.queue("race")
        ids = producer.enqueue_many(list(range(50)))
        reports = self.run_together(
            spawn, _children.claim_batch_child, self.PROCESSES, queue_name="race", n=20
        )
        handed = [pair for r in reports for pair in r[3]]
        assert Counter(i for i, _ in handed) == Counter(ids)
        assert {attempts for _, attempts in handed} == {1}
        assert producer.stats() == (0, 0, 50, 0)

    @pytest.mark.slow
    def test_processes_open_and_migrate_a_fresh_target_at_once(
        self, spawn: _Spawner, alkstore_target: StoreTarget
    ) -> None:
        """docs/contract.md §3 "Schema": migration is safe when several processes open
        the store at once."""
        ctx = spawn.ctx
        barrier = ctx.Barrier(self.PROCESSES)
        results = ctx.Queue()
        processes = [
            spawn(
                _children.enqueue_child,
                index=i,
                queue_name="opened",
                count=5,
                barrier=barrier,
                results=results,
            )
            for i in range(self.PROCESSES)
        ]
        reports = self.collect(results, self.PROCESSES, processes)
        errors = [r[4] for r in reports if r[4] is not None]
        assert errors == [], errors[0] if errors else ""
        ids = [i for r in reports for i in r[3]]
        assert len(set(ids)) == 5 * self.PROCESSES
        store = self.open_store(alkstore_target, clock=ManualClock(), migrate=False)
        try:
            q = store.queue("opened")
            assert q.stats() == (5 * self.PROCESSES, 0, 0, 0)
            payloads = sorted((job(q, i).payload["child"], job(q, i).payload["i"]) for i in ids)
            assert payloads == sorted((c, i) for c in range(self.PROCESSES) for i in range(5))
        finally:
            store.close()

    @pytest.mark.slow
    def test_enqueue_in_another_process_wakes(self, spawn: _Spawner, store: Store) -> None:
        """docs/contract.md §3 "Wake": a committed enqueue in another process wakes this
        process's subscriber."""
        ctx = spawn.ctx
        barrier = ctx.Barrier(1)
        results = ctx.Queue()
        with store.listen("woken") as sub:
            process = spawn(
                _children.enqueue_child,
                index=0,
                queue_name="woken",
                count=1,
                barrier=barrier,
                results=results,
            )
            reports = self.collect(results, 1, [process])
            assert reports[0][4] is None, reports[0][4]
            assert sub.wait(WAKE_TIMEOUT_S) is True
        (job_id,) = reports[0][3]
        assert job(store.queue("woken", QueueOpts()), job_id).payload == {"child": 0, "i": 0}


# Seconds the forked child may take (it needs about one); longer is a hang.
_FORKED_CHILD_TIMEOUT_S = 60.0


def _enqueue_claim_ack(queue: Queue, n: int) -> None:
    for i in range(n):
        claim_exactly(queue, queue.enqueue(i)).ack()


def _wait_readable(fd: int) -> None:
    assert select.select([fd], [], [], _FORKED_CHILD_TIMEOUT_S)[0], "no word from the other side"
    os.read(fd, 1)


class _Forked:
    """A child forked to run ``body``: it exits 0 if ``body`` returns, 1 if
    it raises (the traceback on its stderr). It holds a pipe's write end
    until it exits: end of file on the read end, within the time limit,
    says it did not hang."""

    def __init__(self, body: Callable[[], None]) -> None:
        self._exited, holding = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child's lines are not traced
            os.close(self._exited)
            code = 1
            try:
                body()
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(holding)

    def join(self) -> None:
        """Wait for the child; assert that it neither hung nor failed."""
        try:
            hung = not select.select([self._exited], [], [], _FORKED_CHILD_TIMEOUT_S)[0]
            if hung:
                os.kill(self.pid, signal.SIGKILL)
        finally:
            os.close(self._exited)
            _, status = os.waitpid(self.pid, 0)
        assert not hung, "the forked child hung (a lock inherited across fork()?)"
        assert os.waitstatus_to_exitcode(status) == 0, "the child failed (its stderr above)"


def _forking(test: Callable[..., None]) -> Callable[..., None]:
    """The marks of a fork test (on each test: ContractSuite inherits a
    topic class's own marks, and would put them on every test)."""
    marks = (
        pytest.mark.slow,
        pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() is POSIX only"),
        # Python 3.12+ warns about fork() in a process with threads (the
        # engine's pool and wake threads): the very case under test.
        pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning"),
    )
    for mark in marks:
        test = mark(test)
    return test


class ForkTests(ContractFixtures):
    """A store opened before ``os.fork()`` (D15; harness capability
    ``stores_survive_fork``): the child's operations, and the subscriptions
    it makes, use connections of its own, and the parent's store keeps
    working while the child works and after it closed its copy; nothing the
    child commits is lost when the parent closes its own."""

    ROUNDS = 100

    # Not an autouse fixture, for the same reason as _forking.
    def _require_capability(self) -> None:
        if not self.stores_survive_fork:
            pytest.skip("this engine's harness does not declare stores_survive_fork")

    @_forking
    def test_a_store_opened_before_fork_serves_both_processes(self, store: Store) -> None:
        self._require_capability()
        mine, theirs = store.queue("parent"), store.queue("child")
        _enqueue_claim_ack(mine, 1)  # connections are open and pooled
        sub = store.listen("parent")  # the wake machinery runs

        def child() -> None:
            _enqueue_claim_ack(theirs, self.ROUNDS)
            child_sub = store.listen("child-wake")
            store.queue("child-wake").enqueue("x")
            assert child_sub.wait(WAKE_TIMEOUT_S)
            store.close()

        forked = _Forked(child)
        _enqueue_claim_ack(mine, self.ROUNDS)  # while the child works
        forked.join()
        _enqueue_claim_ack(mine, self.ROUNDS)  # after the child closed its copy
        assert (mine.stats(), theirs.stats()) == ((0, 0, 0, 0), (0, 0, 0, 0))
        sub.wait(0)  # consume the wakes of the rounds
        mine.enqueue("wake")
        assert sub.wait(WAKE_TIMEOUT_S)

    @_forking
    def test_the_parent_closing_its_store_loses_nothing_of_the_childs(
        self, store: Store, open_store: StoreFactory
    ) -> None:
        self._require_capability()
        _enqueue_claim_ack(store.queue("parent"), 1)
        store.listen("parent")
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        kept = store.queue("kept")

        def child() -> None:
            kept.enqueue_many(list(range(self.ROUNDS)))
            os.write(ready_w, b"!")
            _wait_readable(go_r)  # the parent closed its store
            for i in range(self.ROUNDS):
                kept.enqueue(i)
            store.close()

        try:
            forked = _Forked(child)
            _wait_readable(ready_r)
            store.close()
            os.write(go_w, b"!")
            forked.join()
        finally:
            for fd in (ready_r, ready_w, go_r, go_w):
                os.close(fd)
        assert open_store().queue("kept").stats() == (2 * self.ROUNDS, 0, 0, 0)
