"""The operations commands of ``alkstore`` (pause, resume, dead, schedule,
schedules, unschedule, scheduler, and stats/job over every queue), run in
subprocesses on SQLite files (docs/command.md, docs/operations.md,
docs/schedules.md)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from test_cli import WAIT_S, command, ok, one_line_error

import alkstore
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import claim_exactly

#: When :func:`bury` makes its dead letters: long enough ago that
#: ``dead purge --older-than 86400`` (real clock) reaches them.
LONG_AGO = datetime(2024, 1, 1, tzinfo=UTC)
LONG_AGO_ISO = "2024-01-01T00:00:00+00:00"


def run(
    project: Path, url: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m alkstore --url URL ARGS`` in ``project``, with ``stdin``."""
    return command(project, "--url", url, *args, stdin=stdin)


def bury(
    url: str, queue: str, errors: Sequence[str | None], *, at: datetime | None = LONG_AGO
) -> list[int]:
    """Make one dead job per error in ``queue`` (enqueued, claimed by ``w``,
    failed with that error) at the instant ``at`` (``None``: now); return
    their ids in order. Payloads are ``{"n": index}``."""
    clock = None if at is None else ManualClock(at)
    with alkstore.open(url, clock=clock) as store:
        handle = store.queue(queue)
        ids = [handle.enqueue({"n": n}) for n in range(len(errors))]
        claimed = {h.id: h for h in handle.claim_batch("w", len(errors))}
        assert sorted(claimed) == ids
        for job_id, error in zip(ids, errors, strict=True):
            assert claimed[job_id].fail(error)
    return ids


def read(url: str) -> alkstore.Store:
    return alkstore.open(url, migrate=False)


# -- cancel -------------------------------------------------------------------


def test_cancel_deletes_a_live_job_and_exits_1_when_there_is_none(project: Path, url: str) -> None:
    """``cancel ID`` finds the job's queue, deletes the pending or
    processing job there and says so; an id with no live job (gone, dead,
    never made, or in a queue not named) is one line on stderr, exit 1."""
    (dead_id,) = bury(url, "mail", ["boom"])
    with alkstore.open(url) as store:
        mail, other = store.queue("mail"), store.queue("other")
        pending_id = mail.enqueue({"n": 1})
        running_id = other.enqueue({"n": 2})
        claimed = other.claim_one("w")
        assert claimed is not None
        assert claimed.id == running_id

    assert ok(run(project, url, "cancel", str(pending_id))) == (
        f"cancelled job {pending_id} of 'mail'\n"
    )
    assert ok(run(project, url, "cancel", str(running_id), "-q", "mail", "-q", "other")) == (
        f"cancelled job {running_id} of 'other'\n"
    )
    line = one_line_error(run(project, url, "cancel", str(pending_id)))
    assert line == f"Error: no live job {pending_id} in queue(s) mail"
    line = one_line_error(run(project, url, "cancel", str(dead_id)))
    assert line == f"Error: no live job {dead_id}: it is a dead job of 'mail'"
    line = one_line_error(run(project, url, "cancel", "999", "--app", "jobs:app"))
    assert line == "Error: no live job 999 in queue(s) mail"
    with read(url) as store:
        assert store.queue("mail").get_job(pending_id) is None
        assert store.queue("other").get_job(running_id) is None
        dead = store.queue("mail").get_job(dead_id)
        assert dead is not None
        assert dead.state == "dead"
    assert "cancel" in ok(command(project, "--help"))


# -- retry ----------------------------------------------------------------------


def test_retry_requeues_a_dead_job_or_makes_a_waiting_one_due(project: Path, url: str) -> None:
    """``retry ID``: a dead job is requeued, one waiting out its backoff is
    made due now; a running or due job is refused, saying why, exit 1."""
    (dead_id,) = bury(url, "mail", ["boom"])
    with alkstore.open(url) as store:
        mail = store.queue("mail")
        backing_off = mail.enqueue({"n": 1})
        running = mail.enqueue({"n": 2})
        first = mail.claim_one("w")
        assert first is not None
        assert first.id == backing_off
        assert first.retry("busy", delay=3600)
        assert claim_exactly(mail, running).id == running
        due = mail.enqueue({"n": 3})

    assert ok(run(project, url, "retry", str(dead_id))) == (
        f"requeued dead job {dead_id} of 'mail': due now\n"
    )
    assert ok(run(project, url, "retry", str(backing_off), "-q", "mail")) == (
        f"job {backing_off} of 'mail' is due now\n"
    )
    line = one_line_error(run(project, url, "retry", str(running)))
    assert line == f"Error: job {running} of 'mail' was not retried: it is running"
    line = one_line_error(run(project, url, "retry", str(due)))
    assert line == f"Error: job {due} of 'mail' was not retried: it is due already"
    line = one_line_error(run(project, url, "retry", "999", "-q", "mail"))
    assert line == "Error: no job 999 in queue(s) mail"
    with read(url) as store:
        mail = store.queue("mail")
        for job_id in (dead_id, backing_off):
            job = mail.get_job(job_id)
            assert job is not None
            assert job.state == "pending"
        assert mail.stats().scheduled == 0


