"""How an engine plugs into the contract suite.

An engine's test module writes::

    class TestMyEngineContract(ContractSuite, MyEngineHarness):
        pass

where ``MyEngineHarness`` subclasses :class:`EngineHarness` and overrides the
``alkstore_target`` fixture (fsspec's abstract-tests pattern: the fixture
raises until overridden).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, ClassVar, NamedTuple

import pytest

import alkstore
from alkstore import Store
from alkstore.contract.registry import AsyncOpen

__all__ = ["JOB_INSERT_FAULT", "EngineHarness", "StoreTarget", "resolved"]

#: The text of the database error :meth:`EngineHarness.job_inserts_fail`
#: raises, so the suite can find it in what the scheduler reports.
JOB_INSERT_FAULT = "injected job-insert failure"


class StoreTarget(NamedTuple):
    """The address of one fresh, empty database for one test.

    ``url`` and ``options`` are passed to :func:`alkstore.open`; they must be
    picklable (plain strings and numbers), because the suite opens the same
    target in child processes too.
    """

    url: str
    options: Mapping[str, Any]


class EngineHarness:
    """The engine side of the contract suite.

    Required: the ``alkstore_target`` fixture. Optional: the methods below,
    each a capability the suite skips (with a reason) when an engine does
    not provide it.
    """

    @pytest.fixture
    def alkstore_target(self) -> Iterator[StoreTarget]:
        """Yield a :class:`StoreTarget` for a fresh, empty database; clean it
        up after the yield."""
        raise NotImplementedError(
            "override the alkstore_target fixture in your EngineHarness subclass"
        )
        yield  # type: ignore[unreachable]  # pragma: no cover  # noqa: PT022

    def open_store(self, target: StoreTarget, **options: Any) -> Store:
        """Open a store on ``target``; ``options`` (``clock=``, ``rng=`` ...)
        override the target's."""
        return alkstore.open(target.url, **{**target.options, **options})

    def open_async_store(self, target: StoreTarget, **options: Any) -> AsyncOpen:
        """Open an async store on ``target`` as :meth:`open_store` opens a
        sync one: :func:`alkstore.open_async`, whose result is awaited (or
        entered with ``async with``). An engine with native async primitives
        is used through its factory's ``open_async``; any other through the
        core's thread adapter (docs/async.md)."""
        return alkstore.open_async(target.url, **{**target.options, **options})

    # -- capabilities --------------------------------------------------------

    #: Whether a child process started with multiprocessing's ``"spawn"``
    #: method can open the target with ``alkstore.open(url, **options)``: the
    #: engine is installed (an entry point), or one of
    #: :attr:`child_process_imports` registers it. ``False`` skips the
    #: multi-process tests, e.g. for an engine registered in-process only or
    #: whose database lives in this process's memory.
    spawned_processes_can_open: ClassVar[bool] = True

    #: Whether a store opened before ``os.fork()`` keeps working in both the
    #: parent and the child (the child opens connections of its own). ``False``
    #: skips the fork test: D15 tells users to open stores after forking.
    stores_survive_fork: ClassVar[bool] = False

    #: Modules a spawned child imports before it opens the target, for an
    #: engine that a module registers with :func:`alkstore.register` rather
    #: than with an entry point.
    child_process_imports: ClassVar[tuple[str, ...]] = ()

    @contextlib.contextmanager
    def app_connection(self, target: StoreTarget) -> Iterator[Any]:
        """Yield the application's own driver connection to the target's
        database, of the type the engine's ``enqueue_tx`` takes, in
        autocommit mode: no transaction open, and none opened implicitly
        (``sqlite3.connect(..., isolation_level=None)``,
        ``psycopg.connect(..., autocommit=True)``), since between
        transactions the suite checks that ``enqueue_tx`` refuses it. The
        suite drives it with :meth:`begin`, ``conn.execute(sql)`` (whose
        result has ``fetchone``/``fetchall``), ``conn.commit()`` and
        ``conn.rollback()``, using only SQL that SQLite and PostgreSQL
        share (docs/engine-authors.md, "The harness"). The async part of
        the suite passes it to ``AsyncQueue.enqueue_tx``, which the core's
        thread adapter runs on one of its threads: a driver that ties a
        connection to the thread that made it must be told not to
        (``sqlite3.connect(..., check_same_thread=False)``); the suite
        never uses it from two threads at once."""
        pytest.skip("this engine's harness gives no application connection")
        yield  # type: ignore[unreachable]  # pragma: no cover

    def begin(self, conn: Any) -> None:
        """Open a transaction on an :meth:`app_connection` connection."""
        conn.execute("BEGIN")

    @contextlib.asynccontextmanager
    async def async_app_connection(self, target: StoreTarget) -> AsyncIterator[Any]:
        """Yield the application's own driver connection for
        ``AsyncQueue.enqueue_tx``, as :meth:`app_connection` does for
        ``Queue.enqueue_tx``: of the type the engine's *async* ``enqueue_tx``
        takes, to the target's database, in autocommit mode.

        The default yields :meth:`app_connection`'s, the sync driver's
        connection, which the core's thread adapter passes to the sync
        engine's ``enqueue_tx`` on one of its threads (docs/async.md). An
        engine with native async primitives whose ``enqueue_tx`` takes its
        async driver's connection overrides it (PostgreSQL: a
        ``psycopg.AsyncConnection``). The suite drives the connection as
        :meth:`app_connection`'s, with :meth:`begin_async`,
        ``conn.execute(sql)``, ``fetchall()``, ``conn.commit()`` and
        ``conn.rollback()``, awaiting what they return when it is
        awaitable (:func:`resolved`), so either kind of driver works."""
        with self.app_connection(target) as conn:
            yield conn

    async def begin_async(self, conn: Any) -> None:
        """Open a transaction on an :meth:`async_app_connection` connection."""
        await resolved(conn.execute("BEGIN"))

    @contextlib.contextmanager
    def dead_letter_inserts_fail(self, target: StoreTarget) -> Iterator[None]:
        """While inside, every insert into the engine's dead-letter table
        (the one every move to the dead letters inserts into: SQLite's
        ``_alkstore_dead``, PostgreSQL's ``dead`` in the store's schema, for
        an engine built on those) raises in the database (a trigger), to
        prove the live-to-dead move is atomic (regression case 011); the fault
        is gone after the block."""
        pytest.skip("this engine's harness cannot inject dead-letter faults")
        yield  # type: ignore[unreachable]  # pragma: no cover

    @contextlib.contextmanager
    def job_inserts_fail(self, target: StoreTarget, queue: str) -> Iterator[None]:
        """While inside, every insert into the engine's jobs table for the
        queue ``queue`` raises in the database (a trigger) an error whose
        text holds :data:`JOB_INSERT_FAULT`: a schedule into that queue can
        never fire (regression case 014). Inserts into other queues work."""
        pytest.skip("this engine's harness cannot inject job-insert faults")
        yield  # type: ignore[unreachable]  # pragma: no cover

    def overwrite_schedule_column(
        self, target: StoreTarget, name: str, column: str, value: str | bytes
    ) -> None:
        """Set one column of the stored schedule ``name`` behind the store's
        back, as a newer release or a hand edit would (regression case 014).

        ``column`` is one of ``alkstore.engine.SCHEDULE_COLUMNS`` stored as
        the core encodes it: ``value`` is the text of ``options`` (the JSON
        of ``Schedule.options_json``), ``spec``, ``timezone``, ``queue`` or
        ``content_type``, or the bytes of ``payload_bytes``."""
        pytest.skip("this engine's harness cannot write stored schedule columns")

    @contextlib.contextmanager
    def job_writes_fail(self, target: StoreTarget) -> Iterator[None]:
        """While inside, every update or delete of the engine's live job
        rows raises in the database (a trigger) with an error that may pass,
        so that every write on a held job (ack, ``ack_batch``, retry, fail,
        heartbeat) and every claim fails with a non-permanent
        ``EngineError``; on leaving, they work again (regression case 015)."""
        pytest.skip("this engine's harness cannot inject job-write faults")
        yield  # type: ignore[unreachable]  # pragma: no cover


async def resolved(value: Any) -> Any:
    """``value``, awaited if it is awaitable: the result of a call on a
    sync driver's connection or on an async driver's alike."""
    if inspect.isawaitable(value):
        return await value
    return value
