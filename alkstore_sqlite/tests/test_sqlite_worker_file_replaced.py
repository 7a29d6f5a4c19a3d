"""Regression case 016 end to end: an ``alkstore worker`` whose database file is
deleted mid-drain and made again by a producer stops, exiting non-zero,
and a fresh worker runs every job enqueued into the new file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import alkstore

# How long the test waits for a process or a file, seconds.
_WAIT_S = 60.0
_OLD_JOBS = 300
# The old job whose handler holds the worker while the files are deleted
# (769 of 3,000 in the case).
_HELD_AT = 77
_NEW_JOBS = 200

_JOBS = textwrap.dedent(
    f"""
    import time
    from pathlib import Path
    import alkstore

    app = alkstore.App()
    HERE = Path(__file__).parent

    @app.task(queue="q", name="work")
    def work(tag, i):
        if tag == "old" and i == {_HELD_AT}:
            (HERE / "reached").write_text("")
            deadline = time.monotonic() + {_WAIT_S}
            while not (HERE / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        (HERE / f"ran-{{tag}}-{{i}}").write_text("")
    """
)

_PRODUCER = textwrap.dedent(
    """
    import sys
    import alkstore

    with alkstore.open(sys.argv[1]) as store:
        store.queue("q").enqueue_many(
            [{"task": "work", "args": ["new", i]} for i in range(int(sys.argv[2]))]
        )
    """
)


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}


def _worker(project: Path, url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "alkstore",
            "--url",
            url,
            "worker",
            "jobs:app",
            "--poll-interval",
            "0.1",
            *extra,
        ],
        cwd=project,
        env=_environ(),
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, worker: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + _WAIT_S
    while not path.exists():
        assert worker.poll() is None, worker.communicate()[1]
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.01)


def _finish(worker: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, stderr = worker.communicate(timeout=_WAIT_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        _, stderr = worker.communicate()
        raise AssertionError(f"the worker did not exit:\n{stderr[-4000:]}") from None
    return worker.returncode, stderr


def test_case_016_a_worker_whose_file_is_replaced_exits_and_a_fresh_one_drains_the_new_file(
    tmp_path: Path,
) -> None:
    project = tmp_path
    (project / "jobs.py").write_text(_JOBS)
    path = project / "q.db"
    url = f"sqlite:///{path}"
    with alkstore.open(url) as store:
        store.queue("q").enqueue_many(
            [{"task": "work", "args": ["old", i]} for i in range(_OLD_JOBS)]
        )
    worker = _worker(project, url)
    try:
        _wait_for(project / "reached", worker)
        for suffix in ("", "-wal", "-shm"):
            os.remove(f"{path}{suffix}")
        subprocess.run(
            [sys.executable, "-c", _PRODUCER, url, str(_NEW_JOBS)],
            check=True,
            cwd=project,
            env=_environ(),
            timeout=_WAIT_S,
        )
        (project / "go").write_text("")
        code, stderr = _finish(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert code != 0, stderr[-4000:]
    assert "while this store had" in stderr, stderr[-4000:]
    # The stopped worker ran none of the new jobs; a fresh one runs them all.
    assert not list(project.glob("ran-new-*"))
    fresh = _worker(project, url, "--burst")
    code, stderr = _finish(fresh)
    assert code == 0, stderr[-4000:]
    ran = {p.name for p in project.glob("ran-new-*")}
    assert ran == {f"ran-new-{i}" for i in range(_NEW_JOBS)}
    with alkstore.open(url) as store:
        stats = store.queue("q").stats()
        assert (stats.pending, stats.processing, stats.dead) == (0, 0, 0)
    # What the deleted file still held is in the copy the old worker saved.
    (rescue,) = project.glob("q.db-alkstore-rescue-*.db")
    with alkstore.open(f"sqlite:///{rescue}", migrate=False) as saved:
        stats = saved.queue("q").stats()
        assert stats.pending + stats.processing >= _OLD_JOBS - _HELD_AT - 1