# -- pause, resume -------------------------------------------------------------


def test_pause_and_resume_print_the_change_and_gate_the_worker(project: Path, url: str) -> None:
    ok(run(project, url, "migrate"))  # pause, like every operation, needs the schema
    assert ok(run(project, url, "pause", "mail")) == "queue mail paused\n"
    assert ok(run(project, url, "pause", "mail")) == "queue mail was already paused\n"
    job_id = int(ok(run(project, url, "enqueue", "mail", '{"task": "send", "args": ["ada"]}')))

    ok(run(project, url, "worker", "jobs:app", "--burst"))
    assert not (project / "sent-ada").exists()
    with read(url) as store:
        mail = store.queue("mail")
        assert mail.is_paused() is True
        assert tuple(mail.stats()) == (1, 0, 0, 0)
        job = mail.get_job(job_id)
        assert job is not None
        assert (job.state, job.attempts, job.worker_id) == ("pending", 0, None)

    assert ok(run(project, url, "resume", "mail")) == "queue mail resumed\n"
    assert ok(run(project, url, "resume", "mail")) == "queue mail was not paused\n"
    ok(run(project, url, "worker", "jobs:app", "--burst"))
    assert (project / "sent-ada").read_text() == "ada"
    with read(url) as store:
        assert store.queue("mail").is_paused() is False
        assert tuple(store.queue("mail").stats()) == (0, 0, 0, 0)


def test_bloat_on_sqlite_has_nothing_to_report(project: Path, url: str) -> None:
    # SQLite rewrites rows in place: no dead row versions, no horizon (the
    # PostgreSQL report is tested in alkstore_postgres/tests/test_postgres_vacuum.py).
    ok(run(project, url, "migrate"))
    with read(url) as store:
        assert not isinstance(store, alkstore.VacuumReporting)
    out = ok(run(project, url, "bloat"))
    assert out == "SqliteStore keeps no dead row versions: nothing to report\n"


def test_pause_refuses_a_bad_queue_name(project: Path, url: str) -> None:
    line = one_line_error(run(project, url, "pause", "bad name"))
    assert line == (
        "Error: queue name 'bad name' may only hold letters, digits and '_.:-' (ValidationError)"
    )


# -- dead list -----------------------------------------------------------------


def test_dead_list_prints_a_table_and_pages(project: Path, url: str) -> None:
    first, second, third = bury(url, "mail", ["boom\n  File x, line 1", None, "x" * 100])
    out = ok(run(project, url, "dead", "list", "mail"))
    lines = out.splitlines()
    assert len(lines) == 4
    header = lines[0]
    assert header.split() == ["id", "died_at", "attempts", "last_error"]
    assert [line.split() for line in lines[1:]] == [
        [str(first), LONG_AGO_ISO, "1/5", "boom\u2026"],  # the first line, marked cut
        [str(second), LONG_AGO_ISO, "1/5", "failed"],  # docs/contract.md §3: fail(None)
        [str(third), LONG_AGO_ISO, "1/5", "x" * 79 + "\u2026"],  # 80 characters, marked
    ]
    for line in lines[1:]:  # the columns line up under the header
        assert line.index(LONG_AGO_ISO) == header.index("died_at")
        assert line.index("1/5") == header.index("attempts")
    assert lines[3].index("x") == header.index("last_error")

    page = ok(run(project, url, "dead", "list", "mail", "--limit", "2")).splitlines()
    assert [line.split()[0] for line in page[1:3]] == [str(first), str(second)]
    assert page[3:] == [f"(more may follow: --after {second})"]
    rest = ok(run(project, url, "dead", "list", "mail", "--limit", "2", "--after", str(second)))
    assert [line.split()[0] for line in rest.splitlines()[1:]] == [str(third)]
    assert "more may follow" not in rest
    assert ok(run(project, url, "dead", "list", "mail", "--after", str(third))) == (
        "no dead jobs in queue mail\n"
    )
    assert ok(run(project, url, "dead", "list", "other")) == "no dead jobs in queue other\n"


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        ("y" * 80, "y" * 80),  # fits: whole, unmarked
        ("y" * 81, "y" * 79 + "\u2026"),
        ("ValueError: boom\n\nTraceback (most recent call last):", "ValueError: boom\u2026"),
        ("carriage\rreturn", "carriage\u2026"),  # a line break of its own
        ("done\n", "done"),  # only a final newline: nothing left out
        ("\nafter a blank first line", "\u2026"),
    ],
    ids=["80", "81", "traceback", "carriage-return", "final-newline", "blank-first-line"],
)
def test_dead_list_marks_a_cut_error_with_an_ellipsis(
    project: Path, url: str, error: str, shown: str
) -> None:
    """The table shows at most 80 characters of the first line; an ellipsis
    says that ``alkstore job ID`` has more to show."""
    (job_id,) = bury(url, "mail", [error])
    header, row = ok(run(project, url, "dead", "list", "mail")).splitlines()
    assert row[header.index("last_error") :] == shown
    assert row.startswith(str(job_id))


