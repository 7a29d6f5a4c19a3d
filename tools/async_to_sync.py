#!/usr/bin/env python3
"""Generate sync modules from their async sources.

The async ABCs (``alkstore/alkstore/contract/*_async.py``), the async
runtime modules (``alkstore/alkstore/runtime/*_async.py``: the lease, the
heartbeater, the outbox, the scheduler and the sweeper) and the PostgreSQL
engine's I/O modules (``alkstore_postgres/alkstore_postgres/_*_async.py``)
are written by hand; each sync module beside them (``queue_async.py`` ->
``queue.py``) is generated from it, as psycopg generates ``connection.py``
from ``connection_async.py``, so the two cannot drift: one copy of the
validation, resolution and backoff calls, of the runtime's loops, and of the
engine's pool, operations and listener, two faces. Where a source needs a
lock, an event, a condition, a task, a sleep, it uses the asyncio side of a
pair (``ALock``, ``AEvent``, ``ACondition``, ``aspawn``, ``asleep`` ...)
whose thread side has the same name without the ``a``, as psycopg_pool's
``_acompat`` pairs them: the generic pairs are defined once, in
``alkstore/alkstore/_acompat_async.py`` and ``_acompat.py`` (which the
runtime imports, and engines through ``alkstore.engine_async`` and
``alkstore.engine``); the runtime's ``acaller`` and the PostgreSQL engine's
own pairs (``AWaker``, ``ABusy`` ...) sit beside their users and build on
them. :data:`NAMES` has one entry per pair.

The conversion is on the concrete syntax tree (libcst), so comments,
docstrings and layout survive. It:

- turns ``async def`` into ``def``, ``async with``/``async for`` into
  ``with``/``for`` and ``await x`` into ``x``;
- renames identifiers by :data:`NAMES` (``AsyncQueue`` -> ``Queue``,
  ``__aenter__`` -> ``__enter__`` ...), also inside strings, docstrings and
  comments (whole words only, and not the few that are English words:
  :data:`CODE_ONLY`), and imports of ``*_async`` modules (and their dotted
  paths in text);
- turns the types ``Awaitable[T]`` and ``Coroutine[Any, Any, T]`` into ``T``;
- drops the body of ``if is_async():`` keeping its ``else:`` (the escape
  hatch for code that must differ); a call in such an ``else:`` that only
  the sync module runs carries ``# type: ignore[unused-coroutine]`` in the
  async source (there it is a coroutine nobody awaits), and the conversion
  drops that comment;
- writes a header saying the file is generated, from what, by what;
- then ``ruff`` sorts the imports, drops those left unused, joins the
  ``with`` statements the conversion left nested (a sync context manager
  around an ``async with``, such as ``contextlib.suppress``) and formats the
  result.

Usage::

    python tools/async_to_sync.py            # regenerate every module
    python tools/async_to_sync.py --check    # exit 1 if one differs on disk
    python tools/async_to_sync.py SRC...     # only these async sources
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent

#: The async sources converted when no file is named.
SOURCES = (
    "alkstore/alkstore/contract/handle_async.py",
    "alkstore/alkstore/contract/queue_async.py",
    "alkstore/alkstore/contract/subscription_async.py",
    "alkstore/alkstore/contract/store_async.py",
    # The runtime (docs/async.md "Tasks and workers").
    "alkstore/alkstore/runtime/lease_async.py",
    "alkstore/alkstore/runtime/heartbeat_async.py",
    "alkstore/alkstore/runtime/scheduler_async.py",
    "alkstore/alkstore/runtime/sweeper_async.py",
    "alkstore/alkstore/runtime/outbox_async.py",
    # The PostgreSQL engine (docs/async.md "How the engines do it").
    *(
        f"alkstore_postgres/alkstore_postgres/_{name}_async.py"
        for name in (
            "clock",
            "database",
            "migrate",
            "listener",
            "handle",
            "queue",
            "operations",
            "schedules",
            "workers",
            "maintenance",
            "compact",
            "vacuum",
            "subscription",
            "store",
        )
    ),
)

#: Identifier renames, applied to names, attributes, strings and comments.
NAMES = {
    "AsyncStore": "Store",
    "AsyncQueue": "Queue",
    "AsyncJobHandle": "JobHandle",
    "AsyncSubscription": "Subscription",
    "AbstractAsyncContextManager": "AbstractContextManager",
    "AsyncIterator": "Iterator",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "open_async": "open",
    "check_async_store": "check_store",
    "asynccontextmanager": "contextmanager",
    # psycopg and psycopg_pool, which pair their classes the same way.
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncRawCursor": "RawCursor",
    "AsyncCursor": "Cursor",
    # The PostgreSQL engine's classes.
    "AsyncPostgresStore": "PostgresStore",
    "AsyncDatabase": "Database",
    "AsyncConn": "Conn",
    "AsyncServerClock": "ServerClock",
    "AsyncCompactor": "Compactor",
    "AsyncListener": "Listener",
    "AsyncSample": "Sample",
    "AsyncPostgresQueue": "PostgresQueue",
    "AsyncPostgresJobHandle": "PostgresJobHandle",
    "AsyncPostgresSubscription": "PostgresSubscription",
    "open_async_store": "open_store",
    # Its modules imported as names (``from alkstore_postgres import ...``).
    "_operations_async": "_operations",
    "_schedules_async": "_schedules",
    "_workers_async": "_workers",
    "_vacuum_async": "_vacuum",
    # The runtime's async classes (alkstore/alkstore/runtime/*_async.py).
    "AsyncLease": "Lease",
    "AsyncHeartbeater": "Heartbeater",
    "AsyncOutbox": "Outbox",
    "AsyncScheduler": "Scheduler",
    "AsyncSweeper": "Sweeper",
    # The generic thread/task pairs: alkstore/alkstore/_acompat_async.py and
    # _acompat.py (re-exported by alkstore.engine_async and alkstore.engine).
    "ALock": "Lock",
    "AEvent": "Event",
    "ACondition": "Condition",
    "ASpawned": "Spawned",
    "aspawn": "spawn",
    "ajoin": "join",
    "asleep": "sleep",  # in code only (CODE_ONLY)
    "await_event": "wait_event",
    "aoff_loop": "off_loop",
    # The runtime's: alkstore/alkstore/runtime/_caller_async.py and _caller.py.
    "acaller": "caller",
    # The PostgreSQL engine's: alkstore_postgres/alkstore_postgres/_acompat.py.
    "ABusy": "Busy",
    "AWaker": "Waker",
    "AWakeLatch": "WakeLatch",
    "afrom_thread": "from_thread",
    "atake_whole": "take_whole",
    # In text: what an application's stop event is (AEvent, Event), and an
    # article.
    "an asyncio.Event": "a threading.Event",
    "an AsyncQueue": "a Queue",
    "an AsyncStore": "a Store",
}

#: Keys of :data:`NAMES` that are also English words: renamed in code (names
#: and attributes), never in strings, docstrings and comments ("while the
#: loop is asleep").
CODE_ONLY = frozenset({"asleep"})

#: The comment that marks a call only the sync module runs (see the module
#: docstring); the conversion drops it.
SYNC_ONLY_CALL = "# type: ignore[unused-coroutine]"

_WORDS = re.compile(r"\b(" + "|".join(re.escape(k) for k in NAMES if k not in CODE_ONLY) + r")\b")
#: A dotted module path to an async source, in text: ``alkstore.runtime.lease_async``.
_ASYNC_MODULE = re.compile(r"\b(alkstore(?:\.\w+)*\.\w+?)_async\b")
#: Type subscripts whose sync form is their last argument: an awaitable of
#: ``T`` is a ``T`` in sync code.
_AWAITABLES = {"Awaitable": 1, "Coroutine": 3}

HEADER = (
    "# WARNING: generated from {source} by tools/async_to_sync.py.\n"
    "# Do not edit: change {source}, then run `python tools/async_to_sync.py`.\n"
)


def rename_words(text: str) -> str:
    """Apply :data:`NAMES` (but :data:`CODE_ONLY`) to the whole words of
    ``text``, and drop the ``_async`` of dotted module paths."""
    text = _ASYNC_MODULE.sub(r"\1", text)
    return _WORDS.sub(lambda m: NAMES[m.group(1)], text)


def sync_path(source: Path) -> Path:
    """``x_async.py`` -> ``x.py``."""
    if not source.name.endswith("_async.py"):
        raise SystemExit(f"{source}: an async source's name ends in _async.py")
    return source.with_name(source.name[: -len("_async.py")] + ".py")


class AsyncToSync(cst.CSTTransformer):
    """The syntax conversion; see the module docstring."""

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        return updated_node.with_changes(asynchronous=None)

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        return updated_node.with_changes(asynchronous=None)

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        return updated_node.with_changes(asynchronous=None)

    def leave_CompFor(self, original_node: cst.CompFor, updated_node: cst.CompFor) -> cst.CompFor:
        return updated_node.with_changes(asynchronous=None)

    def leave_Await(self, original_node: cst.Await, updated_node: cst.Await) -> cst.BaseExpression:
        # ``await`` takes a primary, which binds tighter than any operator:
        # parentheses around the await, as in ``(await q.claim())[0]``, are
        # not needed around the bare primary.
        return updated_node.expression

    def leave_Subscript(
        self, original_node: cst.Subscript, updated_node: cst.Subscript
    ) -> cst.BaseExpression:
        # ``Awaitable[T]`` and ``Coroutine[Any, Any, T]`` -> ``T``.
        value = updated_node.value
        name = value.value if isinstance(value, cst.Name) else None
        arity = _AWAITABLES.get(name or "")
        if arity is None or len(updated_node.slice) != arity:
            return updated_node
        last = updated_node.slice[-1].slice
        assert isinstance(last, cst.Index)
        return last.value

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=NAMES.get(updated_node.value, updated_node.value))

    def leave_SimpleString(
        self, original_node: cst.SimpleString, updated_node: cst.SimpleString
    ) -> cst.SimpleString:
        return updated_node.with_changes(value=rename_words(updated_node.value))

    def leave_FormattedStringText(
        self, original_node: cst.FormattedStringText, updated_node: cst.FormattedStringText
    ) -> cst.FormattedStringText:
        return updated_node.with_changes(value=rename_words(updated_node.value))

    def leave_Comment(self, original_node: cst.Comment, updated_node: cst.Comment) -> cst.Comment:
        return updated_node.with_changes(value=rename_words(updated_node.value))

    def leave_TrailingWhitespace(
        self, original_node: cst.TrailingWhitespace, updated_node: cst.TrailingWhitespace
    ) -> cst.TrailingWhitespace:
        comment = updated_node.comment
        if comment is not None and comment.value == SYNC_ONLY_CALL:
            return updated_node.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None)
        return updated_node

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.ImportFrom:
        module = updated_node.module
        if module is None:
            return updated_node
        return updated_node.with_changes(module=_strip_async_module(module))

    def leave_If(
        self, original_node: cst.If, updated_node: cst.If
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        test = updated_node.test
        if not (
            isinstance(test, cst.Call)
            and isinstance(test.func, cst.Name)
            and test.func.value == "is_async"
        ):
            return updated_node
        orelse = updated_node.orelse
        if orelse is None:
            return cst.RemoveFromParent()
        if isinstance(orelse, cst.If):
            return orelse
        body = orelse.body
        assert isinstance(body, cst.IndentedBlock)
        return cst.FlattenSentinel(body.body)


def _strip_async_module(
    module: cst.Attribute | cst.Name,
) -> cst.Attribute | cst.Name:
    """``a.b.queue_async`` -> ``a.b.queue``."""
    if isinstance(module, cst.Name):
        if module.value.endswith("_async"):
            return module.with_changes(value=module.value[: -len("_async")])
        return module
    if module.attr.value.endswith("_async"):
        return module.with_changes(attr=module.attr.with_changes(value=module.attr.value[:-6]))
    return module


def convert(source_text: str, source_name: str, source_path: Path) -> str:
    """Return the formatted sync module for an async module's text
    (``source_path`` chooses ruff's settings)."""
    tree = cst.parse_module(source_text)
    tree = tree.visit(AsyncToSync())
    code = HEADER.format(source=source_name) + tree.code
    return _ruff(code, sync_path(source_path))


def _ruff(code: str, filename: Path) -> str:
    """Sort imports and format ``code`` with the repository's ruff settings."""
    ruff = str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        ruff = shutil.which("ruff") or "ruff"
    stdin_name = str(filename)
    for args in (
        ["check", "--select", "I,F401,SIM117", "--fix", "--quiet", "--exit-zero"],
        ["format", "--quiet"],
    ):
        done = subprocess.run(
            # The repository's settings, wherever the file is (a test
            # checks a copy in a temporary folder).
            [
                ruff,
                *args,
                "--config",
                str(ROOT / "pyproject.toml"),
                "--stdin-filename",
                stdin_name,
                "-",
            ],
            input=code,
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        if done.returncode != 0:
            raise SystemExit(f"ruff {args[0]} failed on {filename}:\n{done.stderr}")
        code = done.stdout
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a generated file differs from its source's conversion",
    )
    parser.add_argument("sources", nargs="*", help="async sources (default: all)")
    opts = parser.parse_args(argv)
    sources = [Path(s).resolve() for s in opts.sources] or [ROOT / s for s in SOURCES]
    stale = 0
    for source in sources:
        target = sync_path(source)
        expected = convert(source.read_text(encoding="utf-8"), source.name, source)
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current == expected:
            continue
        if opts.check:
            stale += 1
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    expected.splitlines(keepends=True),
                    str(target),
                    f"{target} (generated from {source.name})",
                )
            )
        else:
            target.write_text(expected, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
    if stale:
        print(
            f"{stale} generated file(s) differ from their async source; "
            "run `python tools/async_to_sync.py`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
