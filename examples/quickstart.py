"""The main job, end to end: hash a real directory tree through a queue.

Walks a directory tree (default: this Python's standard library), enqueues
one ``hash_file`` job per regular file, and runs a worker whose threads
compute each file's SHA-256, size and line count and upsert them into the
application's own table ``quickstart_files``, keyed by path, in the same
database as the queue (so a retried job is harmless). A progress bar runs
meanwhile; a summary follows. Run it from the repository's root::

    python examples/quickstart.py [--url URL] [--root DIR] [--concurrency N] [--limit N]

It uses the embedded SQLite file ``quickstart.db`` unless ``--url`` (or
``ALKSTORE_URL``) names another store, e.g. ``postgresql://user@host/db``
(with ``pip install -e ./alkstore_postgres``). More workers can join from
other terminals while it runs::

    cd examples && alkstore --url sqlite:///../quickstart.db worker quickstart:app -c 4

Every regular file is hashed, whatever its name: names with newlines or
other control characters, and names that are not valid UTF-8. A job's path
argument is text (a payload is strict JSON), so a path travels as
:func:`path_text`: the file name's own characters, with ``%`` written
``%25`` and each byte that is not UTF-8 written ``%XX``;
``urllib.parse.unquote_to_bytes`` gives the exact bytes back.

The summary's manifest digest is the SHA-256 of ``sha256sum --zero``'s
output for the same files, sorted by path bytes (``--zero`` ends each line
with a NUL and leaves names unescaped, so that every name is hashed as it
is); the command it prints recomputes it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shlex
import sqlite3
import stat
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import alkstore

DEFAULT_URL = "sqlite:///quickstart.db"
#: Folders not walked: bytecode caches change while Python runs, and
#: site-packages holds installed packages, not the standard library.
SKIPPED_DIRS = ("__pycache__", "site-packages", "dist-packages")
_SKIPPED_DIRS_BYTES = tuple(os.fsencode(name) for name in SKIPPED_DIRS)

app = alkstore.App(os.environ.get("ALKSTORE_URL") or DEFAULT_URL)


class Results:
    """The application's own table, in the store's database: SQLite through
    ``sqlite3`` on the same file, PostgreSQL through ``psycopg``. One
    connection per thread."""

    DDL = (
        "CREATE TABLE IF NOT EXISTS quickstart_files ("
        "path TEXT PRIMARY KEY, sha256 TEXT NOT NULL, size BIGINT NOT NULL, "
        "lines BIGINT NOT NULL)"
    )
    UPSERT = (
        "INSERT INTO quickstart_files (path, sha256, size, lines) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (path) DO UPDATE SET sha256 = excluded.sha256, "
        "size = excluded.size, lines = excluded.lines"
    )

    def __init__(self, url: str) -> None:
        scheme = url.partition("://")[0].lower()
        self._connect: Callable[[], Any]
        if scheme == "sqlite":
            path = url.removeprefix("sqlite:///").partition("?")[0]
            self._connect = lambda: sqlite3.connect(
                path, timeout=60, isolation_level=None, check_same_thread=False
            )
            self._mark = "?"
        elif scheme in ("postgresql", "postgres"):
            import psycopg

            self._connect = lambda: psycopg.connect(url, autocommit=True)
            self._mark = "%s"
        else:
            raise SystemExit(f"the example keeps its table in SQLite or PostgreSQL, not {scheme}")
        self._local = threading.local()
        self._opened: list[Any] = []

    def execute(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit) on this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            self._opened.append(conn)
        cursor = conn.execute(sql.replace("?", self._mark), params)
        return list(cursor.fetchall()) if cursor.description else []

    def close(self) -> None:
        for conn in self._opened:
            conn.close()


_results: Results | None = None
_results_lock = threading.Lock()


def results() -> Results:
    """The table of this process, on the app's database."""
    global _results  # noqa: PLW0603 - one shared handle, created on first use
    with _results_lock:
        if _results is None:
            _results = Results(app.url)
        return _results


def path_text(path: bytes) -> str:
    """``path`` as text that a JSON payload and a TEXT column hold: its
    characters as UTF-8, except ``%`` as ``%25`` and each byte that is not
    UTF-8 as ``%XX``. ``unquote_to_bytes`` reverses it exactly."""
    text = path.decode("utf-8", "surrogateescape").replace("%", "%25")
    # surrogateescape maps each undecodable byte 0xXX to the code point U+DCXX.
    return "".join(f"%{ord(ch) - 0xDC00:02X}" if "\udc80" <= ch <= "\udcff" else ch for ch in text)