def test_dead_list_json_is_one_object_per_line(project: Path, url: str) -> None:
    first, second, third = bury(url, "mail", ["boom\nsecond line", None, "last"])
    out = ok(run(project, url, "dead", "list", "mail", "--json", "--after", str(first)))
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["id"] for row in rows] == [second, third]
    assert rows[0] == {
        "id": second,
        "queue": "mail",
        "state": "dead",
        "payload": {"n": 1},
        "content_type": "application/json",
        "priority": 0,
        "run_at": LONG_AGO_ISO,
        "expires_at": None,
        "enqueued_at": LONG_AGO_ISO,
        "attempts": 1,
        "max_attempts": 5,
        "visibility_timeout_s": 30,
        "backoff_base_s": 4,
        "backoff_cap_s": 3600,
        "worker_id": "w",
        "claim_deadline": "2024-01-01T00:00:30+00:00",
        "last_error": "failed",  # fail(None), docs/contract.md §3
        "died_at": LONG_AGO_ISO,
        "unique_key": None,
        "finished_at": None,
        "result": None,
    }
    assert rows[1]["last_error"] == "last"
    everything = ok(run(project, url, "dead", "list", "mail", "--json", "--limit", "1"))
    assert [json.loads(line)["last_error"] for line in everything.splitlines()] == [
        "boom\nsecond line"  # whole, not cut
    ]
    assert ok(run(project, url, "dead", "list", "other", "--json")) == ""


def test_dead_list_never_creates_a_database(project: Path) -> None:
    line = one_line_error(run(project, "sqlite:///typo.db", "dead", "list", "mail"))
    assert "SchemaVersionError" in line
    assert not (project / "typo.db").exists()


# -- dead requeue --------------------------------------------------------------


def test_dead_requeue_by_id_with_a_delay(project: Path, url: str) -> None:
    first, second, third = bury(url, "mail", ["boom", "bang", "pow"])
    before = datetime.now(UTC)
    result = run(project, url, "dead", "requeue", "mail", str(first), "--delay", "60")
    after = datetime.now(UTC)
    assert ok(result) == "1 job(s) requeued\n"
    assert result.stderr == ""
    with read(url) as store:
        mail = store.queue("mail")
        job = mail.get_job(first)
        assert job is not None
        assert (job.state, job.attempts, job.worker_id, job.claim_deadline, job.died_at) == (
            "pending",
            1,
            None,
            None,
            None,
        )
        assert job.last_error == "boom"  # kept for the record
        assert job.payload == {"n": 0}
        assert before + timedelta(seconds=60) <= job.run_at <= after + timedelta(seconds=60)
        assert tuple(mail.stats()) == (0, 1, 0, 2)
        assert [dead.id for dead in mail.dead_jobs()] == [second, third]


