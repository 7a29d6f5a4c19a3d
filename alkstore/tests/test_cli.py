"""The ``alkstore`` command, run in subprocesses on SQLite (docs/command.md)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import alkstore
import alkstore_sqlite
from alkstore.engine import check_schema_version, redact_url
from alkstore.runtime.signals import EXIT_AFTER_S

WAIT_S = 60.0

JOBS = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import alkstore

    app = alkstore.App()
    HERE = Path(__file__).parent

    @app.task(queue="mail", name="send", max_attempts=3)
    def send(to):
        (HERE / f"sent-{to}").write_text(to)

    @app.task(queue="mail", name="slow")
    def slow(name):
        (HERE / f"started-{name}").write_text("")
        deadline = time.monotonic() + 60
        while not (HERE / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        (HERE / f"done-{name}").write_text("")

    other = alkstore.App("sqlite:///other.db")
    not_an_app = 42
    """
)


def command(
    project: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m alkstore ARGS`` in ``project``, with ``ALKSTORE_URL`` unset
    unless ``env`` sets it, and ``stdin`` as its input."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "alkstore", *args],
        check=False,
        cwd=project,
        env=environ,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )


def start(project: Path, *args: str) -> subprocess.Popen[str]:
    """``python -m alkstore ARGS`` started in ``project`` as :func:`command`
    runs it, its stdout and stderr piped, left running."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "alkstore", *args],
        cwd=project,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The error of a failed command: exit status 1, one line on stderr."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


def wait_for(path: Path, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.02)


def test_help_lists_the_commands(project: Path) -> None:
    out = ok(command(project, "--help"))
    for name in ("worker", "enqueue", "stats", "job", "migrate"):
        assert name in out
    assert alkstore.__version__ in ok(command(project, "--version"))


def test_the_console_script_is_installed(project: Path) -> None:
    script = shutil.which("alkstore", path=str(Path(sys.executable).parent))
    assert script is not None
    result = subprocess.run(
        [script, "--help"], check=False, capture_output=True, text=True, timeout=WAIT_S
    )
    assert "worker" in ok(result)


def test_migrate_then_enqueue_stats_and_job(project: Path, url: str) -> None:
    assert "created the alkstore schema" in ok(command(project, "--url", url, "migrate"))
    first = int(ok(command(project, "--url", url, "enqueue", "mail", '{"task": "send"}')))
    second = ok(
        command(project, "--url", url, "enqueue", "mail", '"x"', "--delay", "60", "--priority", "5")
    )
    assert int(second) == first + 1

    table = ok(command(project, "--url", url, "stats", "-q", "mail", "-q", "empty"))
    assert table.splitlines() == [
        "queue  pending  scheduled  processing  lapsed  dead  paused",
        "mail         1          1           0       0     0  no",
        "empty        0          0           0       0     0  no",
    ]

    shown = ok(command(project, "--url", url, "job", second.strip(), "-q", "empty", "-q", "mail"))
    fields = dict(line.split(None, 1) for line in shown.splitlines())
    assert fields["queue"] == "mail"
    assert fields["priority"] == "5"
    assert fields["payload"] == '"x"'
    assert fields["worker_id"] == "-"

    as_json = json.loads(
        ok(command(project, "--url", url, "job", str(first), "-q", "mail", "--json"))
    )
    assert as_json["payload"] == {"task": "send"}
    assert as_json["state"] == "pending"
    assert as_json["run_at"].endswith("+00:00")


def test_enqueue_with_a_unique_key_prints_the_live_jobs_id(project: Path, url: str) -> None:
    def enqueue(*extra: str) -> subprocess.CompletedProcess[str]:
        return command(project, "--url", url, "enqueue", "mail", '"x"', *extra)

    first = ok(enqueue("--unique-key", "user:7")).strip()
    assert ok(enqueue("--unique-key", "user:7", "--priority", "9")).strip() == first
    assert ok(enqueue("--unique-key", "user:8")).strip() != first
    shown = ok(command(project, "--url", url, "job", first, "-q", "mail"))
    fields = dict(line.split(None, 1) for line in shown.splitlines())
    assert (fields["unique_key"], fields["priority"]) == ("user:7", "0")
    refused = enqueue("--unique-key", "")
    assert refused.returncode == 1
    assert "unique_key must be 1 to 255 characters" in refused.stderr


def test_enqueue_with_an_app_gives_a_task_payload_its_tasks_unique_key(
    project: Path, url: str
) -> None:
    """As ``task.enqueue`` would: the task's ``unique_key`` rule keys the
    call, and ``--unique-key`` wins over it."""
    (project / "uniq.py").write_text(
        "import alkstore\n"
        "app = alkstore.App()\n"
        "@app.task(queue='reports', name='report', unique_key=True)\n"
        "def report(month):\n"
        "    pass\n"
    )

    def enqueue(*extra: str) -> str:
        payload = '{"task": "report", "args": ["2026-11"]}'
        return ok(command(project, "--url", url, "enqueue", "reports", payload, *extra)).strip()

    first = enqueue("--app", "uniq:app")
    assert enqueue("--app", "uniq:app") == first
    assert enqueue("--app", "uniq:app", "--unique-key", "by-hand") != first
    with alkstore.open(url, migrate=False) as store:
        job = store.queue("reports").get_job(int(first))
        assert job is not None
        assert job.unique_key is not None
        assert len(job.unique_key) == 64


def make_sqlite_version_1(path: Path) -> None:
    """Replace the store at ``path`` by an empty one as version 1 of the
    code made it."""
    from alkstore_sqlite import _schema

    path.unlink()
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(_schema._CREATE_META)
        for statement in _schema._MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO _alkstore_meta VALUES ('schema_version', 1)")


def test_migrate_says_what_it_did(project: Path) -> None:
    """Created, already current, upgraded from an old version, or refused as
    newer: each said in one line. (On PostgreSQL:
    alkstore_postgres/tests/test_postgres_schema.py.)"""
    path = project / "jobs.db"
    version = alkstore_sqlite.SCHEMA_VERSION

    def migrate() -> subprocess.CompletedProcess[str]:
        return command(project, "migrate", "--url", f"sqlite:///{path}")

    assert ok(migrate()) == f"created the alkstore schema at version {version}\n"
    assert ok(migrate()) == f"the alkstore schema is already at version {version}\n"
    make_sqlite_version_1(path)
    assert ok(migrate()) == f"upgraded the alkstore schema from version 1 to {version}\n"
    assert ok(migrate()) == f"the alkstore schema is already at version {version}\n"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("UPDATE _alkstore_meta SET value = value + 1")
    line = one_line_error(migrate())
    assert f"is version {version + 1}, newer than this code's {version}" in line
    assert line.endswith("(SchemaVersionError)")


def test_migrate_creates_the_schema_of_an_app_that_never_migrates(project: Path) -> None:
    """``App(..., migrate=False)``: the app's own option keeps its workers
    from migrating, not ``alkstore migrate``."""
    (project / "strict.py").write_text(
        "import alkstore\napp = alkstore.App('sqlite:///never.db', migrate=False)\n"
    )
    assert "SchemaVersionError" in one_line_error(
        command(project, "stats", "-q", "mail", "--app", "strict:app")
    )
    assert not (project / "never.db").exists()
    assert ok(command(project, "migrate", "--app", "strict:app")) == (
        f"created the alkstore schema at version {alkstore_sqlite.SCHEMA_VERSION}\n"
    )
    assert "mail" in ok(command(project, "stats", "-q", "mail", "--app", "strict:app"))


def test_schema_version_errors_carry_both_versions() -> None:
    with pytest.raises(alkstore.SchemaVersionError) as missing:
        check_schema_version(None, 4, migrating=False)
    assert (missing.value.found, missing.value.expected) == (None, 4)
    with pytest.raises(alkstore.SchemaVersionError) as newer:
        check_schema_version(5, 4, migrating=True)
    assert (newer.value.found, newer.value.expected) == (5, 4)
    assert (alkstore.SchemaVersionError("x").found, alkstore.SchemaVersionError("x").expected) == (
        None,
        None,
    )


def test_the_url_comes_from_the_environment(project: Path, url: str) -> None:
    env = {"ALKSTORE_URL": url}
    job_id = ok(command(project, "enqueue", "mail", "1", env=env)).strip()
    assert ok(command(project, "job", job_id, "-q", "mail", env=env))
    assert (project / "jobs.db").exists()
    assert not (project / "alkstore.db").exists()


def test_the_url_may_follow_the_command(project: Path, url: str) -> None:
    elsewhere = {"ALKSTORE_URL": f"sqlite:///{project / 'elsewhere.db'}"}
    job_id = ok(command(project, "enqueue", "mail", "1", "--url", url, env=elsewhere)).strip()
    assert ok(command(project, "job", job_id, "-q", "mail", "--url", url))
    assert "no dead jobs in queue mail" in ok(
        command(project, "dead", "list", "mail", "--url", url)
    )
    assert (project / "jobs.db").exists()
    assert not (project / "elsewhere.db").exists()


def test_the_default_store_is_the_embedded_file(project: Path) -> None:
    ok(command(project, "enqueue", "mail", "1"))
    assert (project / "alkstore.db").exists()


def test_an_app_names_the_queues_and_their_options(project: Path, url: str) -> None:
    job_id = ok(command(project, "--url", url, "enqueue", "mail", "{}", "--app", "jobs:app"))
    shown = json.loads(
        ok(command(project, "--url", url, "job", job_id.strip(), "--app", "jobs", "--json"))
    )
    assert shown["max_attempts"] == 3  # the app's option for "mail"
    table = ok(command(project, "--url", url, "stats", env={"ALKSTORE_APP": "jobs:app"}))
    assert table.splitlines()[1].split() == ["mail", "1", "0", "0", "0", "0", "no"]


def test_worker_burst_runs_the_jobs_and_logs_each(project: Path, url: str) -> None:
    for to in ("ada", "bob"):
        ok(
            command(
                project,
                "--url",
                url,
                "enqueue",
                "mail",
                json.dumps({"task": "send", "args": [to]}),
            )
        )
    ok(command(project, "--url", url, "enqueue", "mail", '{"task": "nope"}'))
    result = command(project, "--url", url, "worker", "jobs:app", "--burst", "-c", "2")
    ok(result)
    assert (project / "sent-ada").exists()
    assert (project / "sent-bob").exists()
    assert result.stderr.count(") succeeded: attempt 1 of 5") == 2  # enqueued without --app
    assert "unknown task 'nope'" in result.stderr
    table = ok(command(project, "--url", url, "stats", "--app", "jobs:app"))
    assert table.splitlines()[1].split() == ["mail", "0", "0", "0", "0", "1", "no"]


@pytest.mark.parametrize(
    ("options", "chores"),
    [
        ((), "sweep every 60 s, schedule tick every 1 s"),
        (("--tick-interval", "0"), "sweep every 60 s, no schedule tick"),
        (
            ("--sweep-interval", "0", "--tick-interval", "2.5"),
            "no sweep, schedule tick every 2.5 s",
        ),
    ],
)
def test_worker_chore_intervals_reach_the_worker(
    project: Path, url: str, options: tuple[str, ...], chores: str
) -> None:
    result = command(project, "--url", url, "worker", "jobs:app", "--burst", *options)
    ok(result)
    assert f"started: queues mail, concurrency 1, prefetch 100, {chores}, burst" in result.stderr


def test_a_url_on_the_command_line_overrides_the_apps(project: Path, url: str) -> None:
    """``jobs:other`` was made with ``sqlite:///other.db``; ``--url`` wins."""
    ok(command(project, "--url", url, "enqueue", "mail", '{"task": "send", "args": ["x"]}'))
    ok(command(project, "--url", url, "worker", "jobs:other", "-q", "mail", "--burst"))
    assert not (project / "other.db").exists()
    table = ok(command(project, "--url", url, "stats", "-q", "mail"))
    assert table.splitlines()[1].split() == [
        "mail",
        "0",
        "0",
        "0",
        "0",
        "1",
        "no",
    ]  # other has no tasks


