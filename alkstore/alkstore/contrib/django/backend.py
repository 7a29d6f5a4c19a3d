"""The Django Tasks backend: Django tasks as alkstore jobs (docs/django.md).

Each Django task call is stored as a job of one generic alkstore task,
:data:`RUN_TASK` (``"alkstore.contrib.django.run"``), registered on an
:class:`alkstore.App` the backend owns. Its payload names the Django task by
its module path; a worker (``manage.py alkstore_worker``, or ``alkstore
worker alkstore.contrib.django.worker:app``) imports it and calls its
function, not its ``enqueue``.

- ``TaskResult.id`` is the alkstore job id, as a ``str``.
- Inside ``transaction.atomic()`` on the Django database whose file or
  database is the store's, the job is stored with ``Queue.enqueue_tx`` on
  Django's own driver connection: it commits or rolls back with the block,
  and the id is real at once. On another database, the enqueue waits for the
  commit (``transaction.on_commit``): the result's id is ``""`` until then.
- ``get_result`` reads the job back: pending is ``READY``, processing
  ``RUNNING``, dead ``FAILED`` and completed (kept by ``keep_completed_s``)
  ``SUCCESSFUL`` with the task's return value.
"""

from __future__ import annotations

import builtins
import functools
import os
import re
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from alkstore.contract.job import MAX_ATTEMPTS_EXCEEDED, Job
from alkstore.contract.queue import Queue
from alkstore.errors import ValidationError
from alkstore.logic.codec import encode_payload
from alkstore.logic.options import QueueOpts
from alkstore.logic.resolution import enqueue_options
from alkstore.runtime.app import DEFAULT_QUEUE, App
from alkstore.runtime.context import JobContext
from alkstore.runtime.outcome import Fail
from alkstore.runtime.task import Task as AlkstoreTask

from ._compat import (
    FAILED,
    READY,
    RUNNING,
    SUCCESSFUL,
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    get_backend,
    normalize_json,
    task_enqueued,
    task_finished,
    task_started,
)

__all__ = [
    "DEFAULT_KEEP_COMPLETED_S",
    "OPTIONS",
    "RUN_TASK",
    "AlkstoreBackend",
    "backend_app",
    "run_task",
]

#: The name of the one alkstore task that runs every Django task.
RUN_TASK = "alkstore.contrib.django.run"

#: How long a finished job is kept for ``get_result`` unless OPTIONS say otherwise: a day.
DEFAULT_KEEP_COMPLETED_S = 86_400

#: The keys ``TASKS[alias]["OPTIONS"]`` accepts (docs/django.md "Settings").
OPTIONS = (
    "url",
    "engine_options",
    "queue_options",
    "keep_completed_s",
    "database",
    "enqueue_on_commit",
    "transactional",
)

#: What identifies a PostgreSQL database, as the engine checks ``enqueue_tx``'s connection.
_PG_IDENTITY = "SELECT pg_postmaster_start_time(), current_database()"

#: What ``TaskResult.id`` looks like: ``str(job_id)``.
_JOB_ID = re.compile(r"[0-9]+")

#: The head of a ``last_error`` written for an exception: its type, dotted
#: unless a builtin (``traceback.format_exception_only``), then ``:`` or the end.
_ERROR_HEAD = re.compile(
    rf"(?:{re.escape(MAX_ATTEMPTS_EXCEEDED)}; last error: )?((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::|$)"
)


# -- settings and the shared app ---------------------------------------------------