def test_dead_requeue_of_an_unknown_id_exits_1(project: Path, url: str) -> None:
    first, second = bury(url, "mail", ["boom", "bang"])
    ok(run(project, url, "dead", "requeue", "mail", str(first)))
    # first is live now, 999 never existed, second is requeued.
    result = run(project, url, "dead", "requeue", "mail", str(first), "999", str(second))
    assert result.returncode == 1
    assert result.stdout == "1 job(s) requeued\n"
    assert result.stderr.splitlines() == [
        f"job {first} is not a dead job of queue mail",
        "job 999 is not a dead job of queue mail",
    ]
    # A dead job of another queue is not this queue's.
    (elsewhere,) = bury(url, "other", ["x"])
    result = run(project, url, "dead", "requeue", "mail", str(elsewhere))
    assert result.returncode == 1
    assert result.stderr == f"job {elsewhere} is not a dead job of queue mail\n"
    with read(url) as store:
        assert tuple(store.queue("mail").stats()) == (2, 0, 0, 0)
        assert [job.id for job in store.queue("other").dead_jobs()] == [elsewhere]


def test_dead_requeue_all(project: Path, url: str) -> None:
    ids = bury(url, "mail", ["a", "b", "c"])
    (other,) = bury(url, "other", ["d"])
    assert ok(run(project, url, "dead", "requeue", "mail", "--all")) == "3 job(s) requeued\n"
    assert ok(run(project, url, "dead", "requeue", "mail", "--all")) == "0 job(s) requeued\n"
    with read(url) as store:
        mail = store.queue("mail")
        assert tuple(mail.stats()) == (3, 0, 0, 0)
        assert [job.attempts for job in map(mail.get_job, ids) if job is not None] == [1, 1, 1]
        assert [job.id for job in store.queue("other").dead_jobs()] == [other]
    # ...and the worker runs them again (they are not task payloads: dead again).
    ok(run(project, url, "worker", "jobs:app", "--burst"))
    assert ok(run(project, url, "stats", "-q", "mail")).splitlines()[1].split() == [
        "mail",
        "0",
        "0",
        "0",
        "0",
        "3",
        "no",
    ]


@pytest.mark.parametrize("args", [(), ("1", "--all")])
def test_dead_requeue_needs_ids_or_all_not_both(
    project: Path, url: str, args: tuple[str, ...]
) -> None:
    line = one_line_error(run(project, url, "dead", "requeue", "mail", *args))
    assert line == "Error: give the dead job ids to requeue, or --all (not both)"


# -- dead purge ----------------------------------------------------------------


def test_dead_purge_older_than_then_all(project: Path, url: str) -> None:
    old = bury(url, "mail", ["old 1", "old 2"])
    (recent,) = bury(url, "mail", ["recent"], at=None)
    (other,) = bury(url, "other", ["elsewhere"])
    assert ok(run(project, url, "dead", "purge", "mail", "--older-than", "86400")) == (
        "2 dead job(s) purged\n"
    )
    with read(url) as store:
        assert [job.id for job in store.queue("mail").dead_jobs()] == [recent]
        assert all(store.queue("mail").get_job(job_id) is None for job_id in old)

    answered_no = run(project, url, "dead", "purge", "mail", stdin="n\n")
    assert answered_no.returncode == 1
    assert answered_no.stdout == "delete every dead job of queue mail? [y/N]: "
    assert answered_no.stderr.strip() == "Aborted!"
    with read(url) as store:
        assert [job.id for job in store.queue("mail").dead_jobs()] == [recent]

    assert ok(run(project, url, "dead", "purge", "mail", "--yes")) == "1 dead job(s) purged\n"
    assert ok(run(project, url, "dead", "purge", "mail", "--yes")) == "0 dead job(s) purged\n"
    with read(url) as store:
        assert store.queue("mail").dead_jobs() == []
        assert [job.id for job in store.queue("other").dead_jobs()] == [other]


def test_dead_purge_answered_yes(project: Path, url: str) -> None:
    bury(url, "mail", ["a", "b"])
    result = run(project, url, "dead", "purge", "mail", stdin="y\n")
    assert ok(result) == "delete every dead job of queue mail? [y/N]: 2 dead job(s) purged\n"


# -- stats and job over every queue --------------------------------------------


def test_stats_without_queues_lists_every_queue_of_the_store(project: Path, url: str) -> None:
    ok(run(project, url, "migrate"))
    assert ok(run(project, url, "stats")) == "no jobs in any queue\n"
    assert one_line_error(run(project, url, "job", "7")) == "Error: no job 7: no jobs in any queue"
    with alkstore.open(url) as store:
        now = store.queue("a.now")
        now.enqueue(1)
        now.enqueue(2)
        assert len(now.claim_batch("w", 1)) == 1
        store.queue("b.later").enqueue(3, delay=3600)
        store.queue("d.paused").pause()
    (dead,) = bury(url, "c.dead", ["gone"])
    assert ok(run(project, url, "stats")).splitlines() == [
        "queue     pending  scheduled  processing  lapsed  dead  paused",
        "a.now           1          0           1       0     0  no",
        "b.later         0          1           0       0     0  no",
        "c.dead          0          0           0       0     1  no",
        "d.paused        0          0           0       0     0  yes",
    ]
    shown = json.loads(ok(run(project, url, "job", str(dead), "--json")))
    assert (shown["queue"], shown["state"], shown["last_error"]) == ("c.dead", "dead", "gone")
    assert one_line_error(run(project, url, "job", "999")) == (
        "Error: no job 999 in queue(s) a.now, b.later, c.dead, d.paused"
    )


