"""docs/contract.md §3 "Payload": one strict codec for every engine."""

from __future__ import annotations

import enum
import json
from collections import OrderedDict
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alkstore import MAX_NESTING, MAX_PAYLOAD_BYTES, ValidationError, decode_payload, encode_payload
from alkstore.logic.codec import JSON, OCTET_STREAM

utf8_text = st.text(st.characters(exclude_categories=("Cs",)))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | utf8_text,
    lambda children: st.lists(children) | st.dictionaries(utf8_text, children),
    max_leaves=30,
)


@given(json_values)
def test_strict_json_round_trips_exactly(value: Any) -> None:
    encoded = encode_payload(value)
    assert encoded.content_type == JSON
    decoded = decode_payload(encoded.data, encoded.content_type)
    assert decoded == value
    assert json.dumps(decoded, sort_keys=True) == json.dumps(value, sort_keys=True)


@given(st.binary())
def test_bytes_are_stored_verbatim(value: bytes) -> None:
    encoded = encode_payload(value)
    assert encoded == (value, OCTET_STREAM)
    assert decode_payload(encoded.data, encoded.content_type) == value


def test_json_is_compact_utf8() -> None:
    assert encode_payload({"a": [1, 2.5, None, True], "é": "名前"}).data == (
        '{"a":[1,2.5,null,true],"é":"名前"}'.encode()
    )


@pytest.mark.parametrize(
    "value", [{"s": "a\u0000b"}, {"k\u0000": 1}, "\u0000", "x" * 65_537, -(2**70)]
)
def test_nul_and_edge_values_round_trip(value: object) -> None:
    encoded = encode_payload(value)
    assert decode_payload(encoded.data, encoded.content_type) == value


class Colour(enum.IntEnum):
    RED = 1


class Text(str):
    pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"s": "\ud800"}, "surrogate"),
        ({"\udfff": 1}, "surrogate"),
        (float("nan"), "NaN"),
        ({"v": float("inf")}, "NaN or infinity"),
        ({"when": datetime(2030, 1, 1)}, "datetime"),
        ({"o": object()}, r"payload\['o'\] is of type object;"),
        ({1: "int key"}, "payload has a key of type int; JSON object keys must be str"),
        # A key too big to print (repr refuses past 4,300 digits) is named by type.
        ({"d": {10**5000: 1}}, r"payload\['d'\] has a key of type int;"),
        (Colour.RED, "Colour"),
        ([Text("x")], "Text"),
        ((1, 2), "tuple"),
        (bytearray(b"x"), "bytearray"),
        (OrderedDict(a=1), "OrderedDict"),
        ({1, 2}, "set"),
    ],
)
def test_values_outside_strict_json_are_refused(value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        encode_payload(value)


#: What the codec accepts, as each refusal says it.
JSON_VALUES = (
    "a dict, list, str, int, float, bool or None of exactly those types "
    "(subclasses and tuples are refused)"
)
BYTES_INSIDE = (
    "; bytes can be a payload only on their own, never inside JSON: encode them as "
    "text first (base64, say)"
)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"a": b"x"},
            f"payload['a'] is of type bytes; a value inside a JSON payload (task arguments "
            f"included) is {JSON_VALUES}{BYTES_INSIDE}",
        ),
        (
            [1, [bytearray(b"x")]],
            f"payload[1][0] is of type bytearray; a value inside a JSON payload (task "
            f"arguments included) is {JSON_VALUES}{BYTES_INSIDE}",
        ),
        (
            {"a": (1, 2)},
            f"payload['a'] is of type tuple; a value inside a JSON payload (task arguments "
            f"included) is {JSON_VALUES}",
        ),
        (
            bytearray(b"x"),
            f"payload is of type bytearray; a payload is exactly bytes (stored as given) or "
            f"a JSON value: {JSON_VALUES}",
        ),
        (
            (1, 2),
            f"payload is of type tuple; a payload is exactly bytes (stored as given) or a "
            f"JSON value: {JSON_VALUES}",
        ),
    ],
    ids=["bytes-in-a-dict", "bytearray-in-a-list", "tuple-in-a-dict", "bytearray", "tuple"],
)
def test_a_refusal_says_exactly_what_is_accepted_where_the_value_stands(
    value: object, message: str
) -> None:
    """Bytes are a payload on their own, never a value inside JSON: a
    nested ``bytes`` is not told that payloads may be bytes."""
    with pytest.raises(ValidationError) as caught:
        encode_payload(value)
    assert str(caught.value) == message


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_nesting_up_to_the_limit_round_trips_and_deeper_is_refused() -> None:
    deepest = nested(MAX_NESTING)
    encoded = encode_payload(deepest)
    assert decode_payload(encoded.data, encoded.content_type) == deepest
    with pytest.raises(ValidationError, match="nests deeper"):
        encode_payload(nested(MAX_NESTING + 1))
    with pytest.raises(ValidationError, match="nests deeper"):
        encode_payload(nested(1000))


def test_payload_size_limit() -> None:
    assert len(encode_payload(b"x" * MAX_PAYLOAD_BYTES).data) == MAX_PAYLOAD_BYTES
    with pytest.raises(ValidationError, match="limit"):
        encode_payload(b"x" * (MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(ValidationError, match="limit"):
        encode_payload("x" * MAX_PAYLOAD_BYTES)  # two quotes make it larger


def test_sixteen_mib_is_accepted() -> None:
    blob = bytes(range(256)) * (16 * 2**20 // 256)
    assert encode_payload(blob).data == blob


def test_unknown_content_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="content type"):
        decode_payload(b"{}", "text/plain")


def test_job_payload_is_decoded_from_its_bytes_on_first_read() -> None:
    from datetime import UTC, datetime

    from alkstore import Job
    from alkstore.engine import JOB_FIELDS, job_from_values

    at = datetime(2030, 1, 1, tzinfo=UTC)
    values = (7, "q", "pending", b'{"a":[1]}', JSON, 0, at, None, at, 0, 5, 30.0, 4, 3600)
    values += (None, None, None, None, None, None, None)
    job = job_from_values(values)
    assert job == Job(*values)
    assert "payload" not in JOB_FIELDS
    assert job.payload == {"a": [1]}
    assert job.payload is job.payload  # decoded once
    raw = job_from_values((8, "q", "dead", b"\x00\xff", OCTET_STREAM, *values[5:]))
    assert raw.payload == b"\x00\xff"


def test_ints_decode_anywhere_or_are_refused() -> None:
    from alkstore.logic.codec import MAX_INT_DIGITS

    widest = int("9" * MAX_INT_DIGITS)
    for value in (widest, -widest, [0, {"n": widest}]):
        encoded = encode_payload(value)
        assert decode_payload(encoded.data, encoded.content_type) == value
    for value in (widest + 1, -(widest + 1), {"n": [10**5000]}):
        with pytest.raises(ValidationError, match=f"more than {MAX_INT_DIGITS} digits"):
            encode_payload(value)