@dataclass(frozen=True)
class _Config:
    """One backend's settings, checked."""

    url: str | None
    engine_options: Mapping[str, Any]
    queues: tuple[str, ...]
    queue_opts: QueueOpts
    database: str
    enqueue_on_commit: bool
    transactional: bool | None

    @classmethod
    def from_params(cls, alias: str, params: Mapping[str, Any]) -> _Config:
        def bad(message: str) -> ImproperlyConfigured:
            return ImproperlyConfigured(f"TASKS[{alias!r}]: {message}")

        options = params.get("OPTIONS") or {}
        if not isinstance(options, Mapping):
            raise bad("OPTIONS must be a dict")
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise bad(f"unknown OPTIONS {', '.join(unknown)}; accepted: {', '.join(OPTIONS)}")
        url = options.get("url")
        if url is not None and not isinstance(url, str):
            raise bad("OPTIONS['url'] must be a str")
        engine_options = options.get("engine_options") or {}
        queue_options = options.get("queue_options") or {}
        if not isinstance(engine_options, Mapping) or not isinstance(queue_options, Mapping):
            raise bad("OPTIONS['engine_options'] and OPTIONS['queue_options'] must be dicts")
        if "keep_completed_s" in queue_options:
            raise bad("give keep_completed_s in OPTIONS, not in OPTIONS['queue_options']")
        try:
            opts = QueueOpts(
                **queue_options,
                keep_completed_s=options.get("keep_completed_s", DEFAULT_KEEP_COMPLETED_S),
            )
        except (TypeError, ValidationError) as exc:
            raise bad(f"bad queue options: {exc}") from exc
        queues = params.get("QUEUES", [DEFAULT_QUEUE])
        if isinstance(queues, str) or not all(isinstance(q, str) for q in queues):
            raise bad("QUEUES must be a list of queue names")
        database = options.get("database", DEFAULT_DB_ALIAS)
        enqueue_on_commit = options.get("enqueue_on_commit", True)
        transactional = options.get("transactional")
        if not isinstance(enqueue_on_commit, bool) or transactional not in (None, True, False):
            raise bad("OPTIONS['enqueue_on_commit'] must be a bool, 'transactional' None or a bool")
        return cls(
            url,
            dict(engine_options),
            tuple(dict.fromkeys(queues)),
            opts,
            database,
            enqueue_on_commit,
            transactional,
        )


class _BackendApp(App):
    """The backend's :class:`App`: the one task :data:`RUN_TASK`, and the
    backend's queue options on every queue (a Django task's ``queue_name``
    picks the queue, not the alkstore task)."""

    def __init__(self, config: _Config) -> None:
        super().__init__(config.url, **config.engine_options)
        self.config = config
        #: Whether each Django database alias is the store's database (cached).
        self.shares: dict[str, bool] = {}
        self.run: AlkstoreTask[..., Any] = self.task(
            name=RUN_TASK,
            queue=config.queues[0] if config.queues else DEFAULT_QUEUE,
            takes_context=True,
        )(run_task)

    def queue_opts(self, name: str) -> QueueOpts:
        return self.config.queue_opts

    @property
    def queue_names(self) -> list[str]:
        """The backend's ``QUEUES``, in order (a worker's default)."""
        return list(self.config.queues) or super().queue_names


_apps: dict[tuple[str, str], _BackendApp] = {}
_apps_lock = threading.Lock()


def _shared_app(alias: str, config: _Config) -> _BackendApp:
    """One app per backend alias and settings, whatever the number of
    threads: Django makes a backend instance per thread, and each app holds
    a store (its connections)."""
    key = (alias, repr(config))
    with _apps_lock:
        app = _apps.get(key)
        if app is None:
            app = _apps[key] = _BackendApp(config)
        return app


def backend_app(alias: str) -> App:
    """The :class:`alkstore.App` of the task backend ``TASKS[alias]``: what
    a worker runs.

    Raises
    ------
    ImproperlyConfigured
        If that backend is not an :class:`AlkstoreBackend`.
    """
    backend = get_backend(alias)
    if not isinstance(backend, AlkstoreBackend):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}] is {type(backend).__module__}.{type(backend).__qualname__}, "
            "not alkstore.contrib.django.AlkstoreBackend"
        )
    return backend.app


# -- the backend ---------------------------------------------------------------------


