"""tools/async_to_sync.py: the sync contract modules and the PostgreSQL
engine's sync I/O modules are generated from the async ones, and
``--check`` catches a generated file edited by hand."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_async import ROOT, TOOL

CONTRACT = ROOT / "alkstore/alkstore/contract"
RUNTIME = ROOT / "alkstore/alkstore/runtime"
ENGINE = ROOT / "alkstore_postgres/alkstore_postgres"
#: Every generated module, by its path without the ``.py``: the contract's,
#: the runtime's and the PostgreSQL engine's (``_queue_async.py`` ...).
GENERATED = [
    *(CONTRACT / name for name in ("handle", "queue", "subscription", "store")),
    *(RUNTIME / name for name in ("lease", "heartbeat", "scheduler", "sweeper", "outbox")),
    *sorted(ENGINE / p.name[: -len("_async.py")] for p in ENGINE.glob("_*_async.py")),
]


def check(*sources: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools/async_to_sync.py"), "--check", *map(str, sources)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_committed_sync_modules_are_generated_from_their_sources() -> None:
    done = check()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""
    for module in GENERATED:
        text = module.with_suffix(".py").read_text()
        assert text.startswith(
            f"# WARNING: generated from {module.name}_async.py by tools/async_to_sync.py"
        )


@pytest.mark.parametrize("module", GENERATED, ids=lambda module: module.name)
def test_check_fails_on_a_hand_edited_generated_file(tmp_path: Path, module: Path) -> None:
    name = module.name
    source = tmp_path / f"{name}_async.py"
    shutil.copy(module.with_name(f"{name}_async.py"), source)
    shutil.copy(module.with_suffix(".py"), tmp_path / f"{name}.py")
    assert check(source).returncode == 0
    generated = tmp_path / f"{name}.py"
    text = generated.read_text()
    generated.write_text(text.replace('"""', '"""Edited. ', 1))
    done = check(source)
    assert done.returncode == 1
    assert "-" + '"""Edited. ' in done.stdout
    assert "differ from their async source" in done.stderr
    # Regenerating restores the committed text exactly.
    subprocess.run([sys.executable, str(ROOT / "tools/async_to_sync.py"), str(source)], check=True)
    assert generated.read_text() == text


def test_every_async_source_is_converted() -> None:
    """Each ``*_async.py`` of the contract, the runtime and the engine is a
    source the tool converts, and its sync module says it is generated."""
    engine = [module for module in GENERATED if module.parent == ENGINE]
    assert len(engine) >= 13, engine
    sources = {(ROOT / source).resolve() for source in TOOL.SOURCES}
    found = {
        (folder / path.name[: -len("_async.py")])
        for folder in (CONTRACT, RUNTIME, ENGINE)
        for path in folder.glob("*_async.py")
        if path.name != "_caller_async.py"  # acaller's module, paired with _caller.py by hand
    }
    assert found == set(GENERATED)
    for module in GENERATED:
        assert module.with_name(f"{module.name}_async.py").resolve() in sources, module
        text = module.with_suffix(".py").read_text()
        assert text.startswith(
            f"# WARNING: generated from {module.name}_async.py by tools/async_to_sync.py"
        ), module


def test_every_name_is_used_by_a_source() -> None:
    """No entry of the renaming table is dead: each one's async name occurs
    in a source the tool converts (a dead entry would still rename the word
    wherever it next appeared, even in prose)."""
    texts = [(ROOT / source).read_text() for source in TOOL.SOURCES]
    unused = [
        name
        for name in TOOL.NAMES
        if not any(re.search(rf"\b{re.escape(name)}\b", text) for text in texts)
    ]
    assert unused == []


def test_engine_conversion_rules(tmp_path: Path) -> None:
    """The rules the engine's sources use beyond the contract's: psycopg's
    and the compat module's pairs, ``Awaitable[T]``, a sync-only call's
    comment, module names, and nested ``with`` statements joined."""
    source = textwrap.dedent(
        """\
        from __future__ import annotations

        import contextlib
        from collections.abc import Awaitable, Callable

        import psycopg
        from psycopg_pool import AsyncConnectionPool

        from alkstore.engine_async import ALock, aspawn, is_async
        from alkstore_postgres import _operations_async
        from alkstore_postgres._acompat import AWaker


        class AsyncPostgresStore:
            def __init__(self, connect: Callable[[], Awaitable[int]]) -> None:
                self._lock = ALock()
                self._waker = AWaker()
                self._pool: AsyncConnectionPool | None = None
                if is_async():
                    self._later = True
                else:
                    self._open()  # type: ignore[unused-coroutine]

            async def _open(self) -> None:
                with contextlib.suppress(psycopg.Error):
                    async with self._lock:
                        await _operations_async.queue_names(self)
                aspawn(self._open, name="opener")
        """
    )
    path = tmp_path / "thing_async.py"
    out = TOOL.convert(source, path.name, path)
    assert "from psycopg_pool import ConnectionPool\n" in out
    assert "from alkstore_postgres import _operations\n" in out
    assert "from alkstore.engine import Lock, spawn\n" in out
    assert "from alkstore_postgres._acompat import Waker\n" in out
    assert "is_async" not in out
    assert "class PostgresStore:" in out
    assert "def __init__(self, connect: Callable[[], int]) -> None:" in out
    assert "        self._open()\n" in out
    assert "type: ignore" not in out
    assert "self._later" not in out
    assert "with contextlib.suppress(psycopg.Error), self._lock:" in out
    assert "_operations.queue_names(self)" in out
    assert '        spawn(self._open, name="opener")\n' in out


