"""The payload codec: one encoder for every engine (SPEC §3 "Payload").

``bytes`` are stored verbatim as ``application/octet-stream``; anything else
must be strict JSON and is stored as compact UTF-8 ``application/json``.
Strict means exactly ``dict`` (``str`` keys), ``list``, ``str``, ``int``,
finite ``float``, ``bool`` and ``None``: subclasses, tuples, ``bytearray``,
non-``str`` keys, NaN/infinity and strings holding lone surrogates are
refused, so a value that is accepted always round-trips exactly.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from alkstore.errors import ValidationError

__all__ = [
    "JSON",
    "MAX_NESTING",
    "MAX_PAYLOAD_BYTES",
    "OCTET_STREAM",
    "EncodedPayload",
    "decode_payload",
    "encode_payload",
]

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"
#: The largest stored payload, in bytes (64 MiB); larger raises at enqueue.
MAX_PAYLOAD_BYTES = 64 * 2**20
#: The deepest nesting of lists and dicts accepted; deeper raises at enqueue,
#: so a payload never fails to decode later in a worker.
MAX_NESTING = 256

_SCALARS = (str, int, float, bool, type(None))


class EncodedPayload(NamedTuple):
    """A payload as stored: the exact bytes and their content type."""

    data: bytes
    content_type: str


def _check_json(value: object) -> None:
    # Iterative walk: the checks run before json.dumps, whose own recursion
    # would otherwise fail on deep values with a RecursionError.
    stack: list[tuple[object, int, str]] = [(value, 1, "payload")]
    while stack:
        item, depth, where = stack.pop()
        kind = type(item)
        if kind is dict:
            if depth > MAX_NESTING:
                raise ValidationError(f"payload nests deeper than {MAX_NESTING} levels")
            for key, child in item.items():  # type: ignore[attr-defined]
                if type(key) is not str:
                    raise ValidationError(
                        f"{where} has a {type(key).__name__} key {key!r}; "
                        "JSON object keys must be str"
                    )
                _check_str(key, f"{where} key")
                stack.append((child, depth + 1, f"{where}[{key!r}]"))
        elif kind is list:
            if depth > MAX_NESTING:
                raise ValidationError(f"payload nests deeper than {MAX_NESTING} levels")
            for index, child in enumerate(item):  # type: ignore[arg-type]
                stack.append((child, depth + 1, f"{where}[{index}]"))
        elif kind is str:
            _check_str(item, where)  # type: ignore[arg-type]
        elif kind is float:
            if not math.isfinite(item):  # type: ignore[arg-type]
                raise ValidationError(f"{where} is {item!r}; JSON has no NaN or infinity")
        elif kind not in _SCALARS:
            raise ValidationError(
                f"{where} is a {kind.__name__}; payloads are bytes or JSON made of "
                "dict, list, str, int, float, bool and None (subclasses and "
                "tuples are refused)"
            )


def _check_str(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{where} holds a lone surrogate; it is not UTF-8") from None


def encode_payload(payload: object) -> EncodedPayload:
    """Encode a payload for storage.

    Parameters
    ----------
    payload
        ``bytes``, or a strict-JSON value (see the module docstring).

    Returns
    -------
    EncodedPayload
        The bytes to store and their content type.

    Raises
    ------
    ValidationError
        For a value outside strict JSON, nesting deeper than
        :data:`MAX_NESTING`, or an encoding larger than
        :data:`MAX_PAYLOAD_BYTES`.
    """
    if type(payload) is bytes:
        encoded = EncodedPayload(payload, OCTET_STREAM)
    else:
        _check_json(payload)
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        encoded = EncodedPayload(text.encode("utf-8"), JSON)
    if len(encoded.data) > MAX_PAYLOAD_BYTES:
        raise ValidationError(
            f"payload is {len(encoded.data)} bytes; the limit is {MAX_PAYLOAD_BYTES}"
        )
    return encoded


def decode_payload(data: bytes, content_type: str) -> Any:
    """Decode stored bytes back to the value that was enqueued.

    Raises
    ------
    ValueError
        For an unknown content type or bytes that are not the JSON alkstore
        wrote.
    """
    if content_type == OCTET_STREAM:
        return bytes(data)
    if content_type == JSON:
        return json.loads(bytes(data).decode("utf-8"))
    raise ValueError(f"unknown payload content type {content_type!r}")