class AlkstoreBackend(BaseTaskBackend):
    """Django Tasks on an alkstore store (docs/django.md).

    ``TASKS = {"default": {"BACKEND": "alkstore.contrib.django.AlkstoreBackend",
    "QUEUES": [...], "OPTIONS": {...}}}``; :data:`OPTIONS` lists the keys.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.app: _BackendApp = _shared_app(alias, _Config.from_params(alias, params))

    @property
    def database(self) -> str:
        """The Django database alias whose transactions enqueues follow."""
        return self.app.config.database

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Store a job running ``task(*args, **kwargs)``; see the module's docstring
        for when it is stored and what the result's id is."""
        self.validate_task(task)
        call_args, call_kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        payload = self.app.run.payload(
            task_path=task.module_path, args=call_args, kwargs=call_kwargs, backend=self.alias
        )
        options: dict[str, Any] = {"priority": task.priority}
        if task.run_after is not None:
            run_at = task.run_after
            if timezone.is_naive(run_at):  # USE_TZ = False: local time
                run_at = timezone.make_aware(run_at)
            options["run_at"] = run_at
        result: TaskResult[Any] = TaskResult(
            task=task,
            id="",
            status=READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=call_args,
            kwargs=call_kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        # Opens the store if need be: before anything of the caller's transaction.
        queue = self.app.queue(task.queue_name)
        using = self.database
        connection = connections[using]
        if connection.in_atomic_block:
            if self._shares_database(using):
                connection.ensure_connection()
                _stored(result, queue.enqueue_tx(connection.connection, payload, **options))
                transaction.on_commit(functools.partial(self._announce, result), using=using)
                return result
            if self.app.config.enqueue_on_commit:
                # Refused now rather than at the commit: nothing is stored then.
                encode_payload(payload)
                enqueue_options(**options)
                store = functools.partial(self._enqueue_now, queue, payload, options, result)
                transaction.on_commit(store, using=using)
                return result
        self._enqueue_now(queue, payload, options, result)
        return result

    def _enqueue_now(
        self, queue: Queue, payload: Any, options: dict[str, Any], result: TaskResult[Any]
    ) -> None:
        _stored(result, queue.enqueue(payload, **options))
        self._announce(result)

    def _announce(self, result: TaskResult[Any]) -> None:
        task_enqueued.send(type(self), task_result=result)

    def _shares_database(self, using: str) -> bool:
        """Whether the Django database ``using`` is the store's (cached per app)."""
        transactional = self.app.config.transactional
        if transactional is not None:
            return transactional
        shares = self.app.shares.get(using)
        if shares is None:
            shares = self.app.shares[using] = _same_database(self.app, using)
        return shares

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The result of the job ``result_id`` in any of the backend's queues.

        Raises
        ------
        TaskResultDoesNotExist
            For an id that is no job of this backend's queues (never was,
            acked without ``keep_completed_s``, cancelled, purged), or a job
            that is not a Django task's.
        """
        if not isinstance(result_id, str) or not _JOB_ID.fullmatch(result_id):
            raise TaskResultDoesNotExist(result_id)
        job_id = int(result_id)
        names = self.app.config.queues or tuple(self.app.store.queue_names())
        for name in names:
            job = self.app.queue(name).get_job(job_id)
            if job is not None:
                break
        else:
            raise TaskResultDoesNotExist(result_id)
        call = _django_call(job)
        if call is None:
            raise TaskResultDoesNotExist(result_id)
        task_path, args, kwargs, backend = call
        task = _as_enqueued(_import_task(task_path), job, backend)
        return _result_of(job, task, args, kwargs, backend)


def _stored(result: TaskResult[Any], job_id: int) -> None:
    object.__setattr__(result, "id", str(job_id))
    object.__setattr__(result, "enqueued_at", timezone.now())


def _same_database(app: _BackendApp, using: str) -> bool:
    """Whether Django's database ``using`` is the app's store's: the same
    SQLite file, or the same PostgreSQL database (of the same server) through
    psycopg 3, the driver ``enqueue_tx`` takes."""
    connection = connections[using]
    scheme = app.url.partition("://")[0].lower()
    if connection.vendor == "sqlite" and scheme == "sqlite":
        if connection.is_in_memory_db():
            return False
        path = getattr(app.store, "path", None) or app.url.partition(":///")[2]
        return _same_file(os.fspath(connection.settings_dict["NAME"]), path)
    if connection.vendor == "postgresql" and scheme in ("postgresql", "postgres"):
        import psycopg

        connection.ensure_connection()
        if not isinstance(connection.connection, psycopg.Connection):
            return False  # psycopg2: enqueue_tx cannot use it
        with connection.cursor() as cursor:
            cursor.execute(_PG_IDENTITY)
            theirs = tuple(cursor.fetchone())
        with psycopg.connect("postgresql" + app.url[len(scheme) :], autocommit=True) as own:
            ours = own.execute(_PG_IDENTITY).fetchone()
        return ours is not None and theirs == tuple(ours)
    return False


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


# -- from a job back to a Django task --------------------------------------------------


def _django_call(job: Job) -> tuple[str, list[Any], dict[str, Any], str] | None:
    """The Django task call a job of :data:`RUN_TASK` stores, or ``None``."""
    payload = job.payload
    if not isinstance(payload, dict) or payload.get("task") != RUN_TASK:
        return None
    call = payload.get("kwargs")
    if not isinstance(call, dict):
        return None
    path, args, kwargs = call.get("task_path"), call.get("args", []), call.get("kwargs", {})
    backend = call.get("backend", "default")
    if not (isinstance(path, str) and isinstance(args, list) and isinstance(kwargs, dict)):
        return None
    return path, args, kwargs, backend if isinstance(backend, str) else "default"


def _import_task(task_path: str) -> Task[Any, Any]:
    """The Django task at ``task_path`` (its ``module_path``).

    Raises
    ------
    Fail
        If it cannot be imported or is not a Django task: no retry can help.
    """
    try:
        found = import_string(task_path)
    except ImportError as exc:
        raise Fail(f"cannot import the Django task {task_path!r}: {exc}") from exc
    if not isinstance(found, Task):
        raise Fail(f"{task_path!r} is a {type(found).__name__}, not a Django task")
    return found


def _as_enqueued(task: Task[Any, Any], job: Job, backend: str) -> Task[Any, Any]:
    """``task`` with the queue, priority and backend its job was enqueued with."""
    changes: dict[str, Any] = {}
    if task.queue_name != job.queue:
        changes["queue_name"] = job.queue
    if task.priority != job.priority and -100 <= job.priority <= 100:
        changes["priority"] = job.priority
    if task.backend != backend:
        changes["backend"] = backend
    if not changes:
        return task
    try:
        return task.using(**changes)
    except Exception:  # the settings changed since: the task as it is now
        return task


def _result_of(
    job: Job, task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any], backend: str
) -> TaskResult[Any]:
    finished_at = None
    errors: list[TaskError] = []
    if job.state == "processing":
        status = RUNNING
    elif job.state == "dead":
        status, finished_at = FAILED, job.died_at
    elif job.state == "completed":
        status, finished_at = SUCCESSFUL, job.finished_at
    else:  # pending: never run, or waiting for its retry
        status = READY
    if job.last_error and job.state != "completed":
        errors.append(_task_error(job.last_error))
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.enqueued_at,
        started_at=None,
        finished_at=finished_at,
        last_attempted_at=None,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=errors,
        # One entry per attempt (TaskResult.attempts is their count);
        # alkstore records the worker of the last claim only, and a retry
        # clears it: "" stands for a worker it no longer knows.
        worker_ids=[job.worker_id or ""] * job.attempts,
    )
    if job.state == "completed":
        object.__setattr__(result, "_return_value", job.result)
    return result


def _task_error(last_error: str) -> TaskError:
    """A ``TaskError`` from a job's ``last_error``: the exception's type when
    the worker wrote it from an exception, else ``Exception``; the whole text
    as the traceback."""
    head = _ERROR_HEAD.match(last_error.partition("\n")[0])
    path = "builtins.Exception"
    if head is not None:
        name = head.group(1)
        if "." in name:
            path = name
        elif isinstance(getattr(builtins, name, None), type):
            path = f"builtins.{name}"
    return TaskError(exception_class_path=path, traceback=last_error)


# -- the worker's side ---------------------------------------------------------------


def run_task(
    context: JobContext,
    task_path: str,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str = "default",
) -> Any:
    """The function of :data:`RUN_TASK`: import the Django task at
    ``task_path`` and call its function (never its ``enqueue``), in a Django
    process (``manage.py alkstore_worker``). Returns the JSON-normalised return
    value, which an ack keeps as the job's result.

    Sends Django's ``task_started``, then ``task_finished`` on success, or on
    a failure that ends the job (its last attempt, or :class:`alkstore.Fail`).
    Database connections are tidied before and after, as Django does around
    a request (``close_old_connections``).
    """
    close_old_connections()
    try:
        job = context.job
        task = _as_enqueued(_import_task(task_path), job, backend)
        now = timezone.now()
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=str(job.id),
            status=RUNNING,
            enqueued_at=job.enqueued_at,
            started_at=now,
            finished_at=None,
            last_attempted_at=now,
            args=args,
            kwargs=kwargs,
            backend=backend,
            errors=[],
            worker_ids=[job.worker_id or ""] * job.attempts,
        )
        task_started.send(AlkstoreBackend, task_result=result)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            value = normalize_json(value)
        except BaseException as exc:
            if isinstance(exc, Fail) or job.attempts >= job.max_attempts:
                object.__setattr__(result, "status", FAILED)
                object.__setattr__(result, "finished_at", timezone.now())
                result.errors.append(
                    TaskError(
                        exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                        traceback="".join(traceback.format_exception(exc)),
                    )
                )
                task_finished.send(AlkstoreBackend, task_result=result)
            raise
        object.__setattr__(result, "status", SUCCESSFUL)
        object.__setattr__(result, "finished_at", timezone.now())
        object.__setattr__(result, "_return_value", value)
        task_finished.send(AlkstoreBackend, task_result=result)
        return value
    finally:
        close_old_connections()
