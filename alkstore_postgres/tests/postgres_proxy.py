"""A TCP proxy in front of the test server that can stop forwarding on its
connections without closing them (regression case 013).

:meth:`StallingProxy.stall` freezes every connection open at that moment:
nothing more is read from either side, nothing is sent, nothing is closed
(no FIN, no RST). Both kernels still acknowledge what arrives, so to the
client the server just never answers, as behind a proxy, NAT or load
balancer that lost its state. Connections accepted afterwards forward
normally.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

__all__ = ["StallingProxy"]


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.stalled = threading.Event()


class StallingProxy:
    """Forwards 127.0.0.1:``port`` to the server of ``url``.

    Attributes
    ----------
    port
        The port it listens on.
    stalled_request
        Set once a client sent bytes on a stalled connection: a call is now
        waiting for an answer that will never come.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._url = parts
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.stalled_request = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._closed = False
        threading.Thread(target=self._accept, name="stalling-proxy", daemon=True).start()

    def url(self) -> str:
        """The server's URL, through the proxy."""
        netloc = self._url.netloc.rpartition("@")
        userinfo = netloc[0] + netloc[1]
        return urlunsplit(self._url._replace(netloc=f"{userinfo}127.0.0.1:{self.port}"))

    def stall(self) -> None:
        """Stop forwarding on every connection open now; keep them open."""
        with self._lock:
            for pair in self._pairs:
                pair.stalled.set()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        with self._lock:
            self._closed = True
            pairs, self._pairs = self._pairs, []
        self._listener.close()
        for pair in pairs:
            pair.stalled.set()
            for sock in (pair.client, pair.server):
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> StallingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            pair = _Pair(client, server)
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair,), daemon=True).start()

    def _pump(self, pair: _Pair) -> None:
        peer = {pair.client: pair.server, pair.server: pair.client}
        try:
            while not pair.stalled.is_set():
                ready, _, _ = select.select([pair.client, pair.server], [], [], 0.05)
                if pair.stalled.is_set():
                    break
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        pair.client.close()
                        pair.server.close()
                        return
                    peer[sock].sendall(data)
            # Stalled: read nothing more, only notice that the client asks.
            while not self._closed:
                ready, _, _ = select.select([pair.client], [], [], 0.05)
                if ready:
                    self.stalled_request.set()
                    return
        except (OSError, ValueError):
            return