def test_sigterm_lets_the_running_job_finish(project: Path, url: str) -> None:
    ok(command(project, "--url", url, "enqueue", "mail", '{"task": "slow", "args": ["a"]}'))
    worker = start(project, "--url", url, "worker", "jobs:app", "--poll-interval", "0.1")
    try:
        wait_for(project / "started-a")
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert worker.poll() is None, "the worker exited before its job finished"
        (project / "release").write_text("")
        _, stderr = worker.communicate(timeout=WAIT_S)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    assert (project / "done-a").exists()
    assert "SIGTERM received" in stderr
    assert "succeeded" in stderr
    table = ok(command(project, "--url", url, "stats", "-q", "mail"))
    assert table.splitlines()[1].split() == ["mail", "0", "0", "0", "0", "0", "no"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_ends_the_worker_within_3_s_even_with_its_loop_blocked(
    project: Path, url: str, signum: int
) -> None:
    """docs/command.md: after a second signal the worker returns, or the
    signal ends the process 3 s after it was sent, however its run's end
    is held up (here an async task that blocks the worker's event loop)."""
    (project / "blocking.py").write_text(
        textwrap.dedent(
            """
            import time
            from pathlib import Path
            import alkstore

            app = alkstore.App()

            @app.task(queue="aio", name="blocks")
            async def blocks(name):
                # A sync call in an async task blocks the worker's event loop.
                (Path(__file__).parent / f"started-{name}").write_text("")
                time.sleep(20)
            """
        )
    )
    ok(command(project, "--url", url, "enqueue", "aio", '{"task": "blocks", "args": ["b"]}'))
    worker = start(project, "--url", url, "worker", "blocking:app")
    try:
        wait_for(project / "started-b")
        worker.send_signal(signum)
        assert worker.stderr is not None
        for line in worker.stderr:  # the first signal taken: the grace period began
            if "received: stopping" in line:
                break
        worker.send_signal(signum)
        sent = time.monotonic()
        _, stderr = worker.communicate(timeout=WAIT_S)
        took = time.monotonic() - sent
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode in (0, -signum), stderr
    assert took < EXIT_AFTER_S + 1.5, stderr


def test_stats_watch_redraws_until_interrupted(project: Path, url: str) -> None:
    """SIGINT once two tables are out, never on a timer: a signal that came
    while the interpreter was still starting up (a loaded machine) would end
    it by KeyboardInterrupt outside the command, status -2."""
    ok(command(project, "--url", url, "enqueue", "mail", "1"))
    watch = start(project, "--url", url, "stats", "-q", "mail", "--watch", "--interval", "0.1")
    lines: list[str] = []
    two_tables = threading.Event()

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:  # click.echo flushes each redraw
            lines.append(line)
            if sum(x.startswith("queue  pending") for x in lines) >= 2:
                two_tables.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert two_tables.wait(WAIT_S), (lines, watch.poll())
        watch.send_signal(signal.SIGINT)  # inside the redraw loop by now
        _, stderr = watch.communicate(timeout=WAIT_S)
        reader.join(WAIT_S)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 0, stderr
    assert stderr == ""
    tables = [i for i, line in enumerate(lines) if line.startswith("queue  pending")]
    assert len(tables) >= 2
    assert all(lines[i + 1].split()[:2] == ["mail", "1"] for i in tables)
    assert "(Ctrl-C to stop)" in lines[tables[0] - 1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--url", "nosuch://x", "migrate"), "no alkstore engine for the scheme 'nosuch'"),
        (("enqueue", "bad name", "1"), "queue name"),
        (("enqueue", "mail", "{not json"), "the payload is not valid JSON"),
        # Deeper than json's recursion limit, and than the codec's 256 levels.
        (("enqueue", "mail", "[" * 20_000 + "]" * 20_000), "nests deeper than 256 levels"),
        (("enqueue", "mail", "[" * 300 + "]" * 300), "nests deeper than 256 levels"),
        (("stats",), "SchemaVersionError"),
        (("job", "1", "-q", "mail"), "SchemaVersionError"),
        (("worker", "nosuchmodule:app"), "cannot import 'nosuchmodule'"),
        (("worker", "jobs:missing"), "has no attribute 'missing'"),
        (("worker", "jobs:not_an_app"), "not an alkstore.App"),
        (("worker", ":app"), "names no module"),
    ],
)
def test_errors_are_one_line_and_exit_1(project: Path, args: tuple[str, ...], message: str) -> None:
    line = one_line_error(command(project, *args))
    assert message in line


