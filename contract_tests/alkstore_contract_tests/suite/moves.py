"""Moves between the live and the dead table, as other threads see them
(docs/contract.md §3 "Dead letters": every move is atomic, the job is always in exactly
one of the two tables; regression case 019).

Case 011 proves the move atomic when its insert fails; these tests prove it
atomic to concurrent readers and writers. A move written as two committed
statements (insert into one table, then delete from the other) passes every
single-threaded test, but a reader between the two sees the job in both
tables (or in neither, deleting first), and an ``ack`` between the two
deletes a job that the move then reports dead.
"""

from __future__ import annotations

import functools
import threading
import traceback
from collections.abc import Callable
from types import TracebackType

import pytest

from alkstore import JobHandle, Queue, QueueStats, Store
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import (
    ContractFixtures,
    StoreFactory,
    at,
    claim_exactly,
    job,
)
from alkstore_contract_tests.suite.concurrency import BARRIER_TIMEOUT_S, _Crew, rounds

__all__ = ["AtomicMoveTests"]

#: Every operation that moves a job between the tables: the handle's two
#: ways to the dead table, the claim's dead-lettering of exhausted lapsed
#: claims, the expiry sweep, and requeue (dead back to live).
MOVES = ("fail", "retry-at-budget", "claim-dead-letters", "sweep-expired", "requeue")


class _StatsWatch:
    """A thread that reads ``queue.stats()`` in a loop until the block
    ends, and keeps every read whose four counts do not add up to
    ``total``."""

    def __init__(self, queue: Queue, total: int) -> None:
        self._queue = queue
        self._total = total
        self.reads = 0
        self.wrong: list[QueueStats] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                stats = self._queue.stats()
                with self._progress:
                    self.reads += 1
                    if sum(stats) != self._total:
                        self.wrong.append(stats)
                    self._progress.notify_all()
        except BaseException:
            with self._progress:
                self.error = traceback.format_exc()
                self._progress.notify_all()

    def await_reads(self, count: int) -> None:
        """Wait until ``count`` more reads have completed, so the reader
        keeps pace with the moves whatever the scheduler favours."""
        with self._progress:
            target = self.reads + count
            done = self._progress.wait_for(
                lambda: self.reads >= target or self.error is not None, BARRIER_TIMEOUT_S
            )
        assert done, "the reader thread stopped reading"
        assert self.error is None, self.error

    def __enter__(self) -> _StatsWatch:
        self._thread.start()
        self.await_reads(1)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(BARRIER_TIMEOUT_S)
        assert not self._thread.is_alive(), "the reader thread hung"


