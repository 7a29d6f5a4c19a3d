"""Unique-key benchmark: what ``unique_key`` adds to a one-by-one enqueue, on SQLite and PostgreSQL.

Run from the repository root after installing requirements-dev.txt::

    python bench/bench_unique.py                    # both engines, about 15 seconds on 2 cores
    python bench/bench_unique.py --engine sqlite    # or postgres, or both (default)
    python bench/bench_unique.py --jobs 3000 --rounds 5

Three ways of calling ``queue.enqueue(payload)`` one by one, each call its
own commit, on each engine:

* "no key": ``queue.enqueue(payload)``, the plain enqueue;
* "unique_key new per job": ``queue.enqueue(payload, unique_key=k)`` with a
  key no job holds (``k0``, ``k1``, ... built before the clock starts), so
  every call stores its row: the cost of the unique index and of the
  statement (SQLite: ``INSERT ... ON CONFLICT DO NOTHING`` in a ``BEGIN
  IMMEDIATE`` transaction; PostgreSQL: one ``INSERT ... ON CONFLICT DO
  NOTHING`` statement with its fallback ``SELECT``);
* "unique_key held by a live job": every call names the key of one pending
  job, enqueued before the clock starts, so nothing is stored and that
  job's id comes back (the deduplicated path).

A round is a fresh process on an empty queue (SQLite: a fresh file in a
temporary folder, WAL, alkstore's default ``synchronous=FULL``; PostgreSQL:
a fresh database on the server at ``--url``, as bench_postgres.py makes
them, its tables emptied before each round), with the store open, the held
key's job enqueued and 10 calls of each kind made before the clock starts
(the connection opened, the statements prepared). In a round the three
kinds take turns every ``--block`` calls (100), the order rotating each
turn, until each has made ``--jobs`` calls (2,000): a commit's fsync varies
a lot on a VM disk, and this way a slow spell reaches each kind alike. A
kind's rate is its calls over the summed time of its turns. ``--rounds``
rounds (3); the medians are shown, and every round's figures under the
table. After each round the ids must be as expected (distinct for the new
keys, the holder's for the held one) and the queue must hold exactly the
jobs the calls should have stored; otherwise the run stops.

Target (the unique-keys issue): "A unique-key enqueue costs at most 1.2x a
plain enqueue": the cost ratio, no-key rate over unique-key rate, <= 1.2,
for the stored and for the deduplicated path.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Row, Table
from bench_postgres import Server, add_url_option, in_child, sql

import alkstore

QUEUE = "bench"
PAYLOAD = {"task": "noop", "args": [1, 2, 3]}
HELD = "held"
WARMUP = 10
#: The three kinds take turns every this many calls.
BLOCK = 100
#: The issue's target: a unique-key enqueue costs at most this many plain ones.
TARGET = 1.2

Mode = Literal["plain", "new", "held"]
MODES: tuple[Mode, ...] = ("plain", "new", "held")
NAMES: dict[Mode, str] = {
    "plain": "no key",
    "new": "unique_key new per job",
    "held": "unique_key held by a live job",
}
WHAT: dict[Mode, str] = {"plain": "", "new": " (stored)", "held": " (nothing stored)"}


# -- one round, in a fresh process ------------------------------------------------


def enqueue_round(url: str, n: int, block: int) -> dict[Mode, float]:
    """``n`` enqueues of each mode one by one on an empty queue, after
    ``WARMUP`` of each, the modes taking turns every ``block`` calls (the
    order rotating each turn): jobs per second of each, from the summed
    time of its blocks. Checks the ids and what was stored."""
    with alkstore.open(url) as store:
        q = store.queue(QUEUE)
        holder = q.enqueue(PAYLOAD, unique_key=HELD)
        keys = [f"k{i}" for i in range(n)]
        new_ids: list[int] = []
        held_ids: list[int] = []

        def plain(start: int, stop: int) -> None:
            for _ in range(start, stop):
                q.enqueue(PAYLOAD)

        def new(start: int, stop: int) -> None:
            for key in keys[start:stop]:
                new_ids.append(q.enqueue(PAYLOAD, unique_key=key))

        def held(start: int, stop: int) -> None:
            for _ in range(start, stop):
                held_ids.append(q.enqueue(PAYLOAD, unique_key=HELD))

        calls: dict[Mode, Callable[[int, int], None]] = {"plain": plain, "new": new, "held": held}
        for i in range(WARMUP):
            q.enqueue(PAYLOAD)
            q.enqueue(PAYLOAD, unique_key=f"warm{i}")
            q.enqueue(PAYLOAD, unique_key=HELD)
        elapsed = dict.fromkeys(MODES, 0.0)
        for turn, start in enumerate(range(0, n, block)):
            stop = min(start + block, n)
            for mode in rotated(turn):
                begun = time.perf_counter()
                calls[mode](start, stop)
                elapsed[mode] += time.perf_counter() - begun
        stats = q.stats()
    if len(set(new_ids)) != n or holder in new_ids:
        raise RuntimeError(f"{n} new keys gave {len(set(new_ids))} distinct ids")
    if set(held_ids) != {holder}:
        raise RuntimeError(f"the held key gave ids other than its holder's {holder}")
    stored = stats.pending + stats.scheduled + stats.processing
    expected = 1 + 2 * WARMUP + 2 * n  # the holder; the plain and the new-key jobs
    if stored != expected or stats.dead:
        raise RuntimeError(f"{stored} jobs stored, expected {expected} ({stats})")
    return {mode: n / elapsed[mode] for mode in MODES}


def rotated(turn: int) -> tuple[Mode, ...]:
    k = turn % len(MODES)
    return MODES[k:] + MODES[:k]


# -- the rounds -----------------------------------------------------------------------


@dataclass
class Engine:
    """One engine's rounds: jobs per second of each mode, round by round."""

    name: str
    jobs: int
    runs: dict[Mode, list[float]] = field(default_factory=lambda: {m: [] for m in MODES})

    def median(self, mode: Mode) -> float:
        return statistics.median(self.runs[mode])

    def rows(self, table: Table) -> None:
        e, n = self.name, self.jobs
        for mode in MODES:
            table.add(
                Row(
                    f"{e}: enqueue {n:,} one by one, {NAMES[mode]}{WHAT[mode]}",
                    "jobs/s",
                    {"alkstore": self.median(mode)},
                )
            )
        plain = self.median("plain")
        for mode in ("new", "held"):
            cost = plain / self.median(mode)
            table.add(
                Row(
                    f"{e}: {NAMES[mode]}, cost / no key",
                    "ratio",
                    {"alkstore": cost},
                    f"<= {TARGET}",
                    "ok" if cost <= TARGET else "MISS",
                )
            )

    def notes(self) -> list[str]:
        plain = self.runs["plain"]
        lines = [
            f"{self.name}, {NAMES[m]}, each round: "
            + ", ".join(f"{v:,.0f}" for v in self.runs[m])
            + " jobs/s"
            for m in MODES
        ]
        for mode in ("new", "held"):
            ratios = [p / u for p, u in zip(plain, self.runs[mode], strict=True)]
            lines.append(
                f"{self.name}, {NAMES[mode]}, cost / no key in each round: "
                + ", ".join(f"{r:.2f}" for r in ratios)
            )
        return lines