#: A bad argument for every check of every command, and what its error says.
BAD_ARGUMENTS = [
    (("worker", "jobs:app", "-q", "bad name"), "queue name 'bad name'"),
    (("worker", "jobs:app", "--worker-id", ""), "worker_id must be 1 to 255 characters"),
    (("worker", "jobs:app", "-c", "0"), "is not in the range 1<=x<=1024"),
    (("worker", "jobs:app", "--poll-interval", "0"), "must be > 0 seconds"),
    (("worker", "jobs:app", "--grace-period", "-1"), "must be >= 0 seconds"),
    (("worker", "nosuchmodule:app"), "cannot import 'nosuchmodule'"),
    (("enqueue", "bad name", "1"), "queue name 'bad name'"),
    (("enqueue", "bad name", "1", "--app", "jobs:app"), "queue name 'bad name'"),
    (("enqueue", "mail", "{not json"), "the payload is not valid JSON"),
    (("enqueue", "mail", '"\\ud800"'), "payload holds a lone surrogate"),
    (
        ("enqueue", "mail", '{"task": "send", "args": ["\\ud800"]}', "--app", "jobs:app"),
        "payload['args'][0] holds a lone surrogate",
    ),
    (("enqueue", "mail", '{"task": "sned"}', "--app", "jobs:app"), "has no task 'sned'"),
    (("enqueue", "mail", "1", "--delay", "60", "--expires", "10"), "the job would expire"),
    (("enqueue", "mail", "1", "--delay", "nan"), "must be finite, got nan"),
    (("enqueue", "mail", "1", "--max-attempts", "0"), "is not in the range 1<=x<="),
    (("stats", "-q", "bad name"), "queue name 'bad name'"),
    (("stats", "--watch", "--interval", "0"), "is not in the range x>=0.1"),
    (("job", "1", "-q", "bad name"), "queue name 'bad name'"),
    (("job", "one"), "'one' is not a valid integer"),
    (("pause", "bad name"), "queue name 'bad name'"),
    (("resume", "bad name"), "queue name 'bad name'"),
    (("dead", "list", "bad name"), "queue name 'bad name'"),
    (("dead", "list", "mail", "--limit", "0"), "is not in the range 1<=x<=10000"),
    (("dead", "requeue", "bad name", "--all"), "queue name 'bad name'"),
    (("dead", "requeue", "mail"), "give the dead job ids to requeue, or --all"),
    (("dead", "requeue", "mail", "--all", "--delay", "-1"), "must be >= 0 seconds"),
    (("dead", "purge", "bad name", "--yes"), "queue name 'bad name'"),
    (("dead", "purge", "mail", "--older-than", "inf"), "must be finite, got inf"),
    (("schedule", "bad name", "@daily", "q", "1"), "schedule name 'bad name'"),
    (("schedule", "s", "@daily", "bad name", "1"), "queue name 'bad name'"),
    (("schedule", "s", "bogus", "q", "1"), "invalid cron expression 'bogus'"),
    (("schedule", "s", "@daily", "q", "{nope"), "the payload is not valid JSON"),
    (("schedule", "s", "@daily", "q", '"\\ud800"'), "lone surrogate"),
    (("unschedule", "bad name"), "schedule name 'bad name'"),
    (("scheduler", "--interval", "0"), "must be > 0 seconds"),
    (("migrate", "--app", "nosuchmodule:app"), "cannot import 'nosuchmodule'"),
]


