"""The README's main job, ``examples/quickstart.py``, run as a user runs it,
its summary checked against hashes computed here with hashlib."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
SKIPPED = {"__pycache__", "site-packages", "dist-packages"}


def expected_files(root: Path) -> dict[str, bytes]:
    """Every regular file the example should hash, by ``./relative`` path
    (written independently of the example's own walk)."""
    found: dict[str, bytes] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED]
        for name in files:
            path = Path(folder, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                found[f"./{path.relative_to(root)}"] = path.read_bytes()
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
    return {k.strip(): v.strip() for k, v in summary.items()}, db


def check_summary(summary: dict[str, str], db: Path, expected: dict[str, bytes]) -> None:
    manifest = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in sorted(expected.items())
    )
    assert summary["files hashed"] == f"{len(expected)} of {len(expected)}"
    assert summary["bytes"] == str(sum(len(d) for d in expected.values()))
    assert summary["retries"] == "0"
    assert summary["dead letters"] == "0"
    assert summary["manifest sha256"] == hashlib.sha256(manifest.encode()).hexdigest()
    assert float(summary["jobs/s"].split()[0]) > 0

    root = Path(summary["root"])
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("SELECT path, sha256, size, lines FROM quickstart_files").fetchall()
    finally:
        conn.close()
    by_rel = {f"./{Path(path).relative_to(root)}": row for path, *row in rows}
    assert set(by_rel) == set(expected)
    for rel, data in expected.items():
        assert by_rel[rel] == [hashlib.sha256(data).hexdigest(), len(data), data.count(b"\n")]


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
    assert "./link" not in expected
    assert len(expected) == 5

    sandbox = tmp_path / "run"
    sandbox.mkdir()
    for _ in range(2):
        summary, db = run_example(sandbox, "--root", str(root), "--concurrency", "3")
        check_summary(summary, db, expected)


def test_limit_takes_the_first_files_in_byte_order(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    for name in ("b", "a", "C", "a-b", "a.b"):
        (root / name).write_text(name)
    summary, db = run_example(tmp_path, "--root", str(root), "--limit", "3")
    assert "head -z -n 3" in summary["check it with"]
    everything = expected_files(root)
    first = dict(sorted(everything.items())[:3])
    assert set(first) == {"./C", "./a", "./a-b"}
    check_summary(summary, db, first)
