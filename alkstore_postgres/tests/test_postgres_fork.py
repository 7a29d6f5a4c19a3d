"""A store opened before fork(): what the child does with the parent's
connections (D15). The contract suite's fork tests check the behaviour;
these check the sessions."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from alkstore_postgres import PostgresStore

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() is POSIX only"),
    pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning"),
]


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_forked_child_drops_the_parents_sessions_and_connects_only_when_used(
    open_pg: Callable[..., PostgresStore],
) -> None:
    store = open_pg(pool_min_size=2)
    q = store.queue("jobs")
    q.enqueue(1)
    handle = q.claim_one("w")
    assert handle is not None
    assert handle.ack()
    store.listen("jobs")
    listener = store._listener._conn
    assert listener is not None
    sockets = [conn.pgconn.socket for conn in store._db._connections]
    sockets.append(listener.pgconn.socket)
    assert len(sockets) >= 2
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's lines are not traced
        code = 1
        try:
            # The parent's sockets are closed here (its sessions are its
            # own again), and no connection is made before the first use.
            dropped = all(_closed(fd) for fd in sockets)
            idle = store._db._pool.closed  # not opened yet
            q.enqueue(2)
            code = 0 if dropped and idle and store._db._connections else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert all(not conn.closed for conn in store._db._connections)
    assert q.stats().pending == 1