@pytest.mark.parametrize(
    ("args", "message"), BAD_ARGUMENTS, ids=[" ".join(args) for args, _ in BAD_ARGUMENTS]
)
def test_no_command_creates_a_database_before_refusing_an_argument(
    project: Path, args: tuple[str, ...], message: str
) -> None:
    """On the default store, ``sqlite:///alkstore.db`` in the current
    directory: every argument is checked before the store opens, so a bad
    one is reported as itself and leaves no file behind."""
    before = sorted(p.name for p in project.iterdir())
    result = command(project, *args)
    assert result.returncode in (1, 2), (result.stdout, result.stderr)
    assert message in result.stderr, result.stderr
    assert "SchemaVersionError" not in result.stderr
    assert sorted(p.name for p in project.iterdir() if p.name != "__pycache__") == before


def test_a_missing_job_is_an_error(project: Path, url: str) -> None:
    ok(command(project, "--url", url, "migrate"))
    result = command(project, "--url", url, "job", "99", "-q", "mail")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        unknown_queue_warning("mail"),
        "Error: no job 99 in queue(s) mail",
    ]


def unknown_queue_warning(name: str, app_spec: str | None = None) -> str:
    """What a command prints on stderr for a queue it does not know."""
    if app_spec is None:
        return (
            f"Warning: queue {name!r} holds no jobs and is not paused: check its name "
            "(with --app MODULE:APP, the queues of the app's tasks count as known)"
        )
    return (
        f"Warning: queue {name!r} holds no jobs, is not paused, and no task or relay of "
        f"{app_spec} declares it: check its name"
    )


