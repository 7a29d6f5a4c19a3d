"""The scheduler's own behaviour on a real SQLite file (its semantics on
every engine are the contract's ``ScheduleTests``): how it reports a
schedule that cannot fire (regression case 014, docs/schedules.md "When a
schedule cannot fire")."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

import alkstore
from alkstore import EngineError, Schedule, Scheduler, Store
from alkstore.engine import EncodedPayload, Resolved
from alkstore_contract_tests._clock import T0, ManualClock
from alkstore_sqlite import SqliteStore

LOGGER = "alkstore.scheduler"
_TRIGGER = "test_poison_fails"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "schedules.db"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def store(path: Path, clock: ManualClock) -> Iterator[Store]:
    with alkstore.open(f"sqlite:///{path}", clock=clock) as store:
        yield store


def _sql(path: Path, statement: str, *params: object) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(statement, params)
    conn.close()


def _poison(path: Path) -> None:
    """Every insert of a job into the queue ``poison`` fails from now on."""
    _sql(
        path,
        f"CREATE TRIGGER {_TRIGGER} BEFORE INSERT ON _alkstore_jobs "
        "WHEN NEW.queue = 'poison' BEGIN SELECT RAISE(ABORT, 'poison refused'); END",
    )


def _cure(path: Path) -> None:
    _sql(path, f"DROP TRIGGER {_TRIGGER}")


def _newer_options(path: Path, name: str) -> None:
    """Give ``name``'s stored row a queue option this version does not know."""
    with sqlite3.connect(path) as conn:
        (text,) = conn.execute(
            "SELECT options FROM _alkstore_schedules WHERE name = ?", (name,)
        ).fetchone()
        options = json.loads(text)
        options["queue_opts"]["lease_renewal_s"] = 5
        conn.execute(
            "UPDATE _alkstore_schedules SET options = ? WHERE name = ?", (json.dumps(options), name)
        )
    conn.close()


