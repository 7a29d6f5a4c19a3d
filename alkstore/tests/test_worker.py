"""The worker's parts: outcomes, heartbeats, the pool, signals, options and
logging (docs/tasks-and-workers.md). The worker against real engines, with
threads and processes, is the contract's ``WorkerTests``."""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from alkstore import (
    App,
    EngineError,
    Fail,
    JobHandle,
    Queue,
    Retry,
    StoreClosedError,
    ValidationError,
    Worker,
    WorkerCounts,
)
from alkstore.runtime import worker as _worker
from alkstore.runtime.completer import Completer
from alkstore.runtime.heartbeat import HEARTBEAT_FRACTION, Heartbeater
from alkstore.runtime.pool import DaemonPool
from alkstore.runtime.signals import stop_signals
from alkstore.runtime.worker import describe_exception
from alkstore_contract_tests import T0, ManualClock

WAIT_S = 30.0


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    with App(f"sqlite:///{tmp_path / 'worker.db'}") as made:
        yield made


def wait_until(predicate: Any, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def run_on_a_thread(worker: Worker) -> tuple[threading.Thread, list[BaseException]]:
    """A thread (not started) running ``worker.run()``, and the list that
    collects what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)

    return threading.Thread(target=run), errors


# -- outcomes ----------------------------------------------------------------


def test_fail_and_retry_carry_their_choices() -> None:
    assert Fail().message is None
    assert Fail("gone").message == "gone"
    assert str(Fail("gone")) == "gone"
    assert Retry().message == "retry requested"
    assert Retry().delay_s is None
    assert Retry("x", delay=timedelta(minutes=1)).delay_s == 60
    with pytest.raises(ValidationError, match="delay"):
        Retry(delay=-1)
    with pytest.raises(ValidationError, match="Retry's message must be a str, not int"):
        Retry(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [123, b"bytes", ["list"], 1.5])
def test_fail_checks_its_message_type_at_construction(bad: object) -> None:
    with pytest.raises(
        ValidationError, match=f"Fail's message must be a str or None, not {type(bad).__name__}"
    ):
        Fail(bad)  # type: ignore[arg-type]
    assert isinstance(ValidationError("x"), ValueError)


def test_describe_exception_puts_type_and_message_first() -> None:
    try:
        raise KeyError("missing")
    except KeyError as exc:
        text = describe_exception(exc)
    first, rest = text.split("\n", 1)
    assert first == "KeyError: 'missing'"
    assert "Traceback (most recent call last)" in rest
    assert "test_describe_exception_puts_type_and_message_first" in rest


def test_worker_counts_total() -> None:
    assert WorkerCounts(1, 2, 3, 4).total == 10
    assert WorkerCounts().total == 0


# -- options -----------------------------------------------------------------


def test_a_closed_store_leaves_prefetched_jobs_to_lapse_after_one_failed_release(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """The store closes while the worker holds prefetched jobs: the first
    release raises, and the others are not tried one by one (each would
    wait on the store); one warning says how many are left to lapse."""
    gate = threading.Event()
    app.task(queue="q", name="fast")(lambda: None)

    @app.task(queue="q", name="slow")
    def slow() -> None:
        gate.wait(WAIT_S)

    queue = app.queue("q")
    for _ in range(30):
        app.tasks["fast"].enqueue()
    slow.enqueue()
    after = [app.tasks["fast"].enqueue() for _ in range(10)]
    worker = app.worker(prefetch=5, poll_interval_s=0.05, grace_period_s=5, handle_signals=False)
    thread, errors = run_on_a_thread(worker)
    with caplog.at_level(logging.INFO, logger="alkstore.worker"):
        thread.start()
        wait_until(
            lambda: sum(job.attempts for i in after if (job := queue.get_job(i))) >= 2,
            "two jobs claimed ahead of the slow one",
        )
        held = sum(job.attempts for i in after if (job := queue.get_job(i)))
        app.store.close()
        gate.set()
        thread.join(WAIT_S)
    assert not thread.is_alive()
    assert [type(e) for e in errors] == [StoreClosedError]
    failed = [r.getMessage() for r in caplog.records if "could not release" in r.getMessage()]
    assert len(failed) == 1, failed
    assert f"and the {held - 1} after it are reclaimed" in failed[0]


def test_worker_options_are_validated(app: App) -> None:
    with pytest.raises(ValidationError, match="no queue"):
        app.worker()
    app.task(queue="q")(print)
    for bad in ({"concurrency": 0}, {"concurrency": True}, {"concurrency": 2000}):
        with pytest.raises(ValidationError, match="concurrency"):
            app.worker(**bad)
    with pytest.raises(ValidationError, match="poll_interval_s"):
        app.worker(poll_interval_s=0)
    with pytest.raises(ValidationError, match="grace_period_s"):
        app.worker(grace_period_s=-1)
    with pytest.raises(ValidationError, match="sweep_interval_s"):
        app.worker(sweep_interval_s=0)
    for bad_interval in (0, -1, 8 * 3600 + 1):  # its record lives 3 intervals, at most a day
        with pytest.raises(ValidationError, match="registry_interval_s"):
            app.worker(registry_interval_s=bad_interval)
    app.worker(registry_interval_s=8 * 3600)
    with pytest.raises(ValidationError, match="worker_id"):
        app.worker(worker_id="")
    with pytest.raises(ValidationError, match="queue name"):
        app.worker(["ok", "not ok"])
    with pytest.raises(ValidationError, match="handle_signals"):
        app.worker(handle_signals=1)
    for bad in ({"prefetch": -1}, {"prefetch": 10_001}, {"prefetch": True}, {"prefetch": 1.5}):
        with pytest.raises(ValidationError, match="prefetch"):
            app.worker(**bad)
    assert (app.worker().prefetch, app.worker(prefetch=0).prefetch) == (100, 0)
    assert app.worker("solo").queues == ["solo"]
    assert app.worker(["a", "b", "a"]).queues == ["a", "b"]
    worker = app.worker(concurrency=3, worker_id="w-1")
    assert (worker.queues, worker.concurrency, worker.worker_id) == (["q"], 3, "w-1")
    assert str(os.getpid()) in app.worker().worker_id


def test_a_worker_runs_once(app: App) -> None:
    app.task(queue="q")(print)
    worker = app.worker(handle_signals=False)
    worker.run(burst=True)
    with pytest.raises(RuntimeError, match="runs once"):
        worker.run(burst=True)


def test_stop_before_run_returns_at_once(app: App) -> None:
    task = app.task(queue="q")(print)
    task.enqueue("never printed")
    worker = app.worker(handle_signals=False)
    worker.stop()
    assert worker.run() == WorkerCounts()
    assert app.queue("q").stats().pending == 1


# -- logging -----------------------------------------------------------------


def test_one_log_record_per_outcome(app: App, caplog: pytest.LogCaptureFixture) -> None:
    @app.task(queue="q", name="ok")
    def ok() -> None:
        pass

    @app.task(queue="q", name="bad")
    def bad() -> None:
        raise RuntimeError("nope")

    ok_id = ok.enqueue()
    bad_id = bad.enqueue()
    with caplog.at_level(logging.INFO, logger="alkstore.worker"):
        app.worker(handle_signals=False).run(burst=True)
    outcomes = {r.job_id: r for r in caplog.records if hasattr(r, "outcome")}  # type: ignore[attr-defined]
    assert set(outcomes) == {ok_id, bad_id}
    good, failed = outcomes[ok_id], outcomes[bad_id]
    assert (good.outcome, good.levelno, good.queue, good.attempt, good.task) == (  # type: ignore[attr-defined]
        "succeeded",
        logging.INFO,
        "q",
        1,
        "ok",
    )
    assert good.duration_s >= 0  # type: ignore[attr-defined]
    assert (failed.outcome, failed.levelno) == ("retried", logging.WARNING)  # type: ignore[attr-defined]
    assert "RuntimeError: nope" in failed.getMessage()
    assert failed.exc_info is not None


def test_a_malformed_call_is_logged_under_the_task_it_names(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(queue="q", name="ok")
    def ok() -> None:
        pass

    named = app.queue("q").enqueue({"task": "ok", "args": {"not": "a list"}})
    nameless = app.queue("q").enqueue(["not", "a", "task"])
    with caplog.at_level(logging.INFO, logger="alkstore.worker"):
        app.worker(handle_signals=False).run(burst=True)
    outcomes = {r.job_id: r for r in caplog.records if hasattr(r, "outcome")}  # type: ignore[attr-defined]
    assert (outcomes[named].outcome, outcomes[named].task) == ("dead", "ok")  # type: ignore[attr-defined]
    assert f"job {named} of 'q' (ok) dead" in outcomes[named].getMessage()
    assert outcomes[nameless].task == "?"  # type: ignore[attr-defined]


def test_a_closed_store_ends_the_run(app: App) -> None:
    app.task(queue="q")(print)
    worker = app.worker(poll_interval_s=0.05, handle_signals=False)
    thread, errors = run_on_a_thread(worker)
    thread.start()
    time.sleep(0.1)
    app.store.close()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], StoreClosedError)


def test_a_permanent_claim_error_stops_the_run_and_is_raised(
    app: App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11: a worker whose claims fail with a permanent ``EngineError``
    (an unwritable or replaced database) stops at once and ``run`` raises
    it, so the command exits non-zero, instead of retrying forever; an error
    that may pass is retried."""
    app.task(queue="q", name="noop")(print)
    queue = app.queue("q")
    errors = [
        EngineError("database is locked"),
        EngineError("attempt to write a readonly database", permanent=True),
    ]
    calls: list[int] = []

    def claim_batch(worker_id: str, n: int) -> list[JobHandle]:
        calls.append(n)
        raise errors[min(len(calls), 2) - 1]

    monkeypatch.setattr(queue, "claim_batch", claim_batch)
    monkeypatch.setattr(_worker, "_ERROR_PAUSE_S", 0.01)
    worker = app.worker(handle_signals=False, tick_interval_s=None, sweep_interval_s=None)
    with (
        caplog.at_level(logging.ERROR, logger="alkstore.worker"),
        pytest.raises(EngineError, match="readonly") as caught,
    ):
        worker.run()
    assert caught.value is errors[1]
    assert calls == [1, 1]
    assert f"worker {worker.worker_id} stops: attempt to write a readonly database" in caplog.text


def test_a_permanent_heartbeat_error_stops_the_run(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running job's heartbeat failing permanently stops the worker too:
    the running job finishes within the grace period, then ``run`` raises."""
    started = threading.Event()
    finish = threading.Event()

    @app.task(queue="q", name="long", visibility_timeout_s=0.3)
    def long() -> None:
        started.set()
        assert finish.wait(WAIT_S)

    long.enqueue()
    worker = app.worker(handle_signals=False, poll_interval_s=0.05)
    broken = EngineError("the database file was replaced", permanent=True)

    def heartbeat(self: JobHandle, extend: object = None) -> bool:
        finish.set()
        raise broken

    monkeypatch.setattr(JobHandle, "heartbeat", heartbeat)
    with pytest.raises(EngineError) as caught:
        worker.run()
    assert caught.value is broken
    assert started.is_set()
    assert worker.counts == WorkerCounts(succeeded=1)


# -- signals -----------------------------------------------------------------


def _signal_later(signum: int, delay_s: float) -> threading.Timer:
    timer = threading.Timer(delay_s, os.kill, args=(os.getpid(), signum))
    timer.start()
    return timer


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_worker_run_from_the_main_thread(app: App, signum: int) -> None:
    app.task(queue="q")(print)
    before = signal.getsignal(signum)
    timer = _signal_later(signum, 0.2)
    started = time.monotonic()
    counts = app.worker(poll_interval_s=30).run()
    timer.join()
    assert counts == WorkerCounts()
    assert time.monotonic() - started < 10
    assert signal.getsignal(signum) is before


def test_a_second_signal_ends_the_grace_period(app: App, tmp_path: Path) -> None:
    gate = threading.Event()

    @app.task(queue="q", name="slow")
    def slow() -> None:
        gate.wait(WAIT_S)

    job_id = slow.enqueue()
    worker = app.worker(grace_period_s=WAIT_S, poll_interval_s=0.05)

    def signal_twice() -> None:
        wait_until(lambda: worker.running == 1, "the job to start")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=signal_twice)
    sender.start()
    started = time.monotonic()
    counts = worker.run()
    sender.join()
    try:
        assert time.monotonic() - started < WAIT_S / 2
        assert counts.total == 0
        left = app.queue("q").get_job(job_id)
        assert left is not None
        assert left.state == "processing"
    finally:
        gate.set()


def test_stop_signals_install_only_in_the_main_thread() -> None:
    seen: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals(seen.append) as installed:
        assert installed
        assert signal.getsignal(signal.SIGTERM) is not before
        os.kill(os.getpid(), signal.SIGTERM)
        wait_until(lambda: seen, "the handler")
    assert seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before

    with stop_signals(seen.append, install=False) as installed:
        assert not installed
        assert signal.getsignal(signal.SIGTERM) is before

    results: list[bool] = []

    def elsewhere() -> None:
        with stop_signals(seen.append) as installed:
            results.append(installed)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert results == [False]


# -- heartbeats --------------------------------------------------------------


class FakeHandle:
    """Answers heartbeats as told and counts them."""

    def __init__(self, visibility_timeout_s: float, answers: list[Any]) -> None:
        self.visibility_timeout_s = visibility_timeout_s
        self.claim_deadline = datetime.max.replace(tzinfo=UTC)
        self.id = 1
        self.queue = "q"
        self._answers = answers
        self.beats = 0
        self.extends: list[float | None] = []

    def heartbeat(self, extend: float | None = None) -> bool:
        self.beats += 1
        self.extends.append(extend)
        answer = self._answers.pop(0) if self._answers else True
        if isinstance(answer, BaseException):
            raise answer
        return bool(answer)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_heartbeats_come_every_third_of_the_visibility_timeout() -> None:
    clock = FakeClock()
    beater = Heartbeater("hb", monotonic=clock)
    assert beater.beat_due() == math.inf
    handle = FakeHandle(30, [])
    beat = beater.add(handle)  # type: ignore[arg-type]
    assert HEARTBEAT_FRACTION == 1 / 3
    assert beater.beat_due() == pytest.approx(10)
    clock.now += 9.9
    beater.beat_due()
    assert handle.beats == 0
    clock.now += 0.1
    assert beater.beat_due() == pytest.approx(10)
    assert handle.beats == 1
    clock.now += 10
    beater.beat_due()
    assert handle.beats == 2
    beater.remove(beat)
    clock.now += 100
    assert beater.beat_due() == math.inf
    assert handle.beats == 2


def test_a_refused_heartbeat_marks_the_job_lost_and_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    beater = Heartbeater("hb", monotonic=clock)
    handle = FakeHandle(3, [False])
    beat = beater.add(handle)  # type: ignore[arg-type]
    clock.now += 1
    with caplog.at_level(logging.WARNING, logger="alkstore.worker"):
        assert beater.beat_due() == math.inf
    assert beat.lost
    assert "lost its claim" in caplog.text
    clock.now += 10
    beater.beat_due()
    assert handle.beats == 1


def test_a_handlers_longer_heartbeat_delays_the_workers_next_beat() -> None:
    """A beat through the lease (``JobContext.heartbeat``) records the
    deadline it set; the worker's next beat comes once the claim has no
    more left than a regular beat gives it, never sooner (it would shorten
    the claim), and a refused one marks the lease lost at once."""
    clock = FakeClock()
    beater = Heartbeater("hb", monotonic=clock)
    handle = FakeHandle(30, [])
    lease = beater.add(handle)  # type: ignore[arg-type]
    clock.now += 5
    assert lease.renew(120)
    assert handle.extends == [120]
    assert (lease.ends, lease.next_at) == (105 + 120, 105 + 10 + 90)
    assert beater.beat_due() == pytest.approx(100)
    clock.now = 205
    beater.beat_due()
    assert handle.extends == [120, None]
    assert (lease.ends, lease.next_at) == (205 + 30, 205 + 10)
    handle._answers.append(False)
    assert not lease.renew()
    assert (lease.lost, lease.cancelled) == (True, False)
    assert not lease.renew()  # lost: the store is not asked again
    assert handle.beats == 3
    with pytest.raises(ValidationError, match="extend"):
        lease.renew(-1)


def test_a_failing_heartbeat_is_tried_again_soon() -> None:
    clock = FakeClock()
    beater = Heartbeater("hb", monotonic=clock)
    handle = FakeHandle(60, [ConnectionError("blip"), True])
    beat = beater.add(handle)  # type: ignore[arg-type]
    clock.now += 20
    assert beater.beat_due() == pytest.approx(1.0)
    assert not beat.lost
    clock.now += 1
    assert beater.beat_due() == pytest.approx(20)
    assert handle.beats == 2


def test_a_closed_store_stops_the_heartbeats() -> None:
    clock = FakeClock()
    beater = Heartbeater("hb", monotonic=clock)
    beater.add(FakeHandle(3, [StoreClosedError("closed")]))  # type: ignore[arg-type]
    clock.now += 1
    with pytest.raises(StoreClosedError):
        beater.beat_due()


def test_the_heartbeat_thread_beats_in_real_time() -> None:
    beater = Heartbeater("hb")
    handle = FakeHandle(0.15, [])
    beater.start()
    try:
        beater.add(handle)  # type: ignore[arg-type]
        wait_until(lambda: handle.beats >= 3, "three beats", timeout_s=10)
    finally:
        beater.stop()


# -- the pool ----------------------------------------------------------------


def test_the_pool_runs_work_on_daemon_threads(caplog: pytest.LogCaptureFixture) -> None:
    pool = DaemonPool(2, "pool")
    seen: list[tuple[int, bool]] = []
    done = threading.Event()

    def work(i: int) -> None:
        seen.append((i, threading.current_thread().daemon))
        if i == 2:
            done.set()

    def explode() -> None:
        raise RuntimeError("handler bug")

    with caplog.at_level(logging.ERROR, logger="alkstore.worker"):
        pool.submit(explode)
        for i in range(3):
            pool.submit(lambda i=i: work(i))
        assert done.wait(WAIT_S)
        wait_until(lambda: "handler bug" in caplog.text, "the error to be logged")
    assert sorted(seen) == [(0, True), (1, True), (2, True)]
    pool.shutdown()
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(print)


# -- a job's slot is always freed ---------------------------------------------


class BurstRun:
    """``worker.run(burst=True)`` on a thread, joined within bounds."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.counts: WorkerCounts | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.counts = self.worker.run(burst=True)

    def join(self, timeout_s: float = 10) -> WorkerCounts:
        self.thread.join(timeout_s)
        if self.thread.is_alive():  # the fault: a leaked slot keeps burst running
            running = self.worker.running
            self.worker.stop()
            self.thread.join(WAIT_S)
            pytest.fail(f"burst run did not return; worker.running stayed {running}")
        assert self.counts is not None
        return self.counts


def test_fail_with_a_bad_message_retries_the_job_and_frees_the_slot(app: App) -> None:
    """``raise Fail(123)``: the ValidationError it raises is the handler's
    exception, so the job is retried with backoff, and nothing leaks."""

    @app.task(queue="q", name="bad_fail")
    def bad_fail() -> None:
        raise Fail(123)  # type: ignore[arg-type]

    job_id = bad_fail.enqueue()
    worker = app.worker(handle_signals=False, grace_period_s=60)
    counts = BurstRun(worker).join()
    assert counts == WorkerCounts(retried=1)
    assert worker.running == 0
    job = app.queue("q").get_job(job_id)
    assert job is not None
    assert (job.state, job.attempts) == ("pending", 1)
    assert job.last_error is not None
    assert job.last_error.startswith(
        "alkstore.errors.ValidationError: Fail's message must be a str or None, not int\n"
    )


def _fail_with_int_message() -> None:
    # Gets past Fail's own check: the worker must survive fail() refusing it.
    exc = Fail("x")
    exc.message = 123  # type: ignore[assignment]
    raise exc


def _ack_many_raises(self: Queue, handles: object) -> list[bool]:
    raise RuntimeError("a bug in ack_many")


@pytest.mark.parametrize("fault", ["fail-refuses-the-message", "ack-many-raises"])
def test_an_outcome_that_cannot_be_recorded_is_lost_and_frees_the_slot(
    app: App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    """Recording the outcome raised: the error is logged, the job is left
    claimed to lapse (``lost``), and the slot is freed, so a burst run
    returns and a stop does not wait out the grace period."""
    if fault == "ack-many-raises":  # the completer's flush (W14)
        monkeypatch.setattr(Queue, "ack_many", _ack_many_raises)
        handler = print
    else:
        handler = _fail_with_int_message
    task = app.task(queue="q", name="t")(handler)
    job_id = task.enqueue()
    worker = app.worker(handle_signals=False, grace_period_s=60)
    with caplog.at_level(logging.WARNING, logger="alkstore.worker"):
        counts = BurstRun(worker).join()
    assert counts == WorkerCounts(lost=1)
    assert worker.running == 0
    if fault == "ack-many-raises":
        assert "acking 1 finished job(s) of 'q' failed" in caplog.text
    else:
        assert "recording the outcome of job" in caplog.text
    left = app.queue("q").get_job(job_id)
    assert left is not None
    assert (left.state, left.attempts) == ("processing", 1)
    lost = [r for r in caplog.records if getattr(r, "outcome", None) == "lost"]
    assert len(lost) == 1


def test_a_stop_does_not_wait_for_a_job_whose_outcome_was_lost(app: App) -> None:
    app.task(queue="q", name="t")(_fail_with_int_message).enqueue()
    worker = app.worker(handle_signals=False, grace_period_s=60, poll_interval_s=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_until(lambda: worker.counts.lost == 1, "the outcome to be lost")
    started = time.monotonic()
    worker.stop()
    thread.join(10)
    try:
        assert not thread.is_alive(), "stop() waited for a job that had already ended"
        assert time.monotonic() - started < 10
        assert worker.running == 0
    finally:
        worker.stop()


def test_a_bug_while_logging_the_outcome_keeps_the_count(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in _record")

    monkeypatch.setattr(Worker, "_record", broken)
    job_id = app.task(queue="q", name="t")(print).enqueue()
    worker = app.worker(handle_signals=False)
    assert BurstRun(worker).join() == WorkerCounts(succeeded=1)
    assert worker.running == 0
    assert app.queue("q").get_job(job_id) is None


def test_a_job_that_cannot_be_started_frees_its_slot(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Heartbeater, handle: JobHandle) -> None:
        raise RuntimeError("a bug in the heartbeater")

    monkeypatch.setattr(Heartbeater, "add", broken)
    job_id = app.task(queue="q", name="t")(print).enqueue()
    worker = app.worker(handle_signals=False)
    assert BurstRun(worker).join() == WorkerCounts(lost=1)
    assert worker.running == 0
    left = app.queue("q").get_job(job_id)
    assert left is not None
    assert left.state == "processing"  # left to lapse and be reclaimed


# -- the completer: batched acks (W14) -----------------------------------------


def _flushes(caplog: pytest.LogCaptureFixture) -> list[tuple[int, int]]:
    """``(acked, batch)`` of each completer flush logged at DEBUG."""
    return [
        (r.acked, r.batch)  # type: ignore[attr-defined]
        for r in caplog.records
        if hasattr(r, "acked") and hasattr(r, "batch")
    ]


def test_the_completer_flushes_a_full_batch_at_once() -> None:
    calls: list[list[int]] = []
    completer: Completer[int] = Completer(calls.append, "c", max_batch=3, max_delay_s=3600)
    completer.start()
    for item in range(7):
        assert completer.add(item)
    wait_until(lambda: len(calls) == 2, "two full batches")
    assert calls == [[0, 1, 2], [3, 4, 5]]
    assert completer.waiting == 1  # item 6 waits for its delay
    assert completer.close(WAIT_S)
    assert calls[2] == [6]
    assert not completer.add(8)  # closed: the caller acks it itself
    assert completer.waiting == 0


def test_the_completer_flushes_a_partial_batch_after_its_delay() -> None:
    calls: list[tuple[float, list[int]]] = []
    completer: Completer[int] = Completer(
        lambda items: calls.append((time.monotonic(), items)), "c", max_delay_s=0.1
    )
    completer.start()
    added = time.monotonic()
    completer.add(1)
    completer.add(2)
    wait_until(lambda: calls, "the delayed flush")
    flushed_at, items = calls[0]
    assert items == [1, 2]
    assert flushed_at - added >= 0.09
    assert completer.close(WAIT_S)


def test_closing_the_completer_flushes_everything_waiting() -> None:
    calls: list[list[int]] = []
    completer: Completer[int] = Completer(calls.append, "c", max_batch=2, max_delay_s=3600)
    completer.start()
    for item in range(5):
        completer.add(item)
    assert completer.close(WAIT_S)
    assert [item for batch in calls for item in batch] == [0, 1, 2, 3, 4]
    assert all(len(batch) <= 2 for batch in calls)
    never_started: Completer[int] = Completer(calls.append, "c2", max_delay_s=3600)
    never_started.add(9)
    assert never_started.close()
    assert calls[-1] == [9]


def test_a_failing_flush_does_not_end_the_completer(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[list[int]] = []

    def flush(items: list[int]) -> None:
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("a bug in flush")

    completer: Completer[int] = Completer(flush, "c", max_batch=1, max_delay_s=0)
    completer.start()
    with caplog.at_level(logging.ERROR, logger="alkstore.worker"):
        completer.add(1)
        wait_until(lambda: len(calls) == 1, "the first flush")
        completer.add(2)
        assert completer.close(WAIT_S)
    assert calls == [[1], [2]]
    assert "acking a batch of 1 finished job(s) failed" in caplog.text


def test_a_full_backlog_holds_handlers_back() -> None:
    release = threading.Event()
    flushing = threading.Event()
    calls: list[list[int]] = []

    def flush(items: list[int]) -> None:
        flushing.set()
        release.wait(WAIT_S)
        calls.append(items)

    completer: Completer[int] = Completer(flush, "c", max_batch=2, max_delay_s=0, max_backlog=2)
    completer.start()
    completer.add(0)
    assert flushing.wait(WAIT_S)
    completer.add(1)
    completer.add(2)  # the backlog (2) is full now
    added = threading.Event()
    adder = threading.Thread(target=lambda: (completer.add(3), added.set()), daemon=True)
    adder.start()
    assert not added.wait(0.2)
    release.set()
    assert added.wait(WAIT_S)
    assert completer.close(WAIT_S)
    assert [item for batch in calls for item in batch] == [0, 1, 2, 3]


def test_many_jobs_are_acked_exactly_once_in_batches(
    app: App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_worker, "_ACK_DELAY_S", 0.2)  # batches made certain
    ran: list[int] = []

    @app.task(queue="q", name="note")
    def note(n: int) -> None:
        ran.append(n)

    n = 300
    ids = note.enqueue_many([[i] for i in range(n)])
    worker = app.worker(concurrency=4, handle_signals=False)
    with caplog.at_level(logging.DEBUG, logger="alkstore.worker"):
        counts = BurstRun(worker).join(WAIT_S)
    assert counts == WorkerCounts(succeeded=n)
    assert sorted(ran) == list(range(n))
    stats = app.queue("q").stats()
    assert (stats.pending, stats.processing, stats.dead) == (0, 0, 0)
    assert all(app.queue("q").get_job(job_id) is None for job_id in ids[:5])
    succeeded = [r.job_id for r in caplog.records if getattr(r, "outcome", None) == "succeeded"]  # type: ignore[attr-defined]
    assert sorted(succeeded) == sorted(ids)  # one record per job, at flush time
    flushes = _flushes(caplog)
    assert sum(acked for acked, _ in flushes) == n
    assert all(acked == batch <= 100 for acked, batch in flushes)
    assert len(flushes) <= n // 2, f"acks were not batched: {flushes}"


def test_a_stop_flushes_pending_acks_before_run_returns(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_worker, "_ACK_DELAY_S", 3600)  # only the stop flushes
    ran = threading.Event()

    @app.task(queue="q", name="t")
    def t() -> None:
        ran.set()

    job_id = t.enqueue()
    worker = app.worker(handle_signals=False, poll_interval_s=0.05)
    result: list[WorkerCounts] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()), daemon=True)
    thread.start()
    try:
        assert ran.wait(WAIT_S)
        wait_until(lambda: worker.running == 0, "the handler to finish")
        job = app.queue("q").get_job(job_id)
        assert job is not None
        assert job.state == "processing"
        assert worker.counts == WorkerCounts()  # counted once acked
        started = time.monotonic()
        worker.stop()
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert time.monotonic() - started < 10
    finally:
        worker.stop()
    assert result == [WorkerCounts(succeeded=1)]
    assert app.queue("q").get_job(job_id) is None  # gone as run() returns


def test_a_burst_run_flushes_its_acks_before_it_returns(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_worker, "_ACK_DELAY_S", 3600)
    task = app.task(queue="q", name="t")(print)
    task.enqueue_many([["x"]] * 20)
    assert app.worker(concurrency=4, handle_signals=False).run(burst=True) == WorkerCounts(
        succeeded=20
    )
    assert app.queue("q").stats().processing == 0


def test_a_failed_flush_leaves_the_jobs_claimed_to_lapse_and_run_again(
    app: App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At-least-once: the handler finished but the batch ack failed; the
    job stays claimed, no longer heartbeaten, lapses and is reclaimed."""
    ran: list[str] = []

    @app.task(queue="q", name="t", visibility_timeout_s=0.5)
    def t(label: str) -> None:
        ran.append(label)

    job_ids = t.enqueue_many([["a"], ["b"]])
    with monkeypatch.context() as patch:
        patch.setattr(Queue, "ack_many", _ack_many_raises)
        with caplog.at_level(logging.WARNING, logger="alkstore.worker"):
            counts = app.worker(concurrency=2, handle_signals=False).run(burst=True)
    assert counts == WorkerCounts(lost=2)
    assert "finished job(s) of 'q' failed; their claims are left to lapse" in caplog.text
    lost = [r.job_id for r in caplog.records if getattr(r, "outcome", None) == "lost"]  # type: ignore[attr-defined]
    assert sorted(lost) == sorted(job_ids)
    for job_id in job_ids:
        job = app.queue("q").get_job(job_id)
        assert job is not None
        assert (job.state, job.attempts) == ("processing", 1)
    time.sleep(0.6)  # the claims lapse
    again = app.worker(concurrency=2, handle_signals=False).run(burst=True)
    assert again == WorkerCounts(succeeded=2)
    assert sorted(ran) == ["a", "a", "b", "b"]
    assert app.queue("q").stats().processing == 0


def test_a_batch_ack_short_of_a_job_removed_meanwhile_counts_exactly(
    app: App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A job cancelled while it ran is gone before the flush: ``ack_many``
    says per claim which acks took effect, so the other job of the batch is
    ``succeeded`` and the cancelled one ``cancelled`` (with ``ack_batch``'s
    count alone, both were logged ``unknown``)."""
    monkeypatch.setattr(_worker, "_ACK_DELAY_S", 0.5)  # both in one batch
    cancelled = threading.Event()

    @app.task(queue="q", name="victim")
    def victim() -> None:
        assert cancelled.wait(WAIT_S)

    @app.task(queue="q", name="canceller")
    def canceller(job_id: int) -> None:
        assert app.queue("q").cancel(job_id)
        cancelled.set()

    victim_id = victim.enqueue()
    canceller_id = canceller.enqueue(victim_id)
    with caplog.at_level(logging.DEBUG, logger="alkstore.worker"):
        counts = app.worker(concurrency=2, handle_signals=False).run(burst=True)
    assert counts == WorkerCounts(succeeded=1, cancelled=1)
    assert _flushes(caplog) == [(1, 2)]
    outcomes = {r.job_id: r.outcome for r in caplog.records if hasattr(r, "outcome")}  # type: ignore[attr-defined]
    assert outcomes == {victim_id: "cancelled", canceller_id: "succeeded"}
    assert app.queue("q").stats().processing == 0


def test_a_lone_job_cancelled_while_it_runs_is_counted_cancelled(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """Its ack finds nothing while its claim still held: it was cancelled,
    not lost (issue 11: a cancel was logged as "lost")."""
    own: list[int] = []

    @app.task(queue="q", name="self_cancel")
    def self_cancel() -> None:
        assert app.queue("q").cancel(own[0])

    job_id = self_cancel.enqueue()
    own.append(job_id)
    with caplog.at_level(logging.INFO, logger="alkstore.worker"):
        counts = app.worker(handle_signals=False).run(burst=True)
    assert counts == WorkerCounts(cancelled=1)
    outcomes = {r.job_id: r.outcome for r in caplog.records if hasattr(r, "outcome")}  # type: ignore[attr-defined]
    assert outcomes == {job_id: "cancelled"}
    assert "it was cancelled while it ran, so its outcome (ack) was not recorded" in caplog.text


def test_a_job_cancelled_while_it_runs_is_seen_by_its_heartbeat(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    """Its heartbeat is refused while the claim held and the job is gone:
    the log says it was cancelled, not that its claim was lost, and the
    outcome is counted ``cancelled``."""
    started = threading.Event()
    finish = threading.Event()

    @app.task(queue="q", name="long", visibility_timeout_s=0.3)
    def long() -> None:
        started.set()
        assert finish.wait(WAIT_S)

    job_id = long.enqueue()
    worker = app.worker(handle_signals=False, poll_interval_s=0.05)
    result: list[WorkerCounts] = []
    thread = threading.Thread(target=lambda: result.append(worker.run(burst=True)))
    with caplog.at_level(logging.INFO, logger="alkstore.worker"):
        thread.start()
        assert started.wait(WAIT_S)
        assert app.queue("q").cancel(job_id)
        wait_until(lambda: "cancelled while running" in caplog.text, "the refused heartbeat")
        finish.set()
        thread.join(WAIT_S)
    assert result == [WorkerCounts(cancelled=1)]
    assert "lost its claim" not in caplog.text
    outcomes = {r.job_id: r.outcome for r in caplog.records if hasattr(r, "outcome")}  # type: ignore[attr-defined]
    assert outcomes == {job_id: "cancelled"}


def test_two_runs_of_one_job_in_one_batch_count_the_older_as_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker reclaims its own job whose first claim lapsed while the
    handler ran; both runs finish into one batch. The older run is lost,
    the newer succeeds: ``ack_many`` judges each run's claim by its identity
    (before, with ``ack_batch``'s count alone, both were logged ``unknown``)."""
    monkeypatch.setattr(_worker, "_ACK_DELAY_S", 0.5)  # both runs in one batch
    clock = ManualClock(T0)
    first_started, second_done, release = threading.Event(), threading.Event(), threading.Event()
    runs: list[int] = []
    with App(f"sqlite:///{tmp_path / 'twice.db'}", clock=clock) as app:

        @app.task(queue="q", name="twice", visibility_timeout_s=30)
        def twice() -> None:
            runs.append(len(runs) + 1)
            if len(runs) == 1:
                first_started.set()
                assert release.wait(WAIT_S)
            else:
                second_done.set()

        job_id = twice.enqueue()
        worker = app.worker(concurrency=2, handle_signals=False, poll_interval_s=0.05)
        result: list[WorkerCounts] = []
        thread = threading.Thread(target=lambda: result.append(worker.run()))
        with caplog.at_level(logging.INFO, logger="alkstore.worker"):
            thread.start()
            assert first_started.wait(WAIT_S)
            clock.advance(30)  # the first claim lapses; the worker reclaims the job
            assert second_done.wait(WAIT_S)
            release.set()
            wait_until(lambda: worker.counts.total == 2, "both runs to be counted")
            worker.stop()
            thread.join(WAIT_S)
    assert result == [WorkerCounts(succeeded=1, lost=1)]
    outcomes = [
        (r.attempt, r.outcome)  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "job_id", None) == job_id
    ]
    assert sorted(outcomes) == [(1, "lost"), (2, "succeeded")]