#: Each command that takes a queue name, given the mistyped ``mial``.
ON_AN_UNKNOWN_QUEUE = [
    (("pause", "mial"), "queue mial paused\n"),
    (("resume", "mial"), "queue mial was not paused\n"),
    (("enqueue", "mial", "1"), "1\n"),
    (("stats", "-q", "mial"), None),
    (("dead", "list", "mial"), "no dead jobs in queue mial\n"),
    (("dead", "requeue", "mial", "--all"), "0 job(s) requeued\n"),
    (("dead", "purge", "mial", "--yes"), "0 dead job(s) purged\n"),
]


@pytest.mark.parametrize("app_spec", [None, "jobs:app"])
@pytest.mark.parametrize(
    ("args", "out"),
    ON_AN_UNKNOWN_QUEUE,
    ids=[" ".join(a for a in args if a != "mial") for args, _ in ON_AN_UNKNOWN_QUEUE],
)
def test_a_queue_nothing_knows_gets_a_warning_and_the_command_goes_on(
    project: Path, url: str, app_spec: str | None, args: tuple[str, ...], out: str | None
) -> None:
    """No task declares ``mial`` and it holds no row: a typo, most likely,
    which would otherwise act on an empty queue in silence."""
    ok(command(project, "--url", url, "migrate"))
    app = () if app_spec is None else ("--app", app_spec)
    result = command(project, "--url", url, *args, *app)
    if out is None:  # a table
        assert ok(result).splitlines()[1].split()[0] == "mial"
    else:
        assert ok(result) == out
    assert result.stderr.splitlines() == [unknown_queue_warning("mial", app_spec)]
    # A queue the app declares, or one that holds a job, is known.
    known = command(project, "--url", url, *(a.replace("mial", "mail") for a in args), *app)
    if app_spec is None:
        assert known.stderr.splitlines() == [unknown_queue_warning("mail")]
        ok(command(project, "--url", url, "enqueue", "mail", "2"))
        known = command(project, "--url", url, *(a.replace("mial", "mail") for a in args))
    assert known.returncode == 0, known.stderr
    assert known.stderr == ""


