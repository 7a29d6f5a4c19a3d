"""The asyncio twins of the thread primitives :mod:`alkstore.engine` gives,
for the async sources of an engine whose sync modules ``tools/async_to_sync.py``
generates (docs/engine-authors.md "Native async primitives"): an async
source imports ``ALock``, ``aspawn`` ... from here, and the conversion turns
that into an import of ``Lock``, ``spawn`` ... from :mod:`alkstore.engine`.
This module is :mod:`alkstore._acompat_async`, which defines them, under
its public name; ``is_async`` is the sources' escape hatch,
``if is_async():``, whose body the sync module drops.

Imports asyncio: only async modules import this one.
"""

from __future__ import annotations

from alkstore import _acompat_async
from alkstore._acompat_async import *  # noqa: F403 (all of it, re-exported)

__all__: list[str] = []
__all__ += _acompat_async.__all__