def test_stats_tells_lapsed_claims_from_live_ones_and_shows_paused_queues(
    project: Path, url: str
) -> None:
    """Two claims made long ago have lapsed by now; one made now holds for
    an hour; ``idle`` is paused with no job."""
    with alkstore.open(url, clock=ManualClock(LONG_AGO)) as store:
        mail = store.queue("mail")
        ids = [mail.enqueue(n) for n in range(2)]
        assert [h.id for h in mail.claim_batch("w", 2)] == ids
    with alkstore.open(url) as store:
        held = store.queue("mail", alkstore.QueueOpts(visibility_timeout_s=3600))
        job_id = held.enqueue(2, priority=1)  # claimed before the lapsed two
        assert claim_exactly(held, job_id).claim_deadline > datetime.now(UTC)
        assert store.queue("idle").pause()
    assert ok(run(project, url, "stats")).splitlines() == [
        "queue  pending  scheduled  processing  lapsed  dead  paused",
        "idle         0          0           0       0     0  yes",
        "mail         0          0           3       2     0  no",
    ]


def test_stats_of_a_drained_store_says_no_jobs(project: Path, url: str) -> None:
    """Every job ran and was acked: the queues are gone from
    ``queue_names()``, and the store is not new."""
    with alkstore.open(url) as store:
        mail = store.queue("mail")
        job_id = mail.enqueue(1)
        (handle,) = mail.claim_batch("w", 1)
        assert handle.ack()
    assert ok(run(project, url, "stats")) == "no jobs in any queue\n"
    assert one_line_error(run(project, url, "job", str(job_id))) == (
        f"Error: no job {job_id}: no jobs in any queue"
    )


# -- schedules -----------------------------------------------------------------


def test_schedule_schedules_unschedule_round_trip(project: Path, url: str) -> None:
    saved = run(
        project,
        url,
        "schedule",
        "nightly",
        "30 14 * * *",
        "reports",
        '{"task": "report", "args": [1]}',
        "--timezone",
        "America/New_York",
        "--catch-up",
        "skip",
        "--priority",
        "3",
        "--max-attempts",
        "2",
        "--expires",
        "600",
    )
    with read(url) as store:
        (stored,) = store.schedules()
    assert ok(saved) == f"schedule nightly: next run at {stored.next_run_at.isoformat()}\n"
    assert stored.next_run_at.microsecond == 0
    local = stored.next_run_at.astimezone(ZoneInfo("America/New_York"))
    assert (local.hour, local.minute, local.second) == (14, 30, 0)
    assert timedelta(0) < stored.next_run_at - stored.created_at <= timedelta(days=1)

    lines = ok(run(project, url, "schedules")).splitlines()
    assert len(lines) == 2
    header, row = lines
    assert header.split() == [
        "name",
        "spec",
        "timezone",
        "queue",
        "next_run_at",
        "last_run_at",
        "last_job",
    ]
    assert row.split() == [
        "nightly",
        "30",
        "14",
        "*",
        "*",
        "*",
        "America/New_York",
        "reports",
        stored.next_run_at.isoformat(),
        "-",
        "-",
    ]
    assert row.index("30 14 * * *") == header.index("spec")
    assert row.index("America/") == header.index("timezone")
    assert row.index("reports") == header.index("queue")

    as_json = json.loads(ok(run(project, url, "schedules", "--json")))
    assert as_json == {
        "name": "nightly",
        "spec": "30 14 * * *",
        "timezone": "America/New_York",
        "queue": "reports",
        "payload": {"task": "report", "args": [1]},
        "content_type": "application/json",
        "priority": 3,
        "max_attempts": 2,
        "expires_s": 600,
        "queue_opts": {
            "visibility_timeout_s": 30,
            "max_attempts": 5,
            "priority": 0,
            "backoff_base_s": 4,
            "backoff_cap_s": 3600,
            "expires_s": None,
            "dead_letter_retention_s": None,
            "keep_completed_s": None,
        },
        "catch_up": "skip",
        "revision": 1,
        "created_at": stored.created_at.isoformat(),
        "next_run_at": stored.next_run_at.isoformat(),
        "last_run_at": None,
        "last_job_id": None,
    }

    # Saving the name again replaces it, with defaults for what is not given.
    ok(run(project, url, "schedule", "nightly", "@every 1h", "reports", "2"))
    replaced = json.loads(ok(run(project, url, "schedules", "--json")))
    assert (replaced["spec"], replaced["timezone"], replaced["revision"]) == ("@every 1h", "UTC", 2)
    assert (replaced["payload"], replaced["priority"], replaced["catch_up"]) == (2, None, "latest")
    next_run_at = datetime.fromisoformat(replaced["next_run_at"])
    assert (next_run_at.minute, next_run_at.second, next_run_at.microsecond) == (0, 0, 0)

    assert ok(run(project, url, "unschedule", "nightly")) == "schedule nightly deleted\n"
    assert one_line_error(run(project, url, "unschedule", "nightly")) == (
        "Error: no schedule nightly"
    )
    assert ok(run(project, url, "schedules")) == "no schedules\n"
    assert ok(run(project, url, "schedules", "--json")) == ""


