"""PostgreSQL URLs: standard libpq connection URIs (docs/contract.md §1, §2).

``postgresql://user:password@host:port/dbname?param=value`` and the
``postgres://`` spelling are handed to libpq unchanged, so every libpq
parameter (``sslmode``, ``connect_timeout``, ``options`` ...) works as
documented by PostgreSQL.
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict

from alkstore.engine import redact_url
from alkstore.errors import ValidationError

__all__ = ["SCHEMES", "parse_url"]

#: The URL schemes this engine serves (the ``alkstore.engines`` entry points).
SCHEMES = ("postgresql", "postgres")
_EXAMPLE = "postgresql://user@host:5432/dbname"


def parse_url(url: object) -> str:
    """Check a PostgreSQL URL and return the libpq connection string.

    Parameters
    ----------
    url
        A libpq connection URI whose scheme is ``postgresql`` or
        ``postgres`` (case-insensitive).

    Returns
    -------
    str
        The URL itself, which libpq accepts as a connection string.

    Raises
    ------
    ValidationError
        For a non-str, another scheme, or a URI that libpq cannot parse
        (nothing is connected yet).
    """
    if not isinstance(url, str):
        raise ValidationError(f"url must be a str, not {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ValidationError(
            f"not a PostgreSQL URL: {redact_url(url)!r}; expected e.g. {_EXAMPLE}"
        )
    # libpq accepts only the lower-case spellings.
    conninfo = scheme.lower() + url[len(scheme) :]
    try:
        conninfo_to_dict(conninfo)
    except psycopg.Error as error:
        raise ValidationError(
            f"malformed PostgreSQL URL {redact_url(url)!r}: {str(error).strip()}"
        ) from None
    return conninfo
