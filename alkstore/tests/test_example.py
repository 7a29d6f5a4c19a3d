"""The examples, run as a user runs them: the README's main job,
``examples/quickstart.py``, its summary checked against hashes computed here
with hashlib; and the code blocks of the docs pages that show a whole
program, each page's blocks run in order in a folder of their own."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

import pytest

import alkstore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "quickstart.py"
SKIPPED = {"__pycache__", "site-packages", "dist-packages"}


def expected_files(root: Path) -> dict[bytes, bytes]:
    """Every regular file the example should hash, by ``./relative`` path
    as bytes, as ``find .`` prints it (written independently of the
    example's own walk): every name, printable or not, UTF-8 or not."""
    found: dict[bytes, bytes] = {}
    for folder, dirs, files in os.walk(os.fsencode(root)):
        dirs[:] = [d for d in dirs if os.fsdecode(d) not in SKIPPED]
        for name in files:
            path = os.path.join(folder, name)
            if os.fsdecode(name) not in SKIPPED and stat.S_ISREG(os.lstat(path).st_mode):
                with open(path, "rb") as file:
                    found[b"./" + os.path.relpath(path, os.fsencode(root))] = file.read()
    return found


def run_example(tmp_path: Path, *args: str) -> tuple[dict[str, str], Path]:
    """Run the example on a fresh SQLite file; return its summary lines by
    label and the database path."""
    db = tmp_path / "quickstart.db"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--url", f"sqlite:///{db}", *args],
        check=False,
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summary = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert len(summary) == 8, result.stdout
    return {k.strip(): v.strip() for k, v in summary.items()}, db


def check_summary(summary: dict[str, str], db: Path, expected: dict[bytes, bytes]) -> None:
    # `sha256sum --zero`: "HASH  NAME\0" per file, names unescaped, by bytes.
    manifest = b"".join(
        hashlib.sha256(data).hexdigest().encode() + b"  " + rel + b"\0"
        for rel, data in sorted(expected.items())
    )
    assert summary["files hashed"] == f"{len(expected)} of {len(expected)}"
    assert summary["bytes"] == str(sum(len(d) for d in expected.values()))
    assert summary["retries"] == "0"
    assert summary["dead letters"] == "0"
    assert summary["manifest sha256"] == hashlib.sha256(manifest).hexdigest()
    assert float(summary["jobs/s"].split()[0]) > 0

    root = os.fsencode(summary["root"])
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT path, sha256, size, lines FROM quickstart_files").fetchall()
    finally:
        conn.close()
    by_rel = {b"./" + os.path.relpath(unquote_to_bytes(path), root): row for path, *row in rows}
    assert set(by_rel) == set(expected)
    for rel, data in expected.items():
        assert by_rel[rel] == [hashlib.sha256(data).hexdigest(), len(data), data.count(b"\n")]


def check_command_agrees(summary: dict[str, str]) -> None:
    """The printed check command, run by a shell, gives the summary's digest."""
    if sys.platform != "linux" or not shutil.which("sha256sum"):
        return  # GNU coreutils' sha256sum --zero, head -z, sort -z
    result = subprocess.run(
        ["sh", "-c", summary["check it with"]], capture_output=True, check=True, timeout=300
    )
    assert result.stdout.split()[0].decode() == summary["manifest sha256"]


@pytest.mark.slow
def test_the_default_run_hashes_the_standard_library(tmp_path: Path) -> None:
    """No ``--root``: the standard library's folder, every regular file."""
    summary, db = run_example(tmp_path)
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(summary["root"]) == stdlib
    expected = expected_files(stdlib)
    assert len(expected) > 500
    check_summary(summary, db, expected)


def test_a_tree_with_awkward_files(tmp_path: Path) -> None:
    """Empty files, no final newline, non-ASCII names, symlinks (skipped),
    bytecode caches (skipped), and a second run over the same database."""
    root = tmp_path / "tree"
    (root / "deep" / "deeper").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "empty").write_bytes(b"")
    (root / "two-lines.txt").write_bytes(b"one\ntwo")
    (root / "deep" / "été — ü.txt").write_text("a\nb\nc\n", encoding="utf-8")
    (root / "deep" / "deeper" / "blob.bin").write_bytes(bytes(range(256)) * 64)
    (root / "deep-a").write_bytes(b"sorts between deep/ and deep.txt in byte order\n")
    (root / "__pycache__" / "skipped.pyc").write_bytes(b"x")
    (root / "link").symlink_to(root / "empty")
    expected = expected_files(root)
    assert b"./link" not in expected
    assert len(expected) == 5

    sandbox = tmp_path / "run"
    sandbox.mkdir()
    for _ in range(2):
        summary, db = run_example(sandbox, "--root", str(root), "--concurrency", "3")
        check_summary(summary, db, expected)
    check_command_agrees(summary)


