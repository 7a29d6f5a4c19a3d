"""Passwords out of URLs before they reach a message, a log line or a
``repr`` (docs/contract.md §1 URLs).

A libpq URI can carry a password in two places: its user part
(``postgresql://user:secret@host/db``) and its query string
(``?password=secret``, and ``sslpassword`` for the client key); both are
masked. Text matching, not a URL parser, so that a URL too malformed to
parse is still masked.
"""

from __future__ import annotations

import re

__all__ = ["redact_url"]

_USER_PASSWORD = re.compile(r"(://[^/@:?#]*:)[^/@?#]*@")
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with every password replaced by ``***``.

    >>> redact_url("postgresql://u:secret@h/db?sslmode=require&password=x")
    'postgresql://u:***@h/db?sslmode=require&password=***'
    """
    return _QUERY_PASSWORD.sub(r"\1***", _USER_PASSWORD.sub(r"\1***@", url))
