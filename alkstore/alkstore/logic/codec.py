"""The payload codec: one encoder for every engine (docs/contract.md §3 "Payload").

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
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from alkstore.errors import ValidationError

__all__ = [
    "JSON",
    "MAX_INT_DIGITS",
    "MAX_NESTING",
    "MAX_PAYLOAD_BYTES",
    "OCTET_STREAM",
    "EncodedPayload",
    "decode_payload",
    "decode_result",
    "encode_payload",
    "encode_payloads",
    "encode_result",
]

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"
#: The largest stored payload, in bytes (64 MiB); larger raises at enqueue.
MAX_PAYLOAD_BYTES = 64 * 2**20
#: The deepest nesting of lists and dicts accepted; deeper raises at enqueue,
#: so a payload never fails to decode later in a worker.
MAX_NESTING = 256
#: The most decimal digits of a JSON int: Python's default limit for reading
#: ints from text (``sys.int_info.default_max_str_digits``), so a payload
#: decodes in any process, whatever limit the producer set.
MAX_INT_DIGITS = 4300
_INT_LIMIT = 10**MAX_INT_DIGITS

_SCALARS = (str, int, float, bool, type(None))
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _make_dump() -> Callable[[object], str]:
    # JSONEncoder.encode builds a new C encoder on every call; building it
    # once halves the cost of a small payload. The C accelerator is CPython's
    # (json.encoder.c_make_encoder); without it the public encoder is used.
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    chunks = make(
        None,  # no circular-reference markers: _is_strict bounds the depth first
        _ENCODER.default,
        json.encoder.encode_basestring,
        None,
        ":",
        ",",
        False,
        False,
        False,
    )
    return lambda value: "".join(chunks(value, 0))


_dump = _make_dump()
_DECODER = json.JSONDecoder()


class EncodedPayload(NamedTuple):
    """A payload as stored: the exact bytes and their content type."""

    data: bytes
    content_type: str


def _is_strict(value: object, depth: int) -> bool:
    # The fast check on the enqueue path: exact types, str keys and depth.
    # NaN, infinity and lone surrogates are caught by json.dumps and the
    # UTF-8 encode that follow; the slow walk below then names the fault.
    kind = type(value)
    if kind is int:
        return -_INT_LIMIT < value < _INT_LIMIT  # type: ignore[no-any-return]
    if kind is str or kind is float or kind is bool or value is None:
        return True
    if depth > MAX_NESTING:
        return False
    if kind is list:  # a loop, not all(...): a generator costs a call per item
        for child in value:  # type: ignore[attr-defined]  # noqa: SIM110
            if not _is_strict(child, depth + 1):
                return False
        return True
    if kind is dict:
        for key, child in value.items():  # type: ignore[attr-defined]
            if type(key) is not str or not _is_strict(child, depth + 1):
                return False
        return True
    return False


def _refuse(value: object, root: str = "payload") -> ValidationError:
    # Walk iteratively (deep values would overflow the stack) to name the
    # first fault; only runs for a value that is being refused. ``root``
    # names it: a payload, or a completed job's result.
    stack: list[tuple[object, int, str]] = [(value, 1, root)]
    while stack:
        item, depth, where = stack.pop()
        kind = type(item)
        if kind is dict or kind is list:
            if depth > MAX_NESTING:
                return ValidationError(f"{root} nests deeper than {MAX_NESTING} levels")
            if kind is list:
                for index, child in enumerate(item):  # type: ignore[var-annotated,arg-type]
                    stack.append((child, depth + 1, f"{where}[{index}]"))
                continue
            for key, child in item.items():  # type: ignore[attr-defined]
                if type(key) is not str:
                    return ValidationError(
                        f"{where} has a key of type {type(key).__name__}; "
                        "JSON object keys must be str"
                    )
                if not _utf8(key):
                    return ValidationError(f"{where} key holds a lone surrogate; it is not UTF-8")
                stack.append((child, depth + 1, f"{where}[{key!r}]"))
        elif kind is str:
            if not _utf8(item):  # type: ignore[arg-type]
                return ValidationError(f"{where} holds a lone surrogate; it is not UTF-8")
        elif kind is float:
            if not math.isfinite(item):  # type: ignore[arg-type]
                return ValidationError(f"{where} is {item!r}; JSON has no NaN or infinity")
        elif isinstance(item, int) and kind is int:
            if not -_INT_LIMIT < item < _INT_LIMIT:
                return ValidationError(
                    f"{where} is an int of more than {MAX_INT_DIGITS} digits; Python "
                    "refuses to read such numbers from JSON by default"
                )
        elif kind not in _SCALARS:
            return _wrong_type(where, kind, root)
    return ValidationError(f"{root} is not strict JSON")


def _wrong_type(where: str, kind: type, root: str) -> ValidationError:
    # Says exactly what is accepted where the value stands: bytes are a
    # payload on their own, never a value inside JSON (task arguments are
    # inside JSON); a result is JSON only.
    if where == "payload":
        return ValidationError(
            f"payload is of type {kind.__name__}; a payload is exactly bytes (stored as "
            f"given) or a JSON value: {_JSON_VALUES}"
        )
    if root == "result":
        tuple_advice = " (return a list, not a tuple)" if issubclass(kind, tuple) else ""
        return ValidationError(
            f"{where} is of type {kind.__name__}; a result is a JSON value: "
            f"{_JSON_VALUES}{tuple_advice}"
        )
    advice = (
        "; bytes can be a payload only on their own, never inside JSON: encode them as "
        "text first (base64, say)"
        if issubclass(kind, (bytes, bytearray, memoryview))
        else ""
    )
    return ValidationError(
        f"{where} is of type {kind.__name__}; a value inside a JSON payload (task "
        f"arguments included) is {_JSON_VALUES}{advice}"
    )


_JSON_VALUES = (
    "a dict, list, str, int, float, bool or None of exactly those types "
    "(subclasses and tuples are refused)"
)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
        encoded = EncodedPayload(_encode_json(payload, "payload"), JSON)
    if len(encoded.data) > MAX_PAYLOAD_BYTES:
        raise ValidationError(
            f"payload is {len(encoded.data)} bytes; the limit is {MAX_PAYLOAD_BYTES}"
        )
    return encoded


def encode_payloads(payloads: Iterable[object]) -> list[EncodedPayload]:
    """:func:`encode_payload` for each of a batch's ``payloads``, in order.

    Raises
    ------
    ValidationError
        For the first payload refused, its message prefixed with its index
        (``payloads[3]: ...``).
    """
    encoded = []
    for index, payload in enumerate(payloads):
        try:
            encoded.append(encode_payload(payload))
        except ValidationError as error:
            raise ValidationError(f"payloads[{index}]: {error}") from None
    return encoded


def encode_result(result: object) -> bytes | None:
    """Encode a completed job's result (docs/contract.md §3 "Completed jobs"):
    ``None`` stores nothing; anything else must be strict JSON, as a
    payload (``bytes`` are refused: a result is read back as JSON).

    Raises
    ------
    ValidationError
        For a value outside strict JSON (``bytes`` included), nesting deeper
        than :data:`MAX_NESTING`, or an encoding larger than
        :data:`MAX_PAYLOAD_BYTES`; the message names ``result``.
    """
    if result is None:
        return None
    data = _encode_json(result, "result")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise ValidationError(f"result is {len(data)} bytes; the limit is {MAX_PAYLOAD_BYTES}")
    return data


def _encode_json(value: object, root: str) -> bytes:
    """``value`` as compact UTF-8 strict JSON; ``ValidationError`` naming
    the first fault, with ``root`` the name of the whole value."""
    if not _is_strict(value, 1):
        raise _refuse(value, root)
    try:
        return _dump(value).encode("utf-8")
    except (ValueError, UnicodeEncodeError):  # NaN, infinity, lone surrogates
        raise _refuse(value, root) from None


def decode_result(data: bytes | None) -> Any:
    """The value :func:`encode_result` stored (``None`` for none)."""
    return None if data is None else decode_payload(data, JSON)


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
        return _DECODER.decode(bytes(data).decode("utf-8"))
    raise ValueError(f"unknown payload content type {content_type!r}")