#: File names that are legal on Linux but awkward: control characters,
#: sha256sum's escape characters, the example's own escape character, and
#: bytes that are not UTF-8 (so not a str without surrogate escapes).
AWKWARD_NAMES = (
    b"new\nline",
    b"tab\there",
    b"carriage\rreturn",
    b"back\\slash",
    b"bell\x07",
    b"percent%41%",
    b"latin1-caf\xe9",
    b"bad\xff\xfeutf8",
    b"deep/half\xc3",
)


@pytest.mark.skipif(sys.platform != "linux", reason="file names as arbitrary bytes")
def test_every_regular_file_is_hashed_whatever_its_name(tmp_path: Path) -> None:
    """Non-printable and non-UTF-8 names are hashed like any other; the
    summary counts them and its check command gives the same digest."""
    root = tmp_path / "tree"
    (root / "deep").mkdir(parents=True)
    (root / "plain.txt").write_bytes(b"plain\n")
    (root / "deep" / "site-packages").write_bytes(b"a file, pruned by find's -name too\n")
    for index, name in enumerate(AWKWARD_NAMES):
        with open(os.path.join(os.fsencode(root), name), "wb") as file:
            file.write(b"line\n" * index)
    expected = expected_files(root)
    assert len(expected) == len(AWKWARD_NAMES) + 1

    summary, db = run_example(tmp_path, "--root", str(root), "--concurrency", "3")
    check_summary(summary, db, expected)
    check_command_agrees(summary)

    summary, db = run_example(tmp_path, "--root", str(root), "--limit", "4")
    check_summary(summary, db, dict(sorted(expected.items())[:4]))
    check_command_agrees(summary)


def test_limit_takes_the_first_files_in_byte_order(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    for name in ("b", "a", "C", "a-b", "a.b"):
        (root / name).write_text(name)
    summary, db = run_example(tmp_path, "--root", str(root), "--limit", "3")
    assert "head -z -n 3" in summary["check it with"]
    everything = expected_files(root)
    first = dict(sorted(everything.items())[:3])
    assert set(first) == {b"./C", b"./a", b"./a-b"}
    check_summary(summary, db, first)
    check_command_agrees(summary)


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (("--limit", "-1"), 2, "argument --limit: must be at least 0, got -1"),
        (("--concurrency", "0"), 2, "argument --concurrency: must be at least 1, got 0"),
        (("--root", "/nonexistent/tree"), 2, "--root /nonexistent/tree: not a directory"),
        (("--url", "sqlite:///:memory:"), 1, "error: SQLite URL 'sqlite:///:memory:' is not"),
    ],
)
def test_bad_arguments_are_one_clear_line(
    tmp_path: Path, args: tuple[str, ...], status: int, message: str
) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == status
    assert message in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "quickstart.db").exists()  # nothing was written


# -- the docs' code blocks, as written ---------------------------------------

#: A fenced block: its language and its code.
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
#: A Python block that begins ``# NAME.py`` is that file's content.
FILE_BLOCK = re.compile(r"# (\w+)\.py\n")


class Block(NamedTuple):
    """One code block of a page, and what running it did (``None`` for a
    file, which is written, not run)."""

    language: str
    code: str
    result: subprocess.CompletedProcess[str] | None


def run_page(page: str, folder: Path) -> list[Block]:
    """Run the ``python`` and ``sh`` blocks of ``docs/PAGE`` in order in
    ``folder``, as a reader would: a Python block headed ``# NAME.py`` is
    saved as ``NAME.py``; any other Python block runs as a program of its
    own; a shell block runs in bash, stopping at its first failing line,
    with this interpreter's ``python`` and ``alkstore`` first on PATH. Other
    blocks (output, plain text) are left alone. Each run must succeed."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), environ["PATH"]])
    blocks = []
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    for match in FENCE.finditer(text):
        language, code = match.group(1), match.group(2)
        if language == "python" and (name := FILE_BLOCK.match(code)):
            (folder / f"{name.group(1)}.py").write_text(code, encoding="utf-8")
            blocks.append(Block(language, code, None))
            continue
        if language == "python":
            argv = [sys.executable, "-c", code]
        elif language == "sh":
            argv = ["bash", "-e", "-c", code]
        else:
            continue
        result = subprocess.run(
            argv, check=False, cwd=folder, env=environ, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"{page}:\n{code}\n{result.stdout}\n{result.stderr}"
        blocks.append(Block(language, code, result))
    return blocks


def import_has_no_side_effects(folder: Path, module: str, tmp_path: Path) -> None:
    """Importing ``module`` (a file of a page that defines an App), alone in
    an empty folder as a worker imports it, writes nothing: no database, no
    job."""
    alone = tmp_path / f"import-{module}"
    alone.mkdir()
    shutil.copy(folder / f"{module}.py", alone)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        check=False,
        cwd=alone,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")
    assert sorted(p.name for p in alone.iterdir() if p.name != "__pycache__") == [f"{module}.py"]


def run_python(folder: Path, code: str) -> str:
    """Run ``code`` in ``folder`` as a reader would after a page's blocks;
    return what it printed (it must succeed)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=folder,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def outputs(blocks: list[Block]) -> list[str]:
    return [block.result.stdout for block in blocks if block.result is not None]