@app.task(queue="hash-files", name="hash_file", max_attempts=3, backoff_base_s=1)
def hash_file(path: str) -> None:
    """Hash one file (``path`` as :func:`path_text` writes it) and upsert its
    row; retried (then dead-lettered) if the file cannot be read."""
    with open(unquote_to_bytes(path), "rb") as file:
        data = file.read()
    digest = hashlib.sha256(data).hexdigest()
    results().execute(Results.UPSERT, path, digest, len(data), data.count(b"\n"))


def walk(root: bytes) -> Iterator[bytes]:
    """The regular files under ``root`` (no symlinks, no skipped folders),
    as bytes: every name, whether or not it is valid UTF-8 or printable."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS_BYTES]
        for name in files:
            path = os.path.join(folder, name)
            # `find -name X -prune` drops a file named X too, so skip it as well.
            if name not in _SKIPPED_DIRS_BYTES and stat.S_ISREG(os.lstat(path).st_mode):
                yield path


def check_command(root: Path, limit: int | None) -> str:
    """The shell pipeline that recomputes the manifest digest."""
    prune = " -o ".join(f"-name {name}" for name in SKIPPED_DIRS)
    head = "" if limit is None else f" | head -z -n {limit}"
    return (
        f"cd {shlex.quote(str(root))} && find . \\( {prune} \\) -prune -o -type f -print0 "
        f"| LC_ALL=C sort -z{head} | xargs -0 sha256sum --zero | sha256sum"
    )


def at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description="hash a directory tree through alkstore")
    parser.add_argument("--url", default=app.url, help=f"the store (default {app.url})")
    parser.add_argument(
        "--root", type=Path, default=Path(sysconfig.get_paths()["stdlib"]), help="tree to hash"
    )
    parser.add_argument("--concurrency", type=at_least(1), default=4, help="worker threads")
    parser.add_argument(
        "--limit", type=at_least(0), default=None, help="hash at most this many files"
    )
    args = parser.parse_args()
    if not args.root.is_dir():
        parser.error(f"--root {args.root}: not a directory")
    try:
        run(args)
    except alkstore.AlkstoreError as exc:
        sys.exit(f"error: {exc}")


def run(args: argparse.Namespace) -> None:

    from tqdm import tqdm

    if isinstance(sys.stdout, io.TextIOWrapper):  # print a non-UTF-8 root as its bytes
        sys.stdout.reconfigure(errors="surrogateescape")
    root = args.root.resolve()
    root_bytes = os.fsencode(root)
    # In `LC_ALL=C sort` order (bytes), so --limit takes what `head` takes.
    files = sorted(walk(root_bytes))[: args.limit]
    app.configure(args.url)
    table = results()
    table.execute(Results.DDL)
    table.execute("DELETE FROM quickstart_files")
    queue = app.queue("hash-files")
    dead_before = queue.stats().dead

    started = time.perf_counter()
    hash_file.enqueue_many([(path_text(path),) for path in files])
    worker = app.worker(concurrency=args.concurrency, poll_interval_s=0.2)
    runner = threading.Thread(target=worker.run, name="quickstart-worker")
    runner.start()
    try:
        with tqdm(total=len(files), unit="file", disable=None) as bar:
            while True:
                stats = queue.stats()
                live = stats.pending + stats.scheduled + stats.processing
                bar.update(max(0, len(files) - live) - bar.n)
                if live == 0:
                    break
                time.sleep(0.1)
    finally:
        worker.stop()
        runner.join()
    elapsed = time.perf_counter() - started

    rows = table.execute("SELECT path, sha256, size FROM quickstart_files")
    # As `find .` names them, sorted as `LC_ALL=C sort` sorts: by bytes.
    relative = sorted(
        (b"./" + os.path.relpath(unquote_to_bytes(path), root_bytes), sha) for path, sha, _ in rows
    )
    manifest = b"".join(sha.encode() + b"  " + rel + b"\0" for rel, sha in relative)
    dead = queue.stats().dead - dead_before
    table.close()
    app.close()
    print(f"root:            {root}")
    print(f"files hashed:    {len(rows)} of {len(files)}")
    print(f"bytes:           {sum(size for *_, size in rows)}")
    print(f"jobs/s:          {len(files) / elapsed:.0f} ({elapsed:.2f} s)")
    print(f"retries:         {worker.counts.retried}")
    print(f"dead letters:    {dead}")
    print(f"manifest sha256: {hashlib.sha256(manifest).hexdigest()}")
    print(f"check it with:   {check_command(root, args.limit)}")


if __name__ == "__main__":
    main()