def test_conversion_rules(tmp_path: Path) -> None:
    source = textwrap.dedent(
        '''\
        """Uses :class:`AsyncQueue`."""

        from __future__ import annotations

        from contextlib import AbstractAsyncContextManager

        from alkstore.contract.queue_async import AsyncQueue

        __all__ = ["AsyncThing"]


        def is_async() -> bool:
            return True


        class AsyncThing:
            # An AsyncQueue's helper; AsyncQueueish stays.
            async def first(self, queue: AsyncQueue) -> int:
                return (await queue.stats())[0]

            async def __aenter__(self) -> AsyncThing:
                async with self.turn() as granted:
                    pass
                async for x in self.items():
                    pass
                return [y async for y in self.items()] and self

            def turn(self) -> AbstractAsyncContextManager[bool]:
                if is_async():
                    raise RuntimeError(f"only in an {AsyncQueue.__name__}")
                else:
                    return self.other()
        '''
    ).replace("AsyncThing", "AsyncStore")
    path = tmp_path / "thing_async.py"
    out = TOOL.convert(source, path.name, path)
    assert out.startswith("# WARNING: generated from thing_async.py by tools/async_to_sync.py.\n")
    assert '"""Uses :class:`Queue`."""' in out
    assert "from contextlib import AbstractContextManager\n" in out
    assert "from alkstore.contract.queue import Queue\n" in out
    assert '__all__ = ["Store"]' in out
    assert "# An Queue's helper; AsyncQueueish stays." in out
    assert "def first(self, queue: Queue) -> int:\n        return queue.stats()[0]" in out
    assert "def __enter__(self) -> Store:" in out
    assert "with self.turn() as granted:" in out
    assert "for x in self.items():" in out
    assert "[y for y in self.items()]" in out
    assert "raise RuntimeError" not in out
    assert "return self.other()" in out
    body = out.split("\n", 2)[2]  # after the header
    assert "async" not in body.replace("AsyncQueueish", "").replace("is_async", "")
    assert "await" not in body


def test_runtime_conversion_rules(tmp_path: Path) -> None:
    """The paired primitives take their thread names, an awaitable of ``T``
    is a ``T``, and dotted paths to async modules in text lose ``_async``."""
    source = textwrap.dedent(
        '''\
        """Uses :class:`~alkstore.runtime.lease_async.AsyncLease` with an asyncio.Event."""

        from __future__ import annotations

        from collections.abc import Awaitable, Callable, Coroutine
        from typing import Any

        from alkstore._acompat_async import ACondition, AEvent, asleep, await_event


        async def wait(stop: AEvent, write: Callable[[], Awaitable[int]]) -> int:
            """Stop must be an asyncio.Event, not a bool."""
            # Then asleep, not await_event's sleep.
            await asleep(0.1)
            if await await_event(stop, 1.0):
                return await write()
            return 0


        def typed(coro: Coroutine[Any, Any, str]) -> None:
            pass


        async def timed(cond: ACondition) -> bool:
            return await cond.wait_for(lambda: True, 1.0)
        '''
    )
    path = tmp_path / "thing_async.py"
    out = TOOL.convert(source, path.name, path)
    assert '"""Uses :class:`~alkstore.runtime.lease.Lease` with a threading.Event."""' in out
    assert "from alkstore._acompat import Condition, Event, sleep, wait_event\n" in out
    assert "def wait(stop: Event, write: Callable[[], int]) -> int:" in out
    assert '"""Stop must be a threading.Event, not a bool."""' in out
    # asleep is renamed in code only: it is an English word too.
    assert "    # Then asleep, not wait_event's sleep.\n    sleep(0.1)\n" in out
    assert "    if wait_event(stop, 1.0):\n        return write()" in out
    # A condition's timed wait is spelled as threading's on both sides.
    assert "def timed(cond: Condition) -> bool:\n    return cond.wait_for(lambda: True, 1.0)" in out
    assert "def typed(coro: str) -> None:" in out
