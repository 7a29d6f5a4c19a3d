"""Payloads and error text (docs/contract.md §3 "Payload", "Error text")."""

from __future__ import annotations

import collections
import enum
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from alkstore import Queue, ValidationError
from alkstore_contract_tests._clock import ManualClock
from alkstore_contract_tests._fixtures import ContractFixtures, claim_exactly, job

__all__ = ["ErrorTextTests", "PayloadTests"]

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"


class _Colour(enum.IntEnum):
    RED = 1


class _Name(str):
    pass


class _List(list[Any]):
    pass


#: ``(payload, exact stored bytes)``: compact UTF-8 JSON, or bytes verbatim.
ACCEPTED: list[tuple[object, bytes]] = [
    ({"a": 1}, b'{"a":1}'),
    (
        {"a": [1, 2.5, None, True, False], "b": {"c": "d"}},
        b'{"a":[1,2.5,null,true,false],"b":{"c":"d"}}',
    ),
    ([1, 2, 3], b"[1,2,3]"),
    ("text", b'"text"'),
    ("", b'""'),
    ({}, b"{}"),
    ([], b"[]"),
    (0, b"0"),
    (-17, b"-17"),
    (10**30, b"1000000000000000000000000000000"),
    (1.5, b"1.5"),
    (1.0, b"1.0"),
    (-0.0, b"-0.0"),
    (None, b"null"),
    (True, b"true"),
    (False, b"false"),
    ("é", b'"\xc3\xa9"'),
    ({"名前": "値"}, '{"名前":"値"}'.encode()),
    ("😀", '"😀"'.encode()),
    ("\u2028\ufeff", '"\u2028\ufeff"'.encode()),
    ({"s": "a\u0000b"}, b'{"s":"a\\u0000b"}'),
    ({"k\u0000": 1}, b'{"k\\u0000":1}'),
    ("\u0000", b'"\\u0000"'),
    ('quote " and \\ back', b'"quote \\" and \\\\ back"'),
    (b"\xff\xfe\x00", b"\xff\xfe\x00"),
    (b"", b""),
    (b'{"a":1}', b'{"a":1}'),
    (bytes(range(256)), bytes(range(256))),
]

#: Payloads outside strict JSON and not ``bytes``.
REFUSED: list[object] = [
    float("nan"),
    float("inf"),
    float("-inf"),
    {"v": float("inf")},
    [float("nan")],
    "\ud800",
    "a\udfffb",
    {"s": "\ud800"},
    {"\ud800": 1},
    _Colour.RED,
    {"c": _Colour.RED},
    _Name("subclass"),
    [_Name("subclass")],
    {_Name("key"): 1},
    (1, 2),
    {"t": (1, 2)},
    bytearray(b"x"),
    memoryview(b"x"),
    {1: "int key"},
    {None: 1},
    {True: 1},
    {("a",): 1},
    collections.OrderedDict(a=1),
    _List([1]),
    {1, 2},
    Decimal("1.5"),
    datetime.now(UTC),
    {"when": datetime.now(UTC)},
    object(),
    {"o": object()},
]


def _label(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__}:{text[:30]}"


class PayloadTests(ContractFixtures):
    """docs/contract.md §3 "Payload": bytes verbatim, strict compact UTF-8 JSON, exact
    round trips, the same refusals on every engine."""

    @pytest.mark.parametrize(("payload", "stored"), ACCEPTED, ids=[_label(p) for p, _ in ACCEPTED])
    def test_accepted_payload_round_trips_exactly(
        self, queue: Queue, payload: object, stored: bytes
    ) -> None:
        job_id = queue.enqueue(payload)
        content_type = OCTET_STREAM if isinstance(payload, bytes) else JSON
        for got in (job(queue, job_id), claim_exactly(queue, job_id).job):
            assert got.payload == payload
            assert type(got.payload) is type(payload)
            assert got.payload_bytes == stored
            assert type(got.payload_bytes) is bytes
            assert got.content_type == content_type

    def test_payload_types_survive_nesting(self, queue: Queue) -> None:
        payload = {"f": 1.0, "i": 1, "b": True, "n": None, "l": [0.0, 0, False]}
        got = claim_exactly(queue, queue.enqueue(payload)).payload
        assert got == payload
        assert [type(got[k]) for k in "fibn"] == [float, int, bool, type(None)]
        assert [type(v) for v in got["l"]] == [float, int, bool]

    @pytest.mark.parametrize("payload", REFUSED, ids=_label)
    def test_refused_payload_writes_nothing(self, queue: Queue, payload: object) -> None:
        with pytest.raises(ValidationError):
            queue.enqueue(payload)
        with pytest.raises(ValidationError):
            queue.enqueue_many(["fine", payload])
        assert queue.stats() == (0, 0, 0, 0)
        assert queue.claim_one("w") is None

    def test_enqueue_many_payloads_round_trip(self, queue: Queue) -> None:
        payloads = [b"\x00raw", {"a": 1}, "é", None]
        ids = queue.enqueue_many(payloads)
        handles = queue.claim_batch("w", 10)
        assert [h.id for h in handles] == ids
        assert [h.payload for h in handles] == payloads
        assert [h.content_type for h in handles] == [OCTET_STREAM, JSON, JSON, JSON]


class ErrorTextTests(ContractFixtures):
    """docs/contract.md §3 "Error text": verbatim up to 65,536 characters, NUL replaced by
    U+FFFD, the default ``"failed"``."""

    @pytest.mark.parametrize(
        ("error", "stored"),
        [
            ("boom", "boom"),
            ("", ""),
            ("ошибка 😀\nline two\ttab", "ошибка 😀\nline two\ttab"),
            ("boom\u0000tail", "boom\ufffdtail"),
            ("\u0000", "\ufffd"),
            ("x" * 65_536, "x" * 65_536),
            ("é" * 65_537, "é" * 65_536),
            (("0123456789" * 7000), ("0123456789" * 7000)[:65_536]),
        ],
        ids=["plain", "empty", "unicode", "nul", "only-nul", "at-cap", "over-cap-chars", "head"],
    )
    def test_retry_and_fail_store_error_text(
        self, queue: Queue, clock: ManualClock, error: str, stored: str
    ) -> None:
        job_id = queue.enqueue("x")
        assert claim_exactly(queue, job_id).retry(error, delay=0)
        assert job(queue, job_id).last_error == stored
        assert claim_exactly(queue, job_id).fail(error)
        dead = job(queue, job_id)
        assert (dead.state, dead.last_error) == ("dead", stored)

    def test_fail_without_error_stores_failed(self, queue: Queue) -> None:
        first, second = queue.enqueue("a"), queue.enqueue("b")
        assert claim_exactly(queue, first).fail()
        assert claim_exactly(queue, second).fail(None)
        assert [job(queue, i).last_error for i in (first, second)] == ["failed", "failed"]
