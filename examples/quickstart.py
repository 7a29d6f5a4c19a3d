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

The summary's manifest digest is the SHA-256 of ``sha256sum``'s output for
the same files, sorted by path; the command it prints recomputes it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import sqlite3
import stat
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import alkstore

DEFAULT_URL = "sqlite:///quickstart.db"
#: Folders not walked: bytecode caches change while Python runs, and
#: site-packages holds installed packages, not the standard library.
SKIPPED_DIRS = ("__pycache__", "site-packages", "dist-packages")

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


@app.task(queue="hash-files", name="hash_file", max_attempts=3, backoff_base_s=1)
def hash_file(path: str) -> None:
    """Hash one file and upsert its row; retried (then dead-lettered) if the
    file cannot be read."""
    data = Path(path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    results().execute(Results.UPSERT, path, digest, len(data), data.count(b"\n"))


def walk(root: Path) -> Iterator[Path]:
    """The regular files under ``root`` (no symlinks, no skipped folders)."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        for name in files:
            path = Path(folder, name)
            if stat.S_ISREG(path.lstat().st_mode) and str(path).isprintable():
                yield path


def check_command(root: Path, limit: int | None) -> str:
    """The shell pipeline that recomputes the manifest digest."""
    prune = " -o ".join(f"-name {name}" for name in SKIPPED_DIRS)
    head = "" if limit is None else f" | head -z -n {limit}"
    return (
        f"cd {shlex.quote(str(root))} && find . \\( {prune} \\) -prune -o -type f -print0 "
        f"| LC_ALL=C sort -z{head} | xargs -0 sha256sum | sha256sum"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="hash a directory tree through alkstore")
    parser.add_argument("--url", default=app.url, help=f"the store (default {app.url})")
    parser.add_argument(
        "--root", type=Path, default=Path(sysconfig.get_paths()["stdlib"]), help="tree to hash"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="worker threads")
    parser.add_argument("--limit", type=int, default=None, help="hash at most this many files")
    args = parser.parse_args()

    from tqdm import tqdm

    root = args.root.resolve()
    # In `LC_ALL=C sort` order (code points), so --limit takes what `head` takes.
    files = sorted(walk(root), key=str)[: args.limit]
    app.configure(args.url)
    table = results()
    table.execute(Results.DDL)
    table.execute("DELETE FROM quickstart_files")
    queue = app.queue("hash-files")
    dead_before = queue.stats().dead

    started = time.perf_counter()
    hash_file.enqueue_many([(str(path),) for path in files])
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
    # Sorted as `LC_ALL=C sort` sorts: code point order is UTF-8 byte order.
    lines = sorted(f"./{Path(path).relative_to(root)}\0{sha}" for path, sha, _ in rows)
    manifest = "".join(f"{sha}  {rel}\n" for rel, sha in (line.split("\0") for line in lines))
    dead = queue.stats().dead - dead_before
    table.close()
    app.close()
    print(f"root:            {root}")
    print(f"files hashed:    {len(rows)} of {len(files)}")
    print(f"bytes:           {sum(size for *_, size in rows)}")
    print(f"jobs/s:          {len(files) / elapsed:.0f} ({elapsed:.2f} s)")
    print(f"retries:         {worker.counts.retried}")
    print(f"dead letters:    {dead}")
    print(f"manifest sha256: {hashlib.sha256(manifest.encode()).hexdigest()}")
    print(f"check it with:   {check_command(root, args.limit)}")


if __name__ == "__main__":
    main()