def run_rounds(name: str, n: int, rounds: int, block: int, fresh: Callable[[int], str]) -> Engine:
    """``rounds`` rounds, each in a fresh process on the empty queue of
    ``fresh(round)`` (made before the round; not timed)."""
    engine = Engine(name, n)
    for r in range(rounds):
        got = in_child(enqueue_round, fresh(r), n, block)
        for mode in MODES:
            engine.runs[mode].append(float(got[mode]))
    return engine


def run_sqlite(workdir: Path, n: int, rounds: int, block: int) -> Engine:
    def fresh(r: int) -> str:
        url = f"sqlite:///{workdir / f'round-{r}.db'}"
        alkstore.open(url).close()  # the schema
        return url

    return run_rounds("SQLite", n, rounds, block, fresh)


def run_postgres(server: Server, n: int, rounds: int, block: int) -> Engine:
    url = server.create("unique")
    alkstore.open(url).close()  # the schema

    def fresh(r: int) -> str:
        sql(url, "TRUNCATE alkstore.jobs, alkstore.dead")
        return url

    return run_rounds("PostgreSQL", n, rounds, block, fresh)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    add_url_option(parser, "PostgreSQL: a database to administer from (CREATE DATABASE)")
    parser.add_argument("--jobs", type=int, default=2_000, help="enqueues per run (2,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, a process each (3)")
    parser.add_argument(
        "--block", type=int, default=BLOCK, help=f"calls per turn of a mode ({BLOCK})"
    )
    args = parser.parse_args()
    if min(args.jobs, args.rounds, args.block) < 1:
        parser.error("--jobs, --rounds and --block must be at least 1")
    began = time.perf_counter()
    n, rounds, block = args.jobs, args.rounds, args.block
    table = Table("", ["alkstore"])
    about = [f"{os.cpu_count()} cores", f"Python {sys.version.split()[0]}"]
    notes: list[str] = []
    engines: list[Engine] = []
    workdir = Path(tempfile.mkdtemp(prefix="alkstore-bench-unique-"))
    server: Server | None = None
    try:
        if args.engine in ("sqlite", "both"):
            about.append(f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=FULL)")
            engines.append(run_sqlite(workdir, n, rounds, block))
        if args.engine in ("postgres", "both"):
            try:
                server = Server(args.url)
            except Exception as exc:
                notes.append(f"PostgreSQL: - (cannot use the server at --url: {exc})")
        if server is not None:
            about.append(f"PostgreSQL {server.version.split()[0]} ({server.settings})")
            engines.append(run_postgres(server, n, rounds, block))
    finally:
        if server is not None:
            server.drop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    table.title = (
        f"alkstore enqueue one by one with and without unique_key, {n:,} of each kind per"
        f" round taking turns every {block}, median of {rounds} rounds; " + ", ".join(about)
    )
    for engine in engines:
        engine.rows(table)
        notes += engine.notes()
    print(table.render())
    print()
    for note in notes:
        print(textwrap.fill(note, 100, subsequent_indent="  "))
    print(f"\n(run took {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