def _logged(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def _payloads(store: Store, ids: list[int]) -> list[object]:
    jobs = [store.queue(q).get_job(i) for i in ids for q in ("jobs", "poison")]
    return sorted(str(job.payload) for job in jobs if job is not None)


def test_a_failing_schedule_is_logged_once_per_revision_and_again_after_it_fired(
    store: Store, path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    store.schedule("bad", "@hourly", "poison", "bad")
    store.schedule("fine", "@hourly", "jobs", "fine")
    scheduler = Scheduler(store)
    _poison(path)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for _ in range(3):
            clock.advance(3600)
            assert _payloads(store, scheduler.tick()) == ["fine"]
        (error,) = _logged(caplog, logging.ERROR)
        assert error.startswith("schedule 'bad' (revision 1) cannot fire: SQLite error: ")
        assert "poison refused" in error
        assert len(_logged(caplog, logging.DEBUG)) == 2  # the later failures, quietly
        # Saved anew (revision 2), still failing: said once more.
        store.schedule("bad", "@hourly", "poison", "bad again")
        clock.advance(3600)
        assert _payloads(store, scheduler.tick()) == ["fine"]
        clock.advance(3600)
        assert _payloads(store, scheduler.tick()) == ["fine"]
        assert len(_logged(caplog, logging.ERROR)) == 2
        assert _logged(caplog, logging.ERROR)[1].startswith("schedule 'bad' (revision 2) ")
        # Fixed: it fires, says so, and its next failure is news again.
        _cure(path)
        assert _payloads(store, scheduler.tick()) == ["bad again"]
        assert "schedule 'bad' (revision 2) can fire again" in _logged(caplog, logging.INFO)
        _poison(path)
        clock.advance(3600)
        assert _payloads(store, scheduler.tick()) == ["fine"]
    assert len(_logged(caplog, logging.ERROR)) == 3


def test_an_unreadable_row_is_logged_once_per_revision_by_each_scheduler(
    store: Store, path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    store.schedule("newer", "@hourly", "jobs", "newer")
    store.schedule("fine", "@hourly", "jobs", "fine")
    _newer_options(path, "newer")
    one, other = Scheduler(store), Scheduler(store)  # as in two processes
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            clock.advance(3600)
            assert _payloads(store, one.tick() + other.tick()) == ["fine"]
        errors = _logged(caplog, logging.ERROR)
        assert len(errors) == 2
        assert errors[0] == errors[1]
        assert errors[0].startswith(
            "schedule 'newer' (revision 1) cannot fire: unknown queue option(s) "
            "'lease_renewal_s' (saved by a newer alkstore?); skipped"
        )
        store.schedule("newer", "@hourly", "jobs", "replaced")
        _newer_options(path, "newer")  # the newer release saved it again
        clock.advance(3600)
        assert _payloads(store, one.tick()) == ["fine"]
        assert _logged(caplog, logging.ERROR)[2].startswith("schedule 'newer' (revision 2) ")
        assert len(_logged(caplog, logging.ERROR)) == 3


def test_a_zone_unknown_here_is_unreadable_and_said_once(
    store: Store, path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A zone missing from this host's tz database (saved by a host with a
    newer one): listed as unreadable, an ERROR once per revision."""
    store.schedule("gone", "@hourly", "jobs", 1, timezone="Europe/Paris")
    store.schedule("fine", "@hourly", "jobs", 2)
    _sql(path, "UPDATE _alkstore_schedules SET timezone = 'Nowhere/Zone' WHERE name = 'gone'")
    scheduler = Scheduler(store)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        clock.advance(3600)
        fired = scheduler.tick()
        clock.advance(3600)
        fired += scheduler.tick()
    assert _payloads(store, fired) == ["2", "2"]
    (error,) = _logged(caplog, logging.ERROR)
    assert error.startswith("schedule 'gone' (revision 1) cannot fire: unknown time zone ")
    assert "Nowhere/Zone" in error
    (unreadable,) = store.unreadable_schedules()
    assert (unreadable.name, unreadable.revision) == ("gone", 1)
    assert "Nowhere/Zone" in unreadable.reason
    assert [s.name for s in store.schedules()] == ["fine"]


def test_a_busy_database_fails_the_fires_of_this_tick_and_the_next_tick_retries(
    path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A write lock held past the busy timeout: each schedule's fire gives
    up (SQLite's lock is the whole file's), the tick still returns, and the
    next tick fires each schedule's latest boundary."""
    with alkstore.open(f"sqlite:///{path}", clock=clock, busy_timeout_s=0.05) as store:
        store.schedule("a", "@hourly", "jobs", "a")
        store.schedule("b", "@hourly", "jobs", "b")
        clock.advance(3600)
        scheduler = Scheduler(store)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with caplog.at_level(logging.ERROR, logger=LOGGER):
                assert scheduler.tick() == []
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        errors = _logged(caplog, logging.ERROR)
        assert [e.split(" cannot fire")[0] for e in errors] == [
            "schedule 'a' (revision 1)",
            "schedule 'b' (revision 1)",
        ]
        assert all("database is locked" in e for e in errors)
        clock.advance(1800)
        assert _payloads(store, scheduler.tick()) == ["a", "b"]


class _ReadOnlyFires(SqliteStore):
    """The SQLite engine, its fires failing as a read-only file makes them."""

    def _fire_schedule(
        self,
        schedule: Schedule,
        boundary: datetime,
        next_run_at: datetime,
        resolved: Resolved,
        payload: EncodedPayload,
    ) -> int | None:
        raise EngineError("SQLite error: attempt to write a readonly database", permanent=True)


def test_a_permanent_error_ends_the_tick(path: Path, clock: ManualClock) -> None:
    """A failure that fails every schedule alike (EngineError.permanent) is
    the store's, not one schedule's: the tick raises it."""
    with _ReadOnlyFires(str(path), clock=clock) as store:
        store.schedule("a", "@hourly", "jobs", "a")
        clock.advance(3600)
        with pytest.raises(EngineError, match="readonly") as raised:
            Scheduler(store).tick()
        assert raised.value.permanent is True


def test_a_permanent_error_ends_the_scheduler_run(path: Path, clock: ManualClock) -> None:
    """``Scheduler.run`` (``alkstore scheduler``) retries a failed tick next
    interval, but raises a permanent error instead of retrying it forever,
    so the command exits non-zero as a worker does."""
    with _ReadOnlyFires(str(path), clock=clock) as store:
        store.schedule("a", "@hourly", "jobs", "a")
        clock.advance(3600)
        with pytest.raises(EngineError, match="readonly") as raised:
            Scheduler(store).run(interval_s=0.01)
        assert raised.value.permanent is True