NEWER_REASON = "unknown queue option(s) 'lease_renewal_s' (saved by a newer alkstore?)"


def _save_as_a_newer_release(project: Path, name: str) -> None:
    """Give the stored schedule ``name`` a queue option this version does
    not know, as a newer release saving it would (regression case 014)."""
    with sqlite3.connect(project / "jobs.db") as conn:
        (text,) = conn.execute(
            "SELECT options FROM _alkstore_schedules WHERE name = ?", (name,)
        ).fetchone()
        options = json.loads(text)
        options["queue_opts"]["lease_renewal_s"] = 5
        conn.execute(
            "UPDATE _alkstore_schedules SET options = ? WHERE name = ?", (json.dumps(options), name)
        )
    conn.close()


def test_schedules_shows_unreadable_schedules_which_schedule_and_unschedule_handle(
    project: Path, url: str
) -> None:
    ok(run(project, url, "schedule", "fine", "@hourly", "reports", "1"))
    ok(run(project, url, "schedule", "newer", "@hourly", "reports", "2"))
    _save_as_a_newer_release(project, "newer")

    lines = ok(run(project, url, "schedules")).splitlines()
    assert len(lines) == 6, lines
    assert lines[0].split()[:2] == ["name", "spec"]
    assert lines[1].split()[0] == "fine"
    assert lines[2:4] == [
        "",
        "1 schedule(s) this version cannot read, so they do not fire here (save again "
        "with `alkstore schedule` or delete with `alkstore unschedule`):",
    ]
    assert lines[4].split() == ["name", "revision", "reason"]
    assert lines[5].split(maxsplit=2) == ["newer", "1", NEWER_REASON]
    assert lines[5].index(NEWER_REASON) == lines[4].index("reason")

    fine, newer = map(json.loads, ok(run(project, url, "schedules", "--json")).splitlines())
    assert (fine["name"], fine["payload"]) == ("fine", 1)
    assert newer == {"name": "newer", "revision": 1, "unreadable": NEWER_REASON}

    # saving it again replaces it; deleting works unread
    ok(run(project, url, "schedule", "newer", "@hourly", "reports", "3"))
    replaced = [
        json.loads(line) for line in ok(run(project, url, "schedules", "--json")).splitlines()
    ]
    assert [(s["name"], s["revision"], s.get("payload")) for s in replaced] == [
        ("fine", 1, 1),
        ("newer", 2, 3),
    ]
    _save_as_a_newer_release(project, "newer")
    ok(run(project, url, "unschedule", "fine"))
    assert ok(run(project, url, "schedules")).splitlines() == [
        "1 schedule(s) this version cannot read, so they do not fire here (save again "
        "with `alkstore schedule` or delete with `alkstore unschedule`):",
        "name   revision  reason",
        f"newer  2         {NEWER_REASON}",
    ]
    assert ok(run(project, url, "unschedule", "newer")) == "schedule newer deleted\n"
    assert ok(run(project, url, "schedules")) == "no schedules\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("x", "61 * * * *", "q", "1"),
            "Error: invalid cron expression '61 * * * *': ",
        ),
        (
            ("x", "* * * *", "q", "1"),
            "Error: invalid cron expression '* * * *': expected 5 fields "
            "(minute hour day-of-month month day-of-week), got 4 (ValidationError)",
        ),
        (("x", "@every 0s", "q", "1"), "Error: schedule '@every 0s': @every duration '0s'"),
        (
            ("x", "@daily", "q", "1", "--timezone", "Mars/Olympus"),
            "Error: unknown time zone 'Mars/Olympus' (ValidationError)",
        ),
        (("bad name", "@daily", "q", "1"), "Error: schedule name 'bad name'"),
        (("x", "@daily", "bad queue", "1"), "Error: queue name 'bad queue'"),
        (("x", "@daily", "q", "{nope"), "Error: the payload is not valid JSON: "),
        (
            ("x", "@daily", "q", "[" * 20_000 + "]" * 20_000),
            "Error: the payload nests deeper than 256 levels",
        ),
    ],
    ids=["cron-field", "cron-arity", "every-0s", "zone", "name", "queue", "json", "deep-json"],
)
def test_a_bad_schedule_is_one_line_and_writes_nothing(
    project: Path, url: str, args: tuple[str, ...], message: str
) -> None:
    alkstore.open(url).close()  # the schema
    line = one_line_error(run(project, url, "schedule", *args))
    assert line.startswith(message)
    if "payload" not in message:
        assert line.endswith("(ValidationError)")
    with read(url) as store:
        assert store.schedules() == []