def test_worker_and_job_warn_about_a_queue_nothing_knows(project: Path, url: str) -> None:
    ok(command(project, "--url", url, "migrate"))
    worker = command(project, "--url", url, "worker", "jobs:app", "-q", "mial", "--burst")
    ok(worker)
    assert unknown_queue_warning("mial", "jobs:app") in worker.stderr.splitlines()
    assert "started: queues mial," in worker.stderr  # and it ran on it
    declared = command(project, "--url", url, "worker", "jobs:app", "-q", "mail", "--burst")
    assert "Warning" not in ok(declared) + declared.stderr
    job = command(
        project, "--url", url, "job", "1", "-q", "mail", "-q", "mial", "--app", "jobs:app"
    )
    assert job.stderr.splitlines() == [
        unknown_queue_warning("mial", "jobs:app"),
        "Error: no job 1 in queue(s) mail, mial",
    ]


def test_redact_url_hides_passwords() -> None:
    assert redact_url("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact_url("sqlite:///x.db") == "sqlite:///x.db"
    # libpq's query-string passwords too, in any case and position.
    assert (
        redact_url("postgresql://u@h/db?sslmode=require&PASSWORD=s3cret&sslpassword=k#f")
        == "postgresql://u@h/db?sslmode=require&PASSWORD=***&sslpassword=***#f"
    )
    assert redact_url("postgresql:///db?password=") == "postgresql:///db?password=***"


# -- read-only commands never migrate ----------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("stats", "--app", "jobs:app"),
        ("job", "1", "--app", "jobs:app"),
        ("stats", "-q", "mail"),
        ("job", "1", "-q", "mail"),
    ],
)
def test_read_only_commands_never_create_a_database(project: Path, args: tuple[str, ...]) -> None:
    """A mistyped --url: an error saying to migrate, and no file created,
    with --app as without."""
    line = one_line_error(command(project, "--url", "sqlite:///typo.db", *args))
    assert "SchemaVersionError" in line
    assert "alkstore migrate" in line
    assert not (project / "typo.db").exists()


