"""SQLite URLs in SQLAlchemy's form (docs/contract.md §2).

``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db``: the path
is everything after ``sqlite:///``, taken verbatim (no percent-decoding).
"""

from __future__ import annotations

from alkstore.errors import ValidationError

__all__ = ["SCHEME", "parse_url"]

SCHEME = "sqlite"
_PREFIX = "sqlite:///"
_EXAMPLE = "sqlite:///relative/path.db or sqlite:////absolute/path.db"


def parse_url(url: str) -> str:
    """Return the database file path of a ``sqlite:`` URL.

    Parameters
    ----------
    url
        ``sqlite:///relative/path.db`` (relative to the current directory at
        open time) or ``sqlite:////absolute/path.db``; the scheme is
        case-insensitive.

    Returns
    -------
    str
        The path exactly as written after ``sqlite:///``.

    Raises
    ------
    ValidationError
        For another scheme, a host part (``sqlite://host/...``), an empty
        path, ``:memory:`` (every store needs several connections to one
        database, docs/contract.md §2) or a query string (this engine takes its options
        as keyword arguments, not URL parameters).
    """
    if not isinstance(url, str):
        raise ValidationError(f"url must be a str, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != SCHEME:
        raise ValidationError(f"not a SQLite URL: {url!r}; expected {_EXAMPLE}")
    if not rest.startswith("/"):
        raise ValidationError(f"SQLite URL {url!r} has a host part or no path; expected {_EXAMPLE}")
    path = url[len(_PREFIX) :]
    if "?" in path:
        raise ValidationError(
            f"SQLite URL {url!r} has a query string; this engine takes no URL "
            "parameters: pass engine options as keyword arguments to alkstore.open"
        )
    if not path or path.endswith("/"):
        raise ValidationError(f"SQLite URL {url!r} names no database file; expected {_EXAMPLE}")
    if path == ":memory:" or path.startswith("file:"):
        raise ValidationError(
            f"SQLite URL {url!r} is not a plain database file: in-memory and URI "
            "databases are refused because a store opens several connections "
            "that must share one database; use a file path"
        )
    return path