def test_scheduler_fires_a_schedule_then_exits_0_on_sigterm(project: Path) -> None:
    """On the default store, ``sqlite:///alkstore.db`` in the current directory."""
    ok(command(project, "schedule", "ticker", "@every 1s", "ticks", '{"n": 1}'))
    url = f"sqlite:///{project / 'alkstore.db'}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "alkstore", "scheduler", "--interval", "0.1"],
        cwd=project,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with read(url) as store:
            deadline = time.monotonic() + WAIT_S
            while store.queue("ticks").stats().pending == 0:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the scheduler fired nothing"
                time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "scheduler on sqlite:///alkstore.db, ticking every 0.1 s" in stderr
    assert "schedule 'ticker' fired boundary" in stderr
    *_, received, stopped = stderr.splitlines()
    assert received.endswith("SIGTERM received: stopping")
    assert stopped.endswith("scheduler on sqlite:///alkstore.db stopped")
    with read(url) as store:
        (ticker,) = store.schedules()
        assert ticker.last_job_id is not None
        assert ticker.last_run_at is not None
        job = store.queue("ticks").get_job(ticker.last_job_id)
        assert job is not None
        assert (job.payload, job.state, job.run_at) == ({"n": 1}, "pending", ticker.last_run_at)
        assert ticker.last_run_at.microsecond == 0  # a whole-second boundary
        assert ticker.next_run_at == ticker.last_run_at + timedelta(seconds=1)


def test_app_gives_the_operations_commands_its_store(project: Path, url: str) -> None:
    """``--app`` reaches the app's own store (its URL and engine options:
    docs/command.md), here ``jobs:other`` on ``sqlite:///other.db``."""
    ok(command(project, "migrate", "--app", "jobs:other"))
    assert ok(command(project, "pause", "mail", "--app", "jobs:other")) == "queue mail paused\n"
    with alkstore.open(f"sqlite:///{project / 'other.db'}") as other:
        assert other.queue("mail").is_paused()
    assert not (project / "alkstore.db").exists()
    assert ok(command(project, "schedules", "--app", "jobs:other")) == "no schedules\n"


