"""Argument checks shared by every engine (docs/contract.md §3 "Validation").

Each check raises :class:`~alkstore.errors.ValidationError` with a message
that names the argument and the rule; none does I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import cast

from alkstore.errors import ValidationError
from alkstore.logic.codec import encode_result

__all__ = [
    "MAX_DURATION_S",
    "MAX_ERROR_CHARS",
    "MAX_INSTANT",
    "MIN_INSTANT",
    "RESERVED_PREFIX",
    "aware_utc",
    "duration_s",
    "error_text",
    "host_name",
    "int_in_range",
    "is_collection",
    "job_id",
    "job_ids",
    "queue_name",
    "results_for",
    "unique_key",
    "unique_keys",
    "worker_id",
]

#: The longest duration accepted anywhere: 100 years of 365.25 days, in seconds.
MAX_DURATION_S = 100 * 365.25 * 86400
#: Queue names starting with this are reserved for alkstore itself.
RESERVED_PREFIX = "__alkstore_"
#: ``last_error`` keeps at most this many characters (docs/contract.md §3 "Error text").
MAX_ERROR_CHARS = 65_536
#: The range of instants accepted (``run_at``, clock readings): wide enough
#: for any real schedule, and far enough inside ``datetime``'s own range that
#: adding a duration of up to 100 years never overflows.
MIN_INSTANT = datetime(1900, 1, 1, tzinfo=UTC)
MAX_INSTANT = datetime(9000, 1, 1, tzinfo=UTC)
MAX_QUEUE_NAME_CHARS = 128
MAX_WORKER_ID_CHARS = 255
#: The longest unique key, in characters (docs/contract.md §3 "Unique keys").
MAX_UNIQUE_KEY_CHARS = 255
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def duration_s(value: object, what: str, *, positive: bool = False) -> float:
    """Return a duration as seconds.

    Parameters
    ----------
    value
        ``int``/``float`` seconds or a :class:`datetime.timedelta`; finite,
        ``>= 0`` (``> 0`` when ``positive``) and at most 100 years (docs/contract.md §2).
    what
        The argument's name, for the error message.

    Raises
    ------
    ValidationError
        For any other value (``bool`` included).
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif _is_int(value):
        assert isinstance(value, int)
        # Compared as an int first: float() of an int past 1.8e308 overflows.
        if value < 0 or (positive and value == 0):
            bound = "> 0" if positive else ">= 0"
            raise ValidationError(f"{what} must be {bound} seconds, got {shown_int(value)}")
        if value > MAX_DURATION_S:
            raise ValidationError(f"{what} must be at most 100 years, got {shown_int(value)}")
        seconds = float(value)
    elif isinstance(value, float):
        seconds = value
    else:
        raise ValidationError(
            f"{what} must be seconds (int or float) or a timedelta, not {type(value).__name__}"
        )
    if not math.isfinite(seconds):
        raise ValidationError(f"{what} must be finite, got {value!r}")
    if seconds < 0 or (positive and seconds == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValidationError(f"{what} must be {bound} seconds, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise ValidationError(f"{what} must be at most 100 years, got {value!r}")
    return seconds


def shown_int(value: int) -> str:
    """``value`` for an error message: huge ints by their size (``str()`` of
    an int over 4,300 digits raises, and a 400-digit number helps nobody)."""
    if -(10**18) < value < 10**18:
        return str(value)
    kind = "a negative int" if value < 0 else "an int"
    return f"{kind} of about {int(abs(value).bit_length() * 0.30103) + 1} digits"


def int_in_range(value: object, what: str, low: int, high: int) -> int:
    """Return ``value`` if it is an ``int`` (not ``bool``) in ``[low, high]``.

    Raises
    ------
    ValidationError
        Otherwise.
    """
    if not _is_int(value):
        raise ValidationError(f"{what} must be an int, not {type(value).__name__}")
    assert isinstance(value, int)
    if not low <= value <= high:
        raise ValidationError(f"{what} must be in {low}..{high}, got {shown_int(value)}")
    return value


def aware_utc(value: object, what: str) -> datetime:
    """Return a timezone-aware ``datetime`` converted to UTC: a plain
    ``datetime`` in :data:`~datetime.UTC`, whatever ``datetime`` subclass or
    ``tzinfo`` came in, so nothing later calls the caller's ``tzinfo`` again.

    The ``tzinfo``'s ``utcoffset()`` is called once, here: an offset Python
    refuses (24 h or more, not a ``timedelta``), a ``tzinfo`` that raises, and
    one that gives no offset (``None``: a naive datetime in disguise) are all
    refused.

    Raises
    ------
    ValidationError
        If ``value`` is not a ``datetime``, is naive, its ``tzinfo`` gives no
        valid UTC offset, or it lies outside :data:`MIN_INSTANT` ..
        :data:`MAX_INSTANT`.
    """
    if not isinstance(value, datetime):
        raise ValidationError(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None:
        raise ValidationError(f"{what} must be timezone-aware, got the naive {_wall(value)}")
    try:
        offset = value.utcoffset()  # datetime checks the result: a timedelta within 24 h
    except Exception as exc:
        raise ValidationError(
            f"{what} must be timezone-aware with a valid UTC offset; its tzinfo "
            f"({type(value.tzinfo).__name__}) failed for {_wall(value)}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if offset is None:
        raise ValidationError(
            f"{what} must be timezone-aware; its tzinfo ({type(value.tzinfo).__name__}) "
            f"gives no UTC offset for {_wall(value)}"
        )
    if type(value) is datetime and value.tzinfo is UTC:
        utc: datetime | None = value  # the common case: nothing to convert
    else:
        # Arithmetic on the wall time never calls the tzinfo; combine() is
        # the cheap way to attach UTC (replace() costs twice astimezone()).
        try:
            shifted = (value if type(value) is datetime else _naive(value)) - offset
        except OverflowError:
            utc = None
        else:
            utc = datetime.combine(shifted.date(), shifted.time(), UTC)
    if utc is None or not MIN_INSTANT <= utc <= MAX_INSTANT:
        raise ValidationError(
            f"{what} must lie between {MIN_INSTANT:%Y-%m-%d} and {MAX_INSTANT:%Y-%m-%d} "
            f"UTC, got {_wall(value)} at UTC offset {_shown_offset(offset)}"
        )
    return utc


def _naive(value: datetime) -> datetime:
    """``value``'s wall time as a plain naive ``datetime``, without calling
    its ``tzinfo`` (nor a subclass's ``replace``)."""
    if type(value) is datetime:
        return datetime.combine(value.date(), value.time())
    return datetime(
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
    )


def _wall(value: datetime) -> str:
    """``value``'s wall time for a message (``isoformat()`` would call its
    ``tzinfo`` again)."""
    return _naive(value).isoformat()


def _shown_offset(offset: timedelta) -> str:
    """``offset`` as ISO 8601 writes it (``+05:30``, ``-00:00:01.5``)."""
    sign = "-" if offset < timedelta(0) else "+"
    hours, rest = divmod(abs(offset), timedelta(hours=1))
    minutes, rest = divmod(rest, timedelta(minutes=1))
    text = f"{sign}{hours:02d}:{minutes:02d}"
    if rest:
        text += f":{rest.seconds:02d}"
        if rest.microseconds:
            text += f".{rest.microseconds:06d}"
    return text


def queue_name(name: object, what: str = "queue name") -> str:
    """Check a queue name (docs/contract.md §3 "Validation"); schedule names follow the
    same rule (``what`` names the argument in the message).

    A name is 1 to 128 characters of ``[A-Za-z0-9_.:-]`` and does not start
    with the reserved prefix ``__alkstore_``.

    Raises
    ------
    ValidationError
        For any other name.
    """
    if not isinstance(name, str):
        raise ValidationError(f"{what} must be a str, not {type(name).__name__}")
    if not name:
        raise ValidationError(f"{what} must not be empty")
    if len(name) > MAX_QUEUE_NAME_CHARS:
        raise ValidationError(
            f"{what} must be at most {MAX_QUEUE_NAME_CHARS} characters, got {len(name)}"
        )
    if not _QUEUE_NAME.fullmatch(name):
        raise ValidationError(f"{what} {name!r} may only hold letters, digits and '_.:-'")
    if name.startswith(RESERVED_PREFIX):
        raise ValidationError(f"{what} {name!r} uses the reserved prefix {RESERVED_PREFIX!r}")
    return name


def _stored_text(value: object, what: str, max_chars: int) -> str:
    # One rule for the text an engine stores verbatim as UTF-8 and matches
    # exactly: a worker id, a unique key.
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a str, not {type(value).__name__}")
    if not 1 <= len(value) <= max_chars:
        raise ValidationError(f"{what} must be 1 to {max_chars} characters, got {len(value)}")
    if _UNSTORABLE.search(value):
        raise ValidationError(
            f"{what} {value!r} holds a NUL character or a lone surrogate; "
            "it is stored as UTF-8 text"
        )
    return value


def worker_id(value: object) -> str:
    """Check a ``worker_id``: a ``str`` of 1 to 255 characters, none of them
    NUL or a lone surrogate (it is stored verbatim as UTF-8 text, which
    neither engine can do for those).

    Raises
    ------
    ValidationError
        Otherwise.
    """
    return _stored_text(value, "worker_id", MAX_WORKER_ID_CHARS)


def host_name(value: object) -> str:
    """Check a worker's host name as the workers registry stores it: a
    ``str`` of 1 to 255 characters, as a worker id.

    Raises
    ------
    ValidationError
        Otherwise.
    """
    return _stored_text(value, "host", 255)


def unique_key(value: object, what: str = "unique_key") -> str | None:
    """Check an enqueue's ``unique_key``: ``None`` (no key), or a ``str`` of
    1 to 255 characters, none of them NUL or a lone surrogate, as
    :func:`worker_id` (docs/contract.md §3 "Unique keys").

    Raises
    ------
    ValidationError
        Otherwise.
    """
    return None if value is None else _stored_text(value, what, MAX_UNIQUE_KEY_CHARS)


def results_for(value: object, count: int) -> list[bytes | None]:
    """Check and encode ``ack_many``'s ``results``: ``None`` (no result for
    any handle), or a collection of ``count`` values, one per handle, each
    as ``ack(result)`` takes it (:func:`alkstore.logic.codec.encode_result`).

    Raises
    ------
    ValidationError
        For a ``str``, a non-collection, a length other than ``count``, or
        a value the codec refuses (the message names its index, ``results[3]``).
    """
    if value is None:
        return [None] * count
    if not is_collection(value):
        raise ValidationError(
            f"results must be a list with one result per handle, not {type(value).__name__}"
        )
    values = list(cast(Iterable[object], value))
    if len(values) != count:
        raise ValidationError(
            f"results must have one result per handle: {count} handles, {len(values)} results"
        )
    encoded = []
    for index, result in enumerate(values):
        try:
            encoded.append(encode_result(result))
        except ValidationError as error:
            raise ValidationError(f"results[{index}]: {error}") from None
    return encoded


def unique_keys(value: object, count: int) -> list[str | None] | None:
    """Check ``enqueue_many``'s ``unique_keys``: ``None``, or a collection
    of ``count`` items, one per payload, each ``None`` or a key as
    :func:`unique_key`. Returns ``None`` when no item has a key.

    Raises
    ------
    ValidationError
        For a ``str``, a non-collection, a length other than ``count``, or
        a bad item (the message starts with its index, ``unique_keys[3]:``).
    """
    if value is None:
        return None
    if not is_collection(value):
        raise ValidationError(
            "unique_keys must be a list with one key (or None) per payload, "
            f"not {type(value).__name__}"
        )
    keys = list(cast(Iterable[object], value))
    if len(keys) != count:
        raise ValidationError(
            f"unique_keys must have one key (or None) per payload: {count} payloads, "
            f"{len(keys)} keys"
        )
    checked = [unique_key(key, f"unique_keys[{i}]") for i, key in enumerate(keys)]
    return checked if any(key is not None for key in checked) else None


def job_id(value: object) -> int:
    """Check a job id: an ``int`` (not ``bool``).

    Raises
    ------
    ValidationError
        Otherwise.
    """
    if not _is_int(value):
        raise ValidationError(f"job id must be an int, not {type(value).__name__}")
    assert isinstance(value, int)
    return value


def is_collection(value: object) -> bool:
    """Whether ``value`` can be a list of items (payloads, calls): iterable,
    and not a ``str``, ``bytes`` or ``dict``, whose iteration yields
    characters, ints or keys rather than items."""
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict))


def job_ids(values: Iterable[object]) -> list[int]:
    """Check job ids and drop repeats, keeping first-seen order.

    Raises
    ------
    ValidationError
        If ``values`` is not iterable or holds a non-``int``.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValidationError("job ids must be an iterable of ints")
    items = list(values)
    for value in items:
        if type(value) is not int:
            job_id(value)  # raises unless an int subclass other than bool
    return list(dict.fromkeys(items))  # type: ignore[arg-type]


def error_text(value: object, what: str = "error") -> str:
    """Return error text as stored in ``last_error`` (docs/contract.md §3 "Error text").

    The caller's string is kept verbatim up to 65,536 characters; NUL
    characters and lone surrogates (which no engine can store as UTF-8)
    become U+FFFD.

    Raises
    ------
    ValidationError
        If ``value`` is not a ``str``.
    """
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a str, not {type(value).__name__}")
    return _UNSTORABLE.sub("\ufffd", value[:MAX_ERROR_CHARS])
