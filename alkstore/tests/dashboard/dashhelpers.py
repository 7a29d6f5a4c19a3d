"""What the dashboard's tests share: the live server, the engines, the
hostile payload (imported by conftest.py and the tests)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

URL_ENV = "ALKSTORE_TEST_POSTGRES_URL"
REQUIRE_ENV = "ALKSTORE_REQUIRE_POSTGRES"
SCREENSHOTS_ENV = "ALKSTORE_SCREENSHOTS"
CHROMIUM = "/usr/bin/chromium"
WAIT_S = 30.0

#: The token of the dashboards with actions.
TOKEN = "test-token-" + "x" * 16
#: Each value would run script if a page put it in the HTML unescaped.
HOSTILE = {"x": "<script>alert(1)</script>", "y": '"><img src=x onerror=alert(2)>'}


def skip_or_fail(reason: str) -> None:
    """Skip the test, or fail it when ``ALKSTORE_REQUIRE_POSTGRES=1``."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1)")
    pytest.skip(reason)


def wait_until(predicate: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll ``predicate`` until it is truthy (and return it), failing after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


@contextlib.contextmanager
def serve(app: Any, root_path: str = "") -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on a free port of 127.0.0.1, on a
    thread; yield its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", root_path=root_path)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


def fresh_schema() -> str:
    return f"dash_{os.getpid()}_{secrets.token_hex(4)}"


def drop_schema(url: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def screenshot_path(page: str, engine: str) -> Path | None:
    """Where to write a page's screenshot: ``$ALKSTORE_SCREENSHOTS`` set."""
    folder = os.environ.get(SCREENSHOTS_ENV)
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder) / f"dashboard-{page}-{engine}.png"
