"""The transactional :class:`~alkstore.Outbox` (docs/outbox.md): messages
added in the caller's transaction, relayed at least once, retried with the
queue's backoff."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import alkstore
from alkstore import AsyncOutbox, JobContext, Outbox, Queue, QueueOpts, Store, ValidationError
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import (
    ContractFixtures,
    RecordingRng,
    StoreFactory,
    at,
    job,
)
from alkstore_contract_tests.harness import StoreTarget
from alkstore_contract_tests.suite.concurrency import BARRIER_TIMEOUT_S
from alkstore_contract_tests.suite.operations import _assert_closed
from alkstore_contract_tests.suite.transactional import App
from alkstore_contract_tests.suite.wake import WAKE_TIMEOUT_S
from alkstore_contract_tests.suite.worker import RunningWorker, wait_until

__all__ = ["OutboxTests"]


class FlakySend:
    """A ``send`` that records what it delivered and fails on every
    ``every``-th call (counting all calls), and always for ``"poison"``."""

    def __init__(self, every: int = 3) -> None:
        self.every = every
        self.calls = 0
        self.delivered: list[Any] = []

    def __call__(self, message: Any) -> None:
        self.calls += 1
        if message == "poison":
            raise RuntimeError("poison")
        if self.calls % self.every == 0:
            raise RuntimeError(f"flaky call {self.calls}")
        self.delivered.append(message)


def _first_line(text: str | None) -> str | None:
    return None if text is None else text.split("\n", 1)[0]


class OutboxTests(ContractFixtures):
    """``Outbox.add`` (needs the harness's ``app_connection``),
    ``relay_once`` and ``relay``."""

    @pytest.fixture
    def outbox_app(self, alkstore_target: StoreTarget, store: Store) -> Iterator[App]:
        """The application's own connection with its own empty table, as in
        :class:`TransactionalEnqueueTests`."""
        with self.app_connection(alkstore_target) as conn:
            app = App(conn, f"orders_{uuid.uuid4().hex[:12]}")
            self.begin(conn)
            app.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
            conn.commit()
            yield app
            conn.rollback()
            self.begin(conn)
            app.execute("DROP TABLE orders")
            conn.commit()

    @pytest.fixture
    def outbox(self, open_store: StoreFactory) -> Outbox:
        """An outbox over queue ``"outbox"`` (3 attempts, backoff base 4 s)
        of a store whose ``rng`` answers the top of every backoff range."""
        store = open_store(rng=RecordingRng())
        return Outbox(store.queue("outbox", QueueOpts(max_attempts=3, backoff_base_s=4)))

    # -- add ------------------------------------------------------------------

    def test_a_committed_message_is_relayed(self, outbox_app: App, outbox: Outbox) -> None:
        self.begin(outbox_app.conn)
        outbox_app.execute("INSERT INTO orders (id) VALUES (1)")
        message_id = outbox.add(outbox_app.conn, {"order": 1}, priority=3)
        assert type(message_id) is int
        sent: list[Any] = []
        assert outbox.relay_once(sent.append, worker_id="relay") == 0
        outbox_app.commit()
        assert job(outbox.queue, message_id).priority == 3
        assert outbox.relay_once(sent.append, worker_id="relay") == 1
        assert sent == [{"order": 1}]
        assert outbox.queue.get_job(message_id) is None
        assert outbox.relay_once(sent.append, worker_id="relay") == 0
        assert outbox_app.orders() == [1]

    def test_a_rolled_back_message_is_never_sent(self, outbox_app: App, outbox: Outbox) -> None:
        self.begin(outbox_app.conn)
        outbox_app.execute("INSERT INTO orders (id) VALUES (2)")
        message_id = outbox.add(outbox_app.conn, {"order": 2})
        outbox_app.rollback()
        sent: list[Any] = []
        assert outbox.relay_once(sent.append, worker_id="relay") == 0
        assert sent == []
        assert outbox.queue.get_job(message_id) is None
        assert outbox.queue.stats() == (0, 0, 0, 0)
        assert outbox_app.orders() == []

    def test_a_refused_message_aborts_nothing(self, outbox_app: App, outbox: Outbox) -> None:
        self.begin(outbox_app.conn)
        outbox_app.execute("INSERT INTO orders (id) VALUES (3)")
        with pytest.raises(ValidationError):
            outbox.add(outbox_app.conn, float("nan"))
        with pytest.raises(ValidationError):
            outbox.add(outbox_app.conn, "x", delay=-1)
        message_id = outbox.add(outbox_app.conn, "fine")
        outbox_app.commit()
        assert outbox_app.orders() == [3]
        assert job(outbox.queue, message_id).payload == "fine"

    # -- relay_once -------------------------------------------------------------

    def test_relay_once_delivers_in_claim_order_and_acks(self, outbox: Outbox) -> None:
        q = outbox.queue
        low = q.enqueue("low", priority=-1)
        ids = q.enqueue_many(["a", "b", "c"])
        sent: list[Any] = []
        assert outbox.relay_once(sent.append, worker_id="relay", batch_size=2) == 2
        assert sent == ["a", "b"]
        assert outbox.relay_once(sent.append, worker_id="relay") == 2
        assert sent == ["a", "b", "c", "low"]
        assert [q.get_job(i) for i in [*ids, low]] == [None] * 4
        assert q.stats() == (0, 0, 0, 0)

    def test_failed_sends_are_retried_with_backoff_and_none_is_lost(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        """A ``send`` failing on every third call, and always for one poison
        message: over repeated ``relay_once`` calls every other message is
        delivered exactly once (no claim lapses), each failure is retried
        with the backoff (4 s, then 8 s), and the poison message ends dead at
        its third attempt."""
        q = outbox.queue
        rng = q.store.rng
        assert isinstance(rng, RecordingRng)
        m0, m1, m2, poison, m3, m4 = q.enqueue_many(["m0", "m1", "m2", "poison", "m3", "m4"])
        send = FlakySend(every=3)

        # T0, calls 1-6: m2 (call 3), poison (4) and m4 (6) fail
        assert outbox.relay_once(send, worker_id="relay") == 3
        assert send.delivered == ["m0", "m1", "m3"]
        assert [q.get_job(i) for i in (m0, m1, m3)] == [None] * 3
        for job_id, error in ((m2, "flaky call 3"), (poison, "poison"), (m4, "flaky call 6")):
            got = job(q, job_id)
            assert (got.state, got.attempts, got.run_at) == ("pending", 1, at(4))
            assert (got.worker_id, got.claim_deadline) == (None, None)
            assert _first_line(got.last_error) == f"RuntimeError: {error}"
        assert rng.calls == [(2, 4)] * 3
        assert q.stats() == (0, 3, 0, 0)

        clock.set(at(4) - timedelta(microseconds=1))
        assert outbox.relay_once(send, worker_id="relay") == 0
        assert send.calls == 6

        # T0+4, calls 7-9: m2 delivered; poison (8) and m4 (9) fail again
        clock.set(at(4))
        assert outbox.relay_once(send, worker_id="relay") == 1
        assert send.delivered == ["m0", "m1", "m3", "m2"]
        for job_id, error in ((poison, "poison"), (m4, "flaky call 9")):
            got = job(q, job_id)
            assert (got.state, got.attempts, got.run_at) == ("pending", 2, at(12))
            assert _first_line(got.last_error) == f"RuntimeError: {error}"
        assert rng.calls == [(2, 4)] * 3 + [(4, 8)] * 2

        # T0+12, calls 10-11: poison fails at its budget: dead; m4 delivered
        clock.set(at(12))
        assert outbox.relay_once(send, worker_id="relay") == 1
        assert send.delivered == ["m0", "m1", "m3", "m2", "m4"]
        dead = job(q, poison)
        assert (dead.state, dead.attempts, dead.died_at) == ("dead", 3, at(12))
        # The budget spent, the dead letter keeps the error that spent it.
        assert dead.last_error is not None
        assert dead.last_error.startswith(
            "max attempts exceeded; last error: RuntimeError: poison\n\nTraceback"
        )
        assert [j.id for j in q.dead_jobs()] == [poison]

        clock.set(at(1000))
        assert outbox.relay_once(send, worker_id="relay") == 0
        assert send.calls == 11
        assert q.stats() == (0, 0, 0, 1)

    def test_relay_once_validation(self, outbox: Outbox) -> None:
        q = outbox.queue
        job_id = q.enqueue("x")
        sent: list[Any] = []
        for options in (
            {"batch_size": 0},
            {"batch_size": 10_001},
            {"batch_size": True},
            {"worker_id": ""},
            {"worker_id": "w" * 256},
        ):
            arguments: dict[str, Any] = {"worker_id": "relay", **options}
            with pytest.raises(ValidationError):
                outbox.relay_once(sent.append, **arguments)
        with pytest.raises(ValidationError):
            outbox.relay_once("not callable", worker_id="relay")  # type: ignore[arg-type]
        assert sent == []
        assert (job(q, job_id).state, job(q, job_id).attempts) == ("pending", 0)

    def test_case_012_a_send_whose_call_does_not_run_its_body_delivers_nothing(
        self, outbox: Outbox
    ) -> None:
        """Case 012: a generator or async generator ``send`` is refused by
        ``relay_once``, ``relay`` and ``App.relay`` before anything is
        claimed; a plain one that returns a coroutine has not delivered: the
        message is retried with that reason, not acked. (An ``async def``
        ``send`` is awaited: ``test_an_async_send_is_acked_only_after_it_returned``.)"""
        q = outbox.queue
        job_id = q.enqueue("m")
        attempts: list[Any] = []

        async def send(message: Any) -> None:
            attempts.append(message)
            raise ConnectionError("down")

        def produce(message: Any) -> Any:
            attempts.append(message)
            yield message

        async def stream(message: Any) -> Any:
            attempts.append(message)
            yield message

        for refused, kind in ((produce, "a generator"), (stream, "an async generator")):
            refusal = rf"send must be a plain function or a coroutine function .* is {kind}"
            with pytest.raises(ValidationError, match=refusal):
                outbox.relay_once(refused, worker_id="relay")
            with pytest.raises(ValidationError, match=refusal):
                outbox.relay(refused, worker_id="relay", stop=threading.Event())
            with pytest.raises(ValidationError, match="a relay's send must be a plain function or"):
                alkstore.App(store=q.store).relay("outbox.other")(refused)
        assert (job(q, job_id).state, job(q, job_id).attempts) == ("pending", 0)

        def wrapper(message: Any) -> Any:
            return send(message)  # a plain def that hands back the coroutine

        assert outbox.relay_once(wrapper, worker_id="relay") == 0
        assert attempts == []
        retried = job(q, job_id)
        assert (retried.state, retried.attempts) == ("pending", 1)
        assert retried.last_error is not None
        assert "returned a coroutine instead of running" in retried.last_error

    def test_an_async_send_is_acked_only_after_it_returned(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        """Case 012's other side: an ``async def`` ``send`` (or an object
        whose ``__call__`` is one), relayed from sync code, is awaited on a
        loop the relay owns; its message is still claimed while the
        coroutine runs, acked once it returned, and retried when it raised
        (docs/outbox.md)."""
        q = outbox.queue
        ok, down = q.enqueue_many(["ok", "down"])
        seen: list[tuple[Any, str | None]] = []

        async def send(message: Any) -> None:
            await asyncio.sleep(0)  # the coroutine runs, and yields, on a loop
            held = job(q, ok)
            seen.append((message, held.state))
            if message == "down":
                raise ConnectionError("down")

        assert outbox.relay_once(send, worker_id="relay") == 1
        assert seen == [("ok", "processing"), ("down", "processing")]
        assert q.get_job(ok) is None
        retried = job(q, down)
        assert (retried.state, retried.attempts) == ("pending", 1)
        assert _first_line(retried.last_error) == "ConnectionError: down"

        class Sender:
            def __init__(self) -> None:
                self.sent: list[Any] = []

            async def __call__(self, message: Any) -> None:
                await asyncio.sleep(0)
                self.sent.append(message)

        sender = Sender()
        clock.advance(4)
        assert outbox.relay_once(sender, worker_id="relay") == 1
        assert sender.sent == ["down"]
        assert q.stats() == (0, 0, 0, 0)

    def test_relay_once_on_a_paused_queue_sends_nothing(self, outbox: Outbox) -> None:
        q = outbox.queue
        q.enqueue("x")
        assert q.pause()
        sent: list[Any] = []
        assert outbox.relay_once(sent.append, worker_id="relay") == 0
        assert sent == []
        assert q.resume()
        assert outbox.relay_once(sent.append, worker_id="relay") == 1
        assert sent == ["x"]

    # -- the message's context (docs/outbox.md "Deduplicating") ---------------

    def test_a_send_taking_the_context_gets_the_message_id_and_its_claim(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        """``relay_once(send, takes_context=True)`` calls ``send(context,
        message)``: ``context.job`` is the message's claim, whose ``id`` (the
        same at every delivery attempt) a receiver can deduplicate by, and
        ``context.heartbeat(extend)`` / ``await context.aheartbeat(extend)``
        set its deadline to now plus ``extend``; a plain and an ``async
        def`` send alike."""
        q = outbox.queue
        first, second = q.enqueue_many(["a", "b"])
        seen: list[tuple[Any, ...]] = []

        def left(context: JobContext) -> timedelta:
            deadline = job(q, context.job.id).claim_deadline
            assert deadline is not None
            return deadline - clock()

        def send(context: JobContext, message: Any) -> None:
            clock.advance(1)
            beat = context.heartbeat(60)
            seen.append((context.job.id, context.job.attempts, message, beat, left(context)))
            if message == "b" and context.job.attempts == 1:
                raise ConnectionError("down")

        async def asend(context: JobContext, message: Any) -> None:
            beat = await context.aheartbeat(timedelta(seconds=90))
            seen.append((context.job.id, context.job.attempts, message, beat, left(context)))

        with pytest.raises(ValidationError, match="takes_context must be a bool, not str"):
            outbox.relay_once(send, worker_id="relay", takes_context="yes")  # type: ignore[arg-type]
        assert outbox.relay_once(send, worker_id="relay", takes_context=True) == 1
        clock.advance(60)  # past b's backoff
        assert outbox.relay_once(asend, worker_id="relay", takes_context=True) == 1
        assert seen == [
            (first, 1, "a", True, timedelta(seconds=60)),
            (second, 1, "b", True, timedelta(seconds=60)),
            (second, 2, "b", True, timedelta(seconds=90)),
        ]
        assert q.stats() == (0, 0, 0, 0)

    def test_an_async_outbox_hands_its_send_the_context(
        self, alkstore_target: StoreTarget, clock: ManualClock
    ) -> None:
        """:class:`AsyncOutbox` with ``takes_context=True``: a plain ``send``
        (on a thread) heartbeats with ``context.heartbeat()``, an ``async
        def`` one with ``await context.aheartbeat()``, where the blocking
        ``heartbeat()`` is refused with ``RuntimeError``."""

        async def main() -> tuple[list[int], list[tuple[Any, ...]]]:
            async with self.open_async_store(alkstore_target, clock=clock) as astore:
                outbox = AsyncOutbox(astore.queue("outbox"))
                ids = await outbox.queue.enqueue_many(["a", "b"])
                seen: list[tuple[Any, ...]] = []

                def plain(context: JobContext, message: Any) -> None:
                    seen.append((context.job.id, message, context.heartbeat(60)))

                async def awaited(context: JobContext, message: Any) -> None:
                    with pytest.raises(RuntimeError, match="aheartbeat"):
                        context.heartbeat()
                    seen.append((context.job.id, message, await context.aheartbeat(60)))

                for send in (plain, awaited):
                    delivered = await outbox.relay_once(
                        send, worker_id="relay", batch_size=1, takes_context=True
                    )
                    assert delivered == 1
                assert tuple(await outbox.queue.stats()) == (0, 0, 0, 0)
                return ids, seen

        ids, seen = asyncio.run(main())
        assert seen == [(ids[0], "a", True), (ids[1], "b", True)]

    def test_an_app_relay_taking_the_context_gets_it_in_a_worker(
        self, open_store: StoreFactory
    ) -> None:
        """``@app.relay(queue, takes_context=True)``: the worker's relay
        calls ``send(context, message)``."""
        app = alkstore.App(store=open_store())
        seen: list[tuple[int, Any]] = []

        @app.relay("outbox.ctx", takes_context=True)
        def publish(context: JobContext, message: Any) -> None:
            seen.append((context.job.id, message))

        with pytest.raises(ValidationError, match="takes_context must be a bool, not int"):
            app.relay("outbox.other", takes_context=1)  # type: ignore[arg-type]
        message_id = app.outbox("outbox.ctx").queue.enqueue("m")
        running = RunningWorker(app.worker(poll_interval_s=0.05, handle_signals=False))
        try:
            wait_until(lambda: seen, "the relay to send")
        finally:
            counts = running.finish()
        assert seen == [(message_id, "m")]
        assert counts.relayed == 1

    # -- relay ----------------------------------------------------------------

    def test_relay_delivers_until_stopped(self, outbox: Outbox) -> None:
        """``relay`` drains what is there, then is woken by a new message,
        and returns its total once stopped."""
        q = outbox.queue
        q.enqueue_many(["a", "b"])
        stop = threading.Event()
        sent: list[Any] = []
        third = threading.Event()
        totals: list[int] = []

        def send(message: Any) -> None:
            sent.append(message)
            if message == "c":
                third.set()

        def run() -> None:
            totals.append(
                outbox.relay(send, worker_id="relay", stop=stop, poll_interval_s=WAKE_TIMEOUT_S)
            )

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            q.enqueue("c")
            assert third.wait(2 * WAKE_TIMEOUT_S), f"relay sent only {sent}"
        finally:
            stop.set()
            thread.join(BARRIER_TIMEOUT_S)
        assert not thread.is_alive()
        assert sorted(sent) == ["a", "b", "c"]
        assert totals == [3]
        assert q.stats() == (0, 0, 0, 0)

    def test_outbox_on_a_closed_store_raises(self, open_store: StoreFactory) -> None:
        store = open_store()
        outbox = Outbox(store.queue("outbox"))
        store.close()
        _assert_closed(
            {
                "add": lambda: outbox.add(object(), "x"),
                "relay_once": lambda: outbox.relay_once(print, worker_id="relay"),
                "relay": lambda: outbox.relay(print, worker_id="relay"),
            }
        )

    def test_the_outbox_names_its_queue(self, queue: Queue) -> None:
        assert Outbox(queue).queue is queue