def test_the_tasks_and_workers_page_runs_as_written(tmp_path: Path) -> None:
    """jobs.py defines the app; enqueue.py enqueues; a real ``alkstore worker
    --burst`` runs the ready job; the command line enqueues another. Then
    ajobs.py's async task runs in web.py's lifespan, in the caller's loop,
    and is acked before the lifespan ends."""
    folder = tmp_path / "page"
    folder.mkdir()
    blocks = run_page("tasks-and-workers.md", folder)
    assert [b.code.split("\n", 1)[0] for b in blocks if b.language == "python"] == [
        "# jobs.py",
        "# enqueue.py",
        "# unique.py",
        "# reports.py",
        "# results.py",
        "# ajobs.py",
        "# web.py",
        "import asyncio",
    ]
    import_has_no_side_effects(folder, "jobs", tmp_path)
    import_has_no_side_effects(folder, "ajobs", tmp_path)
    import_has_no_side_effects(folder, "reports", tmp_path)
    import_has_no_side_effects(folder, "unique", tmp_path)
    # "Unique jobs": one live job per key.
    unique = run_python(folder, "import runpy\nrunpy.run_path('unique.py', run_name='__main__')")
    assert unique.splitlines() == ["True", "True", "True", "False"]
    # "Results": a completed job keeps what its task returned.
    import_has_no_side_effects(folder, "results", tmp_path)
    results = run_python(folder, "import runpy\nrunpy.run_path('results.py', run_name='__main__')")
    assert results.splitlines() == ["completed {'month': '2026-11', 'rows': 1234}"]
    # "Job context": reports.py's task gets its job's context.
    report = run_python(
        folder,
        "from reports import app, build_report\n"
        "build_report.enqueue(7)\n"
        "print(app.worker(handle_signals=False).run(burst=True))",
    )
    assert report.splitlines() == [
        "report 7: job 1, attempt 1 of 5",
        "WorkerCounts(succeeded=1, retried=0, dead=0, lost=0, cancelled=0, relayed=0)",
    ]
    session, by_command, served = (b.result for b in blocks if b.result is not None)
    assert served.stdout == "fetched https://example.com/\n"
    first_id = session.stdout.splitlines()[0]
    assert session.stdout.splitlines() == [
        first_id,  # enqueue.py's job id
        "welcome (en) to grace@example.com",  # its plain call
        "welcome (fr) to ada@example.com",  # the worker ran the ready job
    ]
    assert f"job {first_id} of 'emails' (jobs.send_welcome) succeeded" in session.stderr
    command_id = int(by_command.stdout)
    assert command_id == int(first_id) + 2  # after the delayed job
    with alkstore.open(f"sqlite:///{folder / 'alkstore.db'}", migrate=False) as store:
        emails = store.queue("emails")
        assert tuple(emails.stats()) == (1, 1, 0, 0)  # the command's, and the delayed one
        job = emails.get_job(command_id)
        assert job is not None
        assert job.max_attempts == 3  # --app gave the task's queue options
        assert tuple(store.queue("pages").stats()) == (0, 0, 0, 0)  # fetched and acked


def test_the_outbox_page_runs_as_written(tmp_path: Path) -> None:
    """An order and its message committed together, relayed by relay_once;
    shop.py's relay, then a second order added through the app and relayed
    by a batch job; a third added and relayed by AsyncOutbox."""
    folder = tmp_path / "page"
    folder.mkdir()
    blocks = run_page("outbox.md", folder)
    import_has_no_side_effects(folder, "shop", tmp_path)
    import_has_no_side_effects(folder, "dedup", tmp_path)
    # "Deduplicating": dedup.py's send gets each message's id.
    relayed = run_python(
        folder,
        "from dedup import app, publish\n"
        "message_id = app.queue('outbox.deduplicated').enqueue({'order': 4})\n"
        "outbox = app.outbox('outbox.deduplicated')\n"
        "print(message_id, outbox.relay_once(publish, worker_id='dedup', takes_context=True))",
    )
    published, summary = relayed.splitlines()
    message_id = summary.split()[0]
    assert (published, summary) == (
        f"published {{'order': 4}} as message {message_id}",
        f"{message_id} 1",
    )
    assert outputs(blocks) == [
        "",  # the order and its message
        "published {'event': 'order.created', 'order': 1}\n1 delivered\n",
        "",  # the second order, through the app
        "published {'event': 'order.created', 'order': 2}\n1 delivered\n",
        "published {'event': 'order.created', 'order': 3}\n1 delivered\n",  # AsyncOutbox
    ]
    with alkstore.open(f"sqlite:///{folder / 'shop.db'}", migrate=False) as store:
        assert tuple(store.queue("outbox.orders").stats()) == (0, 0, 0, 0)
    with sqlite3.connect(folder / "shop.db") as conn:
        assert conn.execute("SELECT id, total FROM orders ORDER BY id").fetchall() == [
            (1, 99.5),
            (2, 12.0),
            (3, 5.0),
        ]