@pytest.mark.parametrize(
    "args", [("dead", "purge", "mail", "--yes"), ("pause", "mail"), ("cancel", "1", "-q", "mail")]
)
def test_writing_operations_never_create_a_database(project: Path, args: Sequence[str]) -> None:
    line = one_line_error(run(project, f"sqlite:///{project / 'typo.db'}", *args))
    assert "alkstore migrate" in line
    assert not (project / "typo.db").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("dead", "requeue", "mail", "--all", "--delay", "nan"), "must be finite, got nan"),
        (("dead", "requeue", "mail", "--all", "--delay", "-1"), "must be >= 0 seconds"),
        (("dead", "purge", "mail", "--older-than", "inf"), "must be finite, got inf"),
        (("dead", "purge", "mail", "--older-than", "-1"), "must be >= 0 seconds"),
        (("dead", "list", "mail", "--after", str(2**63)), "is not in the range 0<=x<="),
        (("enqueue", "mail", "1", "--delay", "nan"), "must be finite, got nan"),
        (("enqueue", "mail", "1", "--expires", "0"), "must be > 0 seconds"),
        (("enqueue", "mail", "1", "--priority", str(2**31)), "is not in the range"),
        (("enqueue", "mail", "1", "--max-attempts", "0"), "is not in the range 1<=x<="),
        (("schedule", "s", "@daily", "mail", "1", "--expires", "-3"), "must be > 0 seconds"),
        (("job", str(2**63)), "is not in the range 0<=x<="),
    ],
    ids=lambda part: part if isinstance(part, str) else " ".join(part[:2]),
)
def test_a_bad_number_is_a_usage_error_before_the_store_opens(
    project: Path, url: str, args: tuple[str, ...], message: str
) -> None:
    """Exit status 2, as click's own checks: every duration by docs/contract.md §2's
    rule, every per-job option and job id by its range."""
    result = run(project, url, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert not Path(url.removeprefix("sqlite:///")).exists()


def test_scheduler_and_sweeper_need_a_store() -> None:
    with pytest.raises(alkstore.ValidationError, match="a Scheduler needs a Store, not NoneType"):
        alkstore.Scheduler(None)  # type: ignore[arg-type]
    with pytest.raises(alkstore.ValidationError, match="a Sweeper needs a Store, not NoneType"):
        alkstore.Sweeper(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("schedule", "s", "@every 1h", "bad name", "1"), "queue name 'bad name'"),
        (("schedule", "bad name", "@every 1h", "q", "1"), "schedule name 'bad name'"),
        (("schedule", "s", "bogus spec", "q", "1"), "invalid cron expression 'bogus spec'"),
        (("schedule", "s", "@hourly", "q", "1", "--timezone", "Mars/Base"), "Mars/Base"),
        (("unschedule", "bad name"), "schedule name 'bad name'"),
    ],
)
def test_schedule_arguments_are_checked_before_the_store_opens(
    project: Path, args: Sequence[str], message: str
) -> None:
    line = one_line_error(run(project, f"sqlite:///{project / 'typo.db'}", *args))
    assert message in line
    assert "(ValidationError)" in line
    assert not (project / "typo.db").exists()


# -- workers -------------------------------------------------------------------


def test_workers_lists_the_live_records(project: Path, url: str) -> None:
    ok(run(project, url, "migrate"))
    assert ok(run(project, url, "workers")) == "no live workers\n"
    now = datetime.now(UTC)
    with alkstore.open(url) as store:
        store.register_worker(
            alkstore.WorkerInfo("w-1", "box", 77, ("mail", "pdf"), 4, now, now, (9, 3), 3600.0)
        )
        store.register_worker(
            alkstore.WorkerInfo("w-gone", "box", 78, ("mail",), 1, now, now, (), 0.000001)
        )
        (stored,) = store.workers()
    lines = ok(run(project, url, "workers")).splitlines()
    assert lines[0].split() == [
        "id",
        "host:pid",
        "queues",
        "busy",
        "started_at",
        "last_seen_at",
        "running",
    ]
    started = stored.started_at.isoformat(timespec="seconds")
    seen = stored.last_seen_at.isoformat(timespec="seconds")
    assert [line.split() for line in lines[1:]] == [
        ["w-1", "box:77", "mail,pdf", "2/4", started, seen, "3", "9"]
    ]
    (record,) = [
        json.loads(line) for line in ok(run(project, url, "workers", "--json")).splitlines()
    ]
    assert record == {
        "id": "w-1",
        "host": "box",
        "pid": 77,
        "queues": ["mail", "pdf"],
        "concurrency": 4,
        "started_at": stored.started_at.isoformat(),
        "last_seen_at": stored.last_seen_at.isoformat(),
        "running": [3, 9],
        "ttl_s": 3600.0,
    }


def test_workers_prints_stored_control_characters_escaped(project: Path, url: str) -> None:
    """A worker id is any text: a newline or an escape sequence in one
    neither adds a row nor reaches the terminal."""
    now = datetime.now(UTC)
    with alkstore.open(url) as store:
        store.register_worker(
            alkstore.WorkerInfo("w\nforged \x1b]0;x\x07", "h", 1, ("q",), 1, now, now, (), 60.0)
        )
    lines = ok(run(project, url, "workers")).splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("w\\nforged \\x1b]0;x\\x07  ")
    assert "\x1b" not in "".join(lines)