def test_read_only_commands_do_not_migrate_an_apps_own_store(project: Path) -> None:
    """``jobs:other`` names ``sqlite:///other.db`` (migrate=True by default)."""
    (project / "strict.py").write_text(
        "import alkstore\n"
        "app = alkstore.App('sqlite:///strict.db', migrate=True)\n"
        "app.task(queue='mail', name='t')(print)\n"
    )
    for spec in ("jobs:other", "strict:app"):
        for args in (("stats",), ("job", "1")):
            line = one_line_error(command(project, *args, "-q", "mail", "--app", spec))
            assert "SchemaVersionError" in line
    assert "jobs:other has no tasks" in one_line_error(
        command(project, "stats", "--app", "jobs:other")
    )
    assert not (project / "other.db").exists()
    assert not (project / "strict.db").exists()
    # enqueue and worker still migrate, as the app says.
    ok(command(project, "enqueue", "mail", "{}", "--app", "strict:app"))
    assert ok(command(project, "stats", "--app", "strict:app")).splitlines()[1].split() == [
        "mail",
        "1",
        "0",
        "0",
        "0",
        "0",
        "no",
    ]


# -- an app that cannot be loaded: one line ------------------------------------

BROKEN_MODULES = {
    "syntax": ("def f(:\n", "SyntaxError"),
    "raises": ("raise RuntimeError('no config\\nsecond line')\n", "RuntimeError: no config"),
    "badqueue": (
        "import alkstore\napp = alkstore.App()\n@app.task(queue='bad name')\ndef f(): pass\n",
        "ValidationError: queue name 'bad name'",
    ),
    "missingdep": ("import no_such_dependency\n", "No module named 'no_such_dependency'"),
    "noapp": ("x = 1\n", "has no attribute 'app'"),
    "notapp": ("app = 42\n", "it is of type int, not an alkstore.App"),
    "attrraises": (
        "def __getattr__(name):\n    raise LookupError('lazy attribute failed')\n",
        "LookupError: lazy attribute failed",
    ),
}