class AtomicMoveTests(ContractFixtures):
    """docs/contract.md §3 "Dead letters", under concurrency: a reader never sees a
    moving job in both tables or in neither, and an ``ack`` racing a move
    to the dead table either wins or loses, never both."""

    @staticmethod
    def _one_by_one(q: Queue, clock: ManualClock, move: str, n: int) -> list[Callable[[], None]]:
        """Set up ``n`` jobs of ``q`` for ``move``; return one step per
        job, each moving that job alone and asserting that it did."""
        if move == "sweep-expired":
            for i in range(n):
                q.enqueue(i, expires=1 + i)

            def sweep(i: int) -> None:
                clock.set(at(1 + i))  # job i expired
                assert q.sweep_expired() == (1, 0)

            return [functools.partial(sweep, i) for i in range(n)]
        ids = q.enqueue_many(list(range(n)), max_attempts=1)
        if move == "claim-dead-letters":
            for i, job_id in enumerate(ids):  # deadlines a second apart
                clock.set(at(i))
                claim_exactly(q, job_id)

            def lapse(i: int) -> None:
                clock.set(at(30 + i))  # job i's last claim lapsed
                assert q.claim_one("w") is None
                assert job(q, ids[i]).state == "dead"

            return [functools.partial(lapse, i) for i in range(n)]
        handles = q.claim_batch("w", n)
        assert [h.id for h in handles] == ids
        if move == "requeue":
            for handle in handles:
                assert handle.fail("boom")

        def step(i: int) -> None:
            if move == "fail":
                assert handles[i].fail("boom") is True
            elif move == "retry-at-budget":
                assert handles[i].retry("e") is True
            else:
                assert move == "requeue"
                assert q.requeue(ids[i]) is True

        return [functools.partial(step, i) for i in range(n)]

    @pytest.mark.parametrize("move", MOVES)
    def test_case_019_a_reader_never_sees_a_moving_job_twice_or_not_at_all(
        self, store: Store, open_store: StoreFactory, clock: ManualClock, move: str
    ) -> None:
        """One thread moves ``n`` jobs one by one while another, with a
        store of its own, reads ``stats()`` in a loop: every read adds up
        to ``n`` (docs/contract.md §3 "stats()" reads one snapshot)."""
        n = rounds("ALKSTORE_MOVE_READER_JOBS", 20)
        q = store.queue("moves")
        steps = self._one_by_one(q, clock, move, n)
        with _StatsWatch(open_store().queue("moves"), n) as watch:
            for step in steps:
                step()
                watch.await_reads(2)
        assert watch.error is None, watch.error
        assert watch.wrong == [], (
            f"{len(watch.wrong)} of {watch.reads} reads of {n} jobs did not add up: "
            f"{watch.wrong[:5]}"
        )
        assert q.stats() == ((n, 0, 0, 0) if move == "requeue" else (0, 0, 0, n))

    @pytest.mark.parametrize("move", ["fail", "retry-at-budget"])
    def test_case_019_an_ack_racing_a_move_to_the_dead_table_takes_effect_once(
        self, store: Store, move: str
    ) -> None:
        """``ack()`` and ``fail()`` (or ``retry()`` on the last attempt) on
        one claim from two threads: exactly one returns ``True``, and
        ``get_job`` agrees (gone if the ack won, dead if the move did).
        Released together in even rounds; in odd rounds the ack waits until
        the job is counted dead (or the move returned), so it lands in any
        gap a move in two steps leaves."""
        total = rounds("ALKSTORE_ACK_RACE_ROUNDS", 20)
        q = store.queue("race")
        error = "boom" if move == "fail" else "max attempts exceeded"
        wins = {"ack": 0, move: 0}
        for round_ in range(total):
            job_id = q.enqueue(round_, max_attempts=1)
            handle = claim_exactly(q, job_id)
            took = self._race(q, handle, move, ack_waits=round_ % 2 == 1)
            assert sorted(took.values()) == [False, True], f"round {round_}: {took}"
            found = q.get_job(job_id)
            if took["ack"]:
                wins["ack"] += 1
                assert found is None, f"round {round_}: the ack won, yet {found}"
            else:
                wins[move] += 1
                assert found is not None, f"round {round_}: the {move} won, yet the job is gone"
                assert (found.state, found.last_error) == ("dead", error)
        assert q.stats() == (0, 0, 0, wins[move])

    @staticmethod
    def _race(q: Queue, handle: JobHandle, move: str, *, ack_waits: bool) -> dict[str, bool]:
        """Run ``handle.ack()`` and the move in two threads released
        together; with ``ack_waits`` the ack first waits until ``q`` counts
        one more dead job, or the move returned. Returns what each returned."""
        dead_before = q.stats().dead
        barrier = threading.Barrier(2)
        moved = threading.Event()
        took: dict[str, bool] = {}

        def ack() -> None:
            barrier.wait(BARRIER_TIMEOUT_S)
            while ack_waits and not moved.is_set() and q.stats().dead == dead_before:
                pass
            took["ack"] = handle.ack()

        def to_dead() -> None:
            barrier.wait(BARRIER_TIMEOUT_S)
            try:
                took[move] = handle.fail("boom") if move == "fail" else handle.retry("e")
            finally:
                moved.set()

        with _Crew(2, lambda i: (ack, to_dead)[i]()) as crew:
            pass
        assert crew.errors == [], crew.errors[0]
        return took
