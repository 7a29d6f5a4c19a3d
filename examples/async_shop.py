"""An asyncio web shop whose orders and their jobs commit together.

``POST /orders`` with ``{"item": "tea", "quantity": 2}`` writes the order,
enqueues its fulfilment with ``await fulfil.aenqueue_tx(conn, order_id)``
and reserves the stock, all in one PostgreSQL transaction on the app's own
``psycopg.AsyncConnection``: when the stock runs short the request fails
with 409 and the transaction rolls back, so neither the order nor its job
exists (docs/async.md, docs/contract.md §3 "Transactional enqueue").
``fulfil`` is an ``async def`` task: it records the order's shipment and
marks it shipped on an ``AsyncConnection`` of its own. The worker runs inside
the web server's event loop (``worker.run_async()`` in the lifespan), so
the web process works off its own jobs; ``GET /orders/{id}`` shows an
order, ``GET /jobs`` the queue's counts. Run it from the repository's
root::

    pip install -e './alkstore[examples]' -e './alkstore_postgres[binary]'
    ALKSTORE_URL=postgresql://user@host/db uvicorn --app-dir examples async_shop:web

The shop's tables live in the schema ``$SHOP_SCHEMA`` (default ``shop``,
created with a little stock), alkstore's in ``<that>_jobs``. More workers
can join from other processes; stopping the server (Ctrl-C, SIGTERM) stops
the worker gracefully: running jobs get the grace period, finished ones are
acked::

    cd examples && alkstore --url "$ALKSTORE_URL" worker async_shop:app -c 16
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from fastapi import FastAPI, HTTPException
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

import alkstore

URL = os.environ.get("ALKSTORE_URL", "")
SHOP_SCHEMA = os.environ.get("SHOP_SCHEMA", "shop")
if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", SHOP_SCHEMA):
    raise SystemExit(f"SHOP_SCHEMA must be a plain lower-case identifier, not {SHOP_SCHEMA!r}")
#: What a new shop has in stock.
STOCK = {"tea": 10, "coffee": 5, "cocoa": 0}

app = alkstore.App(URL or None, schema=f"{SHOP_SCHEMA}_jobs")
#: The shop's own connections, open while the lifespan runs.
POOLS: list[AsyncConnectionPool] = []


def pool() -> AsyncConnectionPool:
    """The shop's own connections (opened by the lifespan)."""
    if not POOLS:
        raise RuntimeError("the shop's pool is not open: run the app under its lifespan")
    return POOLS[0]


def shop(query: str) -> sql.Composed:
    """``query`` with ``{}`` naming the shop's schema."""
    return sql.SQL(query).format(sql.Identifier(SHOP_SCHEMA))


@app.task(queue="fulfilment", max_attempts=5)
async def fulfil(order_id: int) -> None:
    """Ship an order: record its shipment and mark it shipped, real I/O on
    the event loop. Idempotent (a job runs at least once): shipping a
    shipped order changes nothing. A connection of its own, so that it runs
    in any worker: the web server's, or ``alkstore worker`` beside it."""
    async with await psycopg.AsyncConnection.connect(URL) as conn, conn.transaction():
        await conn.execute(
            shop("INSERT INTO {}.shipments (order_id) VALUES (%s) ON CONFLICT DO NOTHING"),
            (order_id,),
        )
        await conn.execute(
            shop(
                "UPDATE {}.orders SET status = 'shipped', shipped_at = now() "
                "WHERE id = %s AND status = 'placed'"
            ),
            (order_id,),
        )


class OrderIn(BaseModel):
    item: str = Field(min_length=1, max_length=100)
    quantity: int = Field(gt=0, le=1000)


class OutOfStockError(Exception):
    pass


async def create_tables() -> None:
    async with pool().connection() as conn:
        await conn.execute(shop("CREATE SCHEMA IF NOT EXISTS {}"))
        await conn.execute(
            shop("CREATE TABLE IF NOT EXISTS {}.stock (item text PRIMARY KEY, quantity int)")
        )
        await conn.execute(
            shop(
                "CREATE TABLE IF NOT EXISTS {}.orders (id bigserial PRIMARY KEY, "
                "item text NOT NULL, quantity int NOT NULL, "
                "status text NOT NULL DEFAULT 'placed', shipped_at timestamptz)"
            )
        )
        await conn.execute(
            shop(
                "CREATE TABLE IF NOT EXISTS {}.shipments (order_id bigint PRIMARY KEY, "
                "shipped_at timestamptz NOT NULL DEFAULT now())"
            )
        )
        async with conn.cursor() as cur:
            await cur.executemany(
                shop("INSERT INTO {}.stock VALUES (%s, %s) ON CONFLICT DO NOTHING"),
                list(STOCK.items()),
            )


@contextlib.asynccontextmanager
async def lifespan(web_app: FastAPI) -> AsyncIterator[None]:
    """Open the shop's pool and alkstore's async store, run a worker in
    this loop while the server serves, then stop it gracefully."""
    if not URL.startswith(("postgresql://", "postgres://")):
        raise SystemExit(
            "set ALKSTORE_URL to a PostgreSQL URL: the shop writes its orders and "
            "their jobs in one PostgreSQL transaction"
        )
    # Each job's outcome is an INFO record of the "alkstore.worker" logger;
    # the server configures only its own loggers.
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    shop_pool = AsyncConnectionPool(URL, min_size=1, max_size=8, open=False)
    await shop_pool.open(wait=True)
    POOLS.append(shop_pool)
    try:
        await create_tables()
        await app.astore()  # open it now, in the server's loop
        worker = asyncio.create_task(app.worker(concurrency=16).run_async())
        try:
            yield
        finally:
            worker.cancel()  # a graceful stop: the grace period, then the acks
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            await app.aclose()
    finally:
        POOLS.remove(shop_pool)
        await shop_pool.close()


web = FastAPI(title="alkstore async shop", lifespan=lifespan)


@web.post("/orders", status_code=201)
async def place_order(order: OrderIn) -> dict[str, Any]:
    try:
        async with pool().connection() as conn, conn.transaction():
            cur = await conn.execute(
                shop("INSERT INTO {}.orders (item, quantity) VALUES (%s, %s) RETURNING id"),
                (order.item, order.quantity),
            )
            row = await cur.fetchone()
            assert row is not None
            order_id: int = row[0]
            # In this transaction: it commits with the order, or not at all.
            job_id = await fulfil.aenqueue_tx(conn, order_id)
            reserved = await conn.execute(
                shop(
                    "UPDATE {}.stock SET quantity = quantity - %s "
                    "WHERE item = %s AND quantity >= %s"
                ),
                (order.quantity, order.item, order.quantity),
            )
            if reserved.rowcount != 1:
                raise OutOfStockError(order.item)  # rolls back the order and its job
    except OutOfStockError:
        raise HTTPException(409, f"not enough {order.item!r} in stock") from None
    return {"id": order_id, "job": job_id, "status": "placed"}


@web.get("/orders/{order_id}")
async def get_order(order_id: int) -> dict[str, Any]:
    async with pool().connection() as conn:
        cur = await conn.execute(
            shop("SELECT id, item, quantity, status FROM {}.orders WHERE id = %s"),
            (order_id,),
        )
        row = await cur.fetchone()
    if row is None:
        raise HTTPException(404, f"no order {order_id}")
    return dict(zip(("id", "item", "quantity", "status"), row, strict=True))


@web.get("/jobs")
async def job_counts() -> dict[str, int]:
    queue = await app.aqueue("fulfilment")
    return (await queue.stats())._asdict()


__all__ = ["app", "fulfil", "web"]
