"""How a schedule is written to and read from its stored columns
(``alkstore.contract.schedule``; docs/decisions.md D27)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from alkstore import QueueOpts, Schedule, UnreadableSchedule
from alkstore.engine import (
    SCHEDULE_COLUMNS,
    read_schedule,
    schedule_from_values,
    schedule_to_values,
)
from alkstore_contract_tests import T0

SCHEDULE = Schedule(
    name="s",
    spec="@every 10s",
    timezone="UTC",
    queue="jobs",
    payload_bytes=b'{"k":1}',
    content_type="application/json",
    priority=None,
    max_attempts=3,
    expires_s=None,
    queue_opts=QueueOpts(visibility_timeout_s=7, backoff_cap_s=60),
    catch_up="latest",
    revision=2,
    created_at=T0,
    next_run_at=T0 + timedelta(seconds=10),
    last_run_at=None,
    last_job_id=None,
)


def _stored(options: dict[str, Any] | str) -> list[Any]:
    """SCHEDULE's column values with the options text replaced."""
    values = list(schedule_to_values(SCHEDULE))
    values[SCHEDULE_COLUMNS.index("options")] = (
        options if isinstance(options, str) else json.dumps(options)
    )
    return values


def test_queue_options_at_their_default_are_not_written() -> None:
    """So an option a later release adds reaches only the rows of the
    schedules that set it; the schedule's own options are always there,
    as the release before this one reads each of them."""
    assert json.loads(SCHEDULE.options_json) == {
        "priority": None,
        "max_attempts": 3,
        "expires_s": None,
        "catch_up": "latest",
        "queue_opts": {"visibility_timeout_s": 7, "backoff_cap_s": 60},
    }
    assert read_schedule(schedule_to_values(SCHEDULE)) == SCHEDULE


def test_a_row_written_with_every_queue_option_still_reads() -> None:
    """Rows saved before options were written sparsely."""
    every = {
        "visibility_timeout_s": 7,
        "max_attempts": 5,
        "priority": 0,
        "backoff_base_s": 4,
        "backoff_cap_s": 60,
        "expires_s": None,
        "dead_letter_retention_s": None,
    }
    options = {**json.loads(SCHEDULE.options_json), "queue_opts": every}
    assert read_schedule(_stored(options)) == SCHEDULE


def test_options_a_row_leaves_out_take_their_defaults() -> None:
    read = read_schedule(_stored({"max_attempts": 3}))
    assert isinstance(read, Schedule)
    assert (read.priority, read.max_attempts, read.expires_s, read.catch_up) == (
        None,
        3,
        None,
        "latest",
    )
    assert read.queue_opts == QueueOpts()


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (
            {"queue_opts": {"lease_renewal_s": 5, "fair": True}},
            "unknown queue option(s) 'fair', 'lease_renewal_s' (saved by a newer alkstore?)",
        ),
        ({"jitter_s": 1}, "unknown schedule option(s) 'jitter_s' (saved by a newer alkstore?)"),
        ({"catch_up": "all"}, "unknown catch_up policy 'all' (saved by a newer alkstore?)"),
        ({"queue_opts": []}, "queue options must be a JSON object, got []"),
        ("null", "the stored options must be a JSON object, got 'null'"),
        ({"max_attempts": 0}, "max_attempts must be in 1..2147483647, got 0"),
    ],
)
def test_a_row_this_version_cannot_fire_as_written_reads_as_unreadable(
    options: dict[str, Any] | str, reason: str
) -> None:
    assert read_schedule(_stored(options)) == UnreadableSchedule("s", 2, reason)
    with pytest.raises(ValueError, match="schedule 's' cannot be read: "):
        schedule_from_values(_stored(options))
