"""tools/async_to_sync.py: the sync contract modules are generated from the
async ones, and ``--check`` catches a generated file edited by hand."""

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


@pytest.mark.parametrize("name", GENERATED)
def test_check_fails_on_a_hand_edited_generated_file(tmp_path: Path, name: str) -> None:
    source = tmp_path / f"{name}_async.py"
    shutil.copy(CONTRACT / f"{name}_async.py", source)
    shutil.copy(CONTRACT / f"{name}.py", tmp_path / f"{name}.py")
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
