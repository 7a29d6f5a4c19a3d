"""Enqueue paths and round trips: one statement per operation, enqueue_many
in one round trip with ids in list order, big payloads, and enqueue_tx with
savepoints (regression cases 007, 008, 010)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from alkstore import MAX_NESTING, QueueOpts
from alkstore.errors import ValidationError
from alkstore_contract_tests import ManualClock
from alkstore_postgres import PostgresStore

pytestmark = pytest.mark.postgres


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement psycopg's cursors send (``Connection.execute`` and
    ``RawCursor`` included), in order."""
    sent: list[str] = []
    original = psycopg.Cursor.execute

    def execute(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(query.decode() if isinstance(query, bytes) else str(query))
        return original(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    return sent


def test_every_operation_is_one_statement(
    store: PostgresStore, clock: ManualClock, statements: list[str]
) -> None:
    q = store.queue("jobs", QueueOpts(expires_s=600))
    sub = store.listen("jobs")  # the LISTEN runs on its own connection, not counted below
    statements.clear()

    def one(operation: Callable[[], Any]) -> Any:
        before = len(statements)
        result = operation()
        assert len(statements) - before == 1, statements[before:]
        return result

    ids = one(lambda: q.enqueue_many([{"i": i} for i in range(1000)]))
    one(lambda: q.enqueue(b"one"))
    handles = one(lambda: q.claim_batch("w", 10))
    handle = one(lambda: q.claim_one("w"))
    one(handle.heartbeat)
    one(lambda: handles[0].retry("again"))
    one(lambda: handles[1].fail("boom"))
    one(handles[2].ack)
    one(lambda: q.ack_batch([h.id for h in handles[3:]]))
    one(lambda: q.cancel(ids[-1]))
    one(lambda: q.get_job(ids[0]))
    one(q.stats)
    clock.advance(600)
    assert one(q.sweep_expired).expired > 0
    assert sub.wait(5)


def test_enqueue_many_ids_follow_the_list(store: PostgresStore) -> None:
    q = store.queue("many")
    payloads: list[Any] = [b"\x00bytes", {"a": 1}, "text", [1, 2], None, 3.5, True, b""] * 125
    ids = q.enqueue_many(payloads)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(payloads)
    jobs = [q.get_job(i) for i in ids]
    assert [j.payload for j in jobs if j is not None] == payloads
    assert len({(j.enqueued_at, j.run_at) for j in jobs if j is not None}) == 1
    more = q.enqueue_many([1, 2])
    assert min(more) > max(ids)


def test_enqueue_many_is_all_or_nothing(store: PostgresStore) -> None:
    q = store.queue("many")
    with pytest.raises(ValidationError):
        q.enqueue_many([1, 2, float("nan"), 4])
    assert q.stats() == (0, 0, 0, 0)
    assert q.enqueue_many([]) == []


def test_enqueue_prepares_again_after_discard_all(
    open_pg: Callable[..., PostgresStore],
) -> None:
    # The pool's enqueues are prepared statements (psycopg's prepare=True);
    # a connection whose prepared statements were dropped (DEALLOCATE ALL or
    # DISCARD ALL) prepares them again.
    store = open_pg(pool_min_size=1, pool_max_size=1)
    q = store.queue("again")
    ids = [q.enqueue(1), *q.enqueue_many([2, b"3"])]
    for command in ("DEALLOCATE ALL", "DISCARD ALL"):
        with store._db.connection() as conn:
            conn.execute(command)
        ids += [q.enqueue(1), *q.enqueue_many([2, b"3"])]
    assert ids == sorted(ids)
    assert [q.get_job(i).payload for i in ids] == [1, 2, b"3"] * 3  # type: ignore[union-attr]


def test_big_and_deep_payloads(store: PostgresStore) -> None:
    q = store.queue("big")
    blob = bytes(range(256)) * (16 * 2**20 // 256)  # 16 MiB
    deep: Any = "leaf"
    for _ in range(MAX_NESTING):  # the deepest accepted nesting
        deep = [deep]
    payloads = ["x" * 65_537, ["y" * 70] * 900, "z" * (5 * 2**20), blob, deep]
    ids = [q.enqueue(p) for p in payloads]
    handles = q.claim_batch("w", len(payloads))
    assert [h.id for h in handles] == ids
    for handle, payload in zip(handles, payloads, strict=True):
        assert handle.payload == payload
    assert handles[3].payload_bytes == blob
    too_deep: Any = [deep]
    with pytest.raises(ValidationError, match="nests deeper"):
        q.enqueue(too_deep)


def test_enqueue_tx_commit_rollback_and_savepoints(
    postgres_url: str, open_pg: Callable[..., PostgresStore]
) -> None:
    store, other = open_pg(), open_pg()
    q, q_other = store.queue("tx"), other.queue("tx")
    with psycopg.connect(postgres_url, autocommit=True) as app:
        app.execute("CREATE TEMP TABLE orders (id int)")
        app.execute("BEGIN")
        app.execute("INSERT INTO orders VALUES (42)")
        q.enqueue_tx(app, {"order": 42})
        app.rollback()
        assert q_other.claim_one("w") is None

        app.execute("BEGIN")
        j43 = q.enqueue_tx(app, {"order": 43})
        assert q_other.claim_one("w") is None  # not visible before commit
        app.commit()
        handle = q_other.claim_one("w")
        assert handle is not None
        assert handle.id == j43
        assert handle.ack()

        app.execute("BEGIN")
        app.execute("SAVEPOINT s")
        q.enqueue_tx(app, "J1")
        app.execute("ROLLBACK TO SAVEPOINT s")
        j2 = q.enqueue_tx(app, "J2")
        app.commit()
    assert q.stats() == (1, 0, 0, 0)
    handle = q.claim_one("w")
    assert handle is not None
    assert (handle.id, handle.payload) == (j2, "J2")


def test_error_text_is_stored_as_the_spec_says(store: PostgresStore) -> None:
    q = store.queue("err", QueueOpts(backoff_base_s=0))
    a, b = q.enqueue(1), q.enqueue(2)
    ha, hb = q.claim_one("w"), q.claim_one("w")
    assert ha is not None
    assert hb is not None
    assert ha.fail("boom\x00tail")
    assert hb.retry("\x00" + "e" * 70_000)
    dead, retried = q.get_job(a), q.get_job(b)
    assert dead is not None
    assert retried is not None
    assert dead.last_error == "boom\ufffdtail"
    assert retried.last_error == "\ufffd" + "e" * 65_535
