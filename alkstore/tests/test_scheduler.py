"""The scheduler's own behaviour on a real SQLite file (its semantics on
every engine are the contract's ``ScheduleTests``)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

import alkstore
from alkstore import Scheduler
from alkstore_contract_tests._clock import T0, ManualClock


def test_a_schedule_whose_zone_is_unknown_here_is_skipped_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A zone missing from this host's tz database (saved by a host with a
    newer one): an ERROR once per schedule revision, not on every tick."""
    path = tmp_path / "zones.db"
    clock = ManualClock(T0)
    with alkstore.open(f"sqlite:///{path}", clock=clock) as store:
        store.schedule("gone", "@hourly", "jobs", 1, timezone="Europe/Paris")
        store.schedule("fine", "@hourly", "jobs", 2)
        with sqlite3.connect(path) as conn:
            conn.execute(
                "UPDATE _alkstore_schedules SET timezone = 'Nowhere/Zone' WHERE name = 'gone'"
            )
        clock.advance(3600)
        scheduler = Scheduler(store)
        with caplog.at_level(logging.ERROR, logger="alkstore.scheduler"):
            fired = scheduler.tick()
            clock.advance(3600)
            fired += scheduler.tick()
        assert [store.queue("jobs").get_job(i).payload for i in fired] == [2, 2]  # type: ignore[union-attr]
        errors = [r.getMessage() for r in caplog.records if r.name == "alkstore.scheduler"]
        assert len(errors) == 1
        assert errors[0].startswith("schedule 'gone' cannot be evaluated here; skipped: ")
        assert "Nowhere/Zone" in errors[0]