@pytest.mark.parametrize("name", sorted(BROKEN_MODULES))
@pytest.mark.parametrize(
    "args",
    [
        ("worker", "{spec}"),
        ("stats", "--app", "{spec}"),
        ("job", "1", "--app", "{spec}"),
        ("enqueue", "mail", "1", "--app", "{spec}"),
    ],
)
def test_an_app_that_cannot_be_loaded_is_one_line(
    project: Path, url: str, name: str, args: tuple[str, ...]
) -> None:
    source, fragment = BROKEN_MODULES[name]
    (project / f"broken_{name}.py").write_text(source)
    spec = f"broken_{name}:app"
    result = command(project, "--url", url, *(a.format(spec=spec) for a in args))
    line = one_line_error(result)
    assert f"cannot load the app {spec}" in line
    assert fragment in line
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args", [("--debug", "worker", "broken:app"), ("worker", "broken:app", "--debug")]
)
def test_debug_prints_the_traceback_first(project: Path, args: tuple[str, ...]) -> None:
    (project / "broken.py").write_text("raise RuntimeError('at import')\n")
    result = command(project, *args)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: cannot load the app broken:app: importing 'broken' raised RuntimeError: at import"
    )


def test_worker_logging_configured_by_the_apps_module_wins(project: Path, url: str) -> None:
    (project / "logged.py").write_text(
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='APPLOG %(message)s')\n"
        "from jobs import app\n"
    )
    result = command(project, "--url", url, "worker", "logged:app", "--burst")
    assert "APPLOG worker" in ok(result) + result.stderr


# -- enqueue --app --------------------------------------------------------------


def test_enqueue_with_an_app_checks_the_task(project: Path, url: str) -> None:
    for payload, message in (
        ('{"task": "sned", "args": ["x"]}', "jobs:app has no task 'sned' (its tasks: send, slow)"),
        ('{"task": "send", "args": ["x", "y"]}', "too many positional arguments"),
        ('{"task": "send", "kwargs": {"too": "x"}}', "task 'send' cannot be called"),
        ('{"task": "send", "args": {}}', '"args" must be a list'),
    ):
        line = one_line_error(
            command(project, "--url", url, "enqueue", "mail", payload, "--app", "jobs:app")
        )
        assert message in line
    assert not (project / "jobs.db").exists()  # refused before the store opened
    job_id = ok(
        command(
            project,
            "--url",
            url,
            "enqueue",
            "mail",
            '{"task": "send", "args": ["x"]}',
            "--app",
            "jobs:app",
        )
    )
    shown = json.loads(
        ok(command(project, "--url", url, "job", job_id.strip(), "-q", "mail", "--json"))
    )
    assert shown["max_attempts"] == 3  # the task's queue options, not QueueOpts()
    # Without --app: the defaults, unchecked.
    job_id = ok(command(project, "--url", url, "enqueue", "mail", '{"task": "sned"}'))
    shown = json.loads(
        ok(command(project, "--url", url, "job", job_id.strip(), "-q", "mail", "--json"))
    )
    assert shown["max_attempts"] == 5


def test_enqueue_with_an_app_warns_when_the_task_lives_on_another_queue(
    project: Path, url: str
) -> None:
    payload = '{"task": "send", "args": ["x"]}'
    elsewhere = command(project, "--url", url, "enqueue", "other", payload, "--app", "jobs:app")
    assert ok(elsewhere).strip().isdigit()  # enqueued all the same: -q other would run it
    assert elsewhere.stderr.strip() == (
        "Warning: task 'send' is declared on queue 'mail', not 'other': "
        "`alkstore worker jobs:app` claims from 'other' only when started with -q other"
    )
    home = command(project, "--url", url, "enqueue", "mail", payload, "--app", "jobs:app")
    assert ok(home).strip().isdigit()
    assert home.stderr == ""
