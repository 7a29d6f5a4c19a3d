"""The README's main job, ``examples/quickstart.py``, run as a user runs it,
its summary checked against hashes computed here with hashlib."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path
from urllib.parse import unquote_to_bytes

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
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
