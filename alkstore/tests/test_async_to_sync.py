"""tools/async_to_sync.py: the sync contract modules and the PostgreSQL
engine's sync I/O modules are generated from the async ones, and
``--check`` catches a generated file edited by hand."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_async import ROOT, TOOL

CONTRACT = ROOT / "alkstore/alkstore/contract"
GENERATED = ["handle", "queue", "subscription", "store"]
ENGINE = ROOT / "alkstore_postgres/alkstore_postgres"
#: Every async source of the PostgreSQL engine (``_queue_async.py`` ...),
#: by the name of the module generated from it (``_queue``).
ENGINE_GENERATED = sorted(p.name[: -len("_async.py")] for p in ENGINE.glob("_*_async.py"))


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
    for name in GENERATED:
        text = (CONTRACT / f"{name}.py").read_text()
        assert text.startswith(
            f"# WARNING: generated from {name}_async.py by tools/async_to_sync.py"
        )


@pytest.mark.parametrize(
    ("folder", "name"),
    [(CONTRACT, name) for name in GENERATED] + [(ENGINE, name) for name in ENGINE_GENERATED],
    ids=[*GENERATED, *ENGINE_GENERATED],
)
def test_check_fails_on_a_hand_edited_generated_file(
    tmp_path: Path, folder: Path, name: str
) -> None:
    source = tmp_path / f"{name}_async.py"
    shutil.copy(folder / f"{name}_async.py", source)
    shutil.copy(folder / f"{name}.py", tmp_path / f"{name}.py")
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


def test_every_async_source_of_the_engine_is_converted() -> None:
    assert len(ENGINE_GENERATED) >= 13, ENGINE_GENERATED
    sources = {(ROOT / source).resolve() for source in TOOL.SOURCES}
    for name in ENGINE_GENERATED:
        assert (ENGINE / f"{name}_async.py").resolve() in sources, name
        text = (ENGINE / f"{name}.py").read_text()
        assert text.startswith(
            f"# WARNING: generated from {name}_async.py by tools/async_to_sync.py"
        ), name


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

        from alkstore_postgres import _operations_async
        from alkstore_postgres._acompat import ALock, aspawn, is_async


        class AsyncPostgresStore:
            def __init__(self, connect: Callable[[], Awaitable[int]]) -> None:
                self._lock = ALock()
                self._pool: AsyncConnectionPool | None = None
                if is_async():
                    self._later = True
                else:
                    self._open()  # type: ignore[unused-coroutine]

            async def _open(self) -> None:
                with contextlib.suppress(psycopg.Error):
                    async with self._lock:
                        await _operations_async.queue_names(self)
                aspawn(self._open)
        """
    )
    path = tmp_path / "thing_async.py"
    out = TOOL.convert(source, path.name, path)
    assert "from psycopg_pool import ConnectionPool\n" in out
    assert "from alkstore_postgres import _operations\n" in out
    assert "from alkstore_postgres._acompat import Lock, spawn\n" in out
    assert "class PostgresStore:" in out
    assert "def __init__(self, connect: Callable[[], int]) -> None:" in out
    assert "        self._open()\n" in out
    assert "type: ignore" not in out
    assert "self._later" not in out
    assert "with contextlib.suppress(psycopg.Error), self._lock:" in out
    assert "_operations.queue_names(self)" in out
    assert "spawn(self._open)" in out


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
