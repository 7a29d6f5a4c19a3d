"""Wake-ups through LISTEN/NOTIFY (docs/contract.md §3 "Wake"): the channels.

An enqueue sends ``pg_notify(channel, '')`` in its own transaction, so only
a commit wakes anyone, and the notification carries no job body (NOTIFY's
8000-byte payload limit never matters). Each store has one listener
(:mod:`alkstore_postgres._listener`, a thread; its async source
:mod:`alkstore_postgres._listener_async`, a task): a dedicated autocommit
connection that LISTENs on the channels of the store's subscriptions and
sets their latches when a notification arrives.

When the connection dies (server restart, ``pg_terminate_backend``, network
loss found by an idle-time ping) the listener reconnects by itself, LISTENs
on every channel again and then sets every latch once: wakes sent while it
was down are lost, and a spurious wake is harmless, a missing one is not.
Every statement on the connection, the ping included, runs under the
store's watchdog, so a connection that stopped answering (a proxy that
stopped forwarding looks no different) is given up after
``query_timeout_s``; the ping comes after ``ping_interval_s`` of silence,
or at once when another call of the store found its connection dead
(``Listener.check_soon``).

This module is the part both listeners share: the channel of a queue.
"""

from __future__ import annotations

import hashlib

__all__ = ["MAX_CHANNEL_BYTES", "channel_name"]

#: PostgreSQL channel names are identifiers: at most NAMEDATALEN - 1 bytes.
MAX_CHANNEL_BYTES = 63
_HASH_HEX = 16


def channel_name(schema: str, queue: str) -> str:
    """The NOTIFY channel of ``queue`` in the store schema ``schema``.

    A readable prefix (``schema.queue``, cut to fit) and a 64-bit hash of
    the full schema and queue names, at most 63 bytes: valid for every
    legal queue name (up to 128 characters), and two names sharing their
    first 63 characters (or any prefix) still get different channels.
    Stores in different schemas of one database never wake each other.

    Parameters
    ----------
    schema
        The store's schema name.
    queue
        A valid queue name.

    Returns
    -------
    str
        The channel, as given to ``pg_notify`` and (quoted) to ``LISTEN``.
    """
    digest = hashlib.blake2b(f"{schema}\x00{queue}".encode(), digest_size=_HASH_HEX // 2)
    room = MAX_CHANNEL_BYTES - _HASH_HEX - 1
    readable = f"{schema}.{queue}".encode()[:room].decode("utf-8", "ignore")
    return f"{readable}#{digest.hexdigest()}"
