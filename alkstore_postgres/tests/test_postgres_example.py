"""examples/async_shop.py, run as its users run it: uvicorn serving the
FastAPI app on a real port, its worker in the server's event loop, orders
placed over HTTP. An order and its job commit together or not at all, the
async task does its I/O and ships every order, and SIGTERM stops the
server and its worker gracefully."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from postgres_server import drop_schema, fresh_schema_name

import alkstore

pytestmark = pytest.mark.postgres

pytest.importorskip("fastapi", reason="the example needs alkstore[examples]")
pytest.importorskip("uvicorn", reason="the example needs alkstore[examples]")

ROOT = Path(__file__).resolve().parents[2]
#: How long the test waits for anything (a bound, not a sleep).
WAIT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Shop:
    """The example's server, and HTTP calls to it."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{port}"

    def call(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=WAIT_S) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def output(self) -> str:
        self.process.kill()
        out, _ = self.process.communicate(timeout=WAIT_S)
        return out


@pytest.fixture
def shop(postgres_url: str) -> Iterator[tuple[Shop, str]]:
    schema = fresh_schema_name("shop")
    port = free_port()
    env = {**os.environ, "ALKSTORE_URL": postgres_url, "SHOP_SCHEMA": schema}
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "--app-dir", "examples", "async_shop:web"),
            *("--host", "127.0.0.1", "--port", str(port)),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = Shop(process, port)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert process.poll() is None, f"the server exited:\n{server.output()}"
            try:
                server.call("GET", "/jobs")
                break
            except OSError:
                assert time.monotonic() < deadline, f"the server never answered:\n{server.output()}"
                time.sleep(0.05)
        yield server, schema
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=WAIT_S)
        drop_schema(postgres_url, schema)
        drop_schema(postgres_url, f"{schema}_jobs")


def test_orders_and_their_jobs_commit_together_and_every_order_ships(
    shop: tuple[Shop, str], postgres_url: str
) -> None:
    server, schema = shop
    placed = [server.call("POST", "/orders", {"item": "tea", "quantity": 3}) for _ in range(3)]
    assert [status for status, _ in placed] == [201, 201, 201]
    assert [body["status"] for _, body in placed] == ["placed"] * 3
    # The order is written and its job enqueued, then the stock runs short:
    # the transaction rolls back, taking the order and its job with it.
    assert server.call("POST", "/orders", {"item": "tea", "quantity": 3}) == (
        409,
        {"detail": "not enough 'tea' in stock"},
    )
    assert server.call("POST", "/orders", {"item": "cocoa", "quantity": 1})[0] == 409
    assert server.call("POST", "/orders", {"item": "tea", "quantity": 0})[0] == 422

    ids = [body["id"] for _, body in placed]
    deadline = time.monotonic() + WAIT_S
    while [server.call("GET", f"/orders/{i}")[1]["status"] for i in ids] != ["shipped"] * 3:
        assert time.monotonic() < deadline, "the worker in the server's loop shipped nothing"
        time.sleep(0.05)
    assert server.call("GET", "/jobs") == (
        200,
        {"pending": 0, "scheduled": 0, "processing": 0, "dead": 0},
    )

    with psycopg.connect(postgres_url) as conn:
        orders = conn.execute(f"SELECT id, status FROM {schema}.orders ORDER BY id").fetchall()
        stock = dict(conn.execute(f"SELECT item, quantity FROM {schema}.stock").fetchall())
        shipped = conn.execute(f"SELECT order_id FROM {schema}.shipments ORDER BY 1").fetchall()
    assert orders == [(i, "shipped") for i in ids]  # no order of the refused requests
    assert shipped == [(i,) for i in ids]  # and no job of theirs ran
    assert stock == {"tea": 1, "coffee": 5, "cocoa": 0}
    with alkstore.open(postgres_url, schema=f"{schema}_jobs", migrate=False) as store:
        jobs = [body["job"] for _, body in placed]
        queue = store.queue("fulfilment")
        assert [queue.get_job(job_id) for job_id in jobs] == [None, None, None]  # acked
        assert tuple(queue.stats()) == (0, 0, 0, 0)
        assert queue.dead_jobs() == []

    server.process.send_signal(signal.SIGTERM)
    out, _ = server.process.communicate(timeout=WAIT_S)
    # Uvicorn ends by re-raising the signal it stopped for, as a process
    # stopped by SIGTERM does, once its lifespan (and so the worker) ended.
    assert server.process.returncode in (0, -signal.SIGTERM), out
    assert "Application shutdown complete" in out
    assert "stopped: 3 succeeded, 0 retried, 0 dead" in out  # the server's worker

    # More workers can join: `alkstore worker` runs the same task alone.
    env = {**os.environ, "ALKSTORE_URL": postgres_url, "SHOP_SCHEMA": schema}
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            f"INSERT INTO {schema}.orders (item, quantity) VALUES ('coffee', 1) RETURNING id"
        ).fetchone()
    assert row is not None
    examples = ROOT / "examples"
    enqueue = f"import async_shop; async_shop.fulfil.enqueue({row[0]})"
    subprocess.run([sys.executable, "-c", enqueue], cwd=examples, env=env, check=True)
    worker = subprocess.run(
        [sys.executable, "-m", "alkstore", "worker", "async_shop:app", "--burst"],
        cwd=examples,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert worker.returncode == 0, worker.stderr
    assert "stopped: 1 succeeded, 0 retried, 0 dead" in worker.stderr
    with psycopg.connect(postgres_url) as conn:
        status = conn.execute(f"SELECT status FROM {schema}.orders WHERE id = %s", row).fetchone()
    assert status == ("shipped",)
