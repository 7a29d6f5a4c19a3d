"""The Django Tasks backend (alkstore.contrib.django, docs/django.md) on a real
Django project (djsite, djshop), on SQLite and PostgreSQL: enqueue in
Django's transaction, the worker, priorities, queues, ``run_after``,
``get_result``."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from typing import Any

import pytest
from djhelpers import HERE, Engine

pytest.importorskip("django")
_compat = pytest.importorskip("alkstore.contrib.django._compat")

pytestmark = pytest.mark.usefixtures("django_project")


@pytest.fixture
def shop() -> Any:
    from djshop import tasks

    return tasks


def _order(engine: Engine) -> Any:
    from djshop.models import Order

    return Order.objects.using(engine.database).create(total=10)


def _orders(engine: Engine) -> int:
    from djshop.models import Order

    count: int = Order.objects.using(engine.database).count()
    return count


def _result(engine: Engine, result_id: str) -> Any:
    return _compat.get_backend(engine.backend).get_result(result_id)


# -- enqueue in Django's transaction ---------------------------------------------


def test_a_rollback_leaves_no_job(engine: Engine, shop: Any) -> None:
    from django.db import transaction

    before, orders = engine.stats(), _orders(engine)
    atomic = transaction.atomic(using=engine.database)
    with pytest.raises(RuntimeError, match="changed my mind"), atomic:  # noqa: PT012
        _order(engine)
        result = shop.add.using(backend=engine.backend).enqueue(1, 2)
        assert result.id.isdigit()  # stored by enqueue_tx: a real id at once
        raise RuntimeError("changed my mind")
    assert engine.stats() == before
    assert _orders(engine) == orders
    assert engine.job(result.id) is None
    with pytest.raises(_compat.TaskResultDoesNotExist):
        _result(engine, result.id)


def test_a_savepoint_rollback_takes_the_job_with_it(engine: Engine, shop: Any) -> None:
    from django.db import transaction

    with transaction.atomic(using=engine.database):
        kept = shop.add.using(backend=engine.backend).enqueue(1, 1)
        with pytest.raises(RuntimeError), transaction.atomic(using=engine.database):  # noqa: PT012
            dropped = shop.add.using(backend=engine.backend).enqueue(2, 2)
            raise RuntimeError
    assert engine.job(kept.id) is not None
    assert engine.job(dropped.id) is None


def test_a_commit_stores_one_job_that_a_worker_runs(engine: Engine, shop: Any) -> None:
    from django.db import transaction
    from djshop.models import Order

    before = engine.stats().pending
    with transaction.atomic(using=engine.database):
        order = _order(engine)
        result = shop.mark_paid.using(backend=engine.backend).enqueue(order.pk, engine.database)
        # Not visible to the store's own connections before the commit.
        assert engine.job(result.id) is None
    assert engine.stats().pending == before + 1
    job = engine.job(result.id)
    assert job.state == "pending"
    assert job.payload["task"] == "alkstore.contrib.django.run"
    assert job.payload["kwargs"]["task_path"] == "djshop.tasks.mark_paid"
    assert job.payload["kwargs"]["args"] == [order.pk, engine.database]
    assert _result(engine, result.id).status == _compat.READY

    counts = engine.run_worker()
    assert counts.succeeded >= 1
    assert Order.objects.using(engine.database).get(pk=order.pk).note == "paid"


def test_outside_a_transaction_the_job_is_stored_at_once(engine: Engine, shop: Any) -> None:
    result = shop.add.using(backend=engine.backend).enqueue(2, 3)
    assert result.id.isdigit()
    assert result.enqueued_at is not None
    assert engine.job(result.id).state == "pending"


def test_on_another_database_the_enqueue_waits_for_the_commit(shop: Any) -> None:
    from django.db import transaction

    elsewhere = Engine("sqlite", "elsewhere", "default")
    before = elsewhere.stats()
    with pytest.raises(RuntimeError), transaction.atomic():  # noqa: PT012
        dropped = shop.add.using(backend="elsewhere").enqueue(1, 2)
        raise RuntimeError
    assert dropped.id == ""
    assert elsewhere.stats() == before

    with transaction.atomic():
        result = shop.add.using(backend="elsewhere").enqueue(1, 2)
        assert result.id == ""  # the enqueue runs at the commit
        assert elsewhere.stats() == before
    assert result.id.isdigit()
    assert elsewhere.job(result.id).state == "pending"
    assert _result(elsewhere, result.id).status == _compat.READY


def test_the_store_is_detected_as_django_s_database(engine: Engine, shop: Any) -> None:
    from django.db import transaction

    with transaction.atomic(using=engine.database):
        shop.add.using(backend=engine.backend).enqueue(0, 0)
    assert engine.app.shares == {engine.database: True}
    elsewhere = Engine("sqlite", "elsewhere", "default")
    with transaction.atomic():
        shop.add.using(backend="elsewhere").enqueue(0, 0)
    assert elsewhere.app.shares == {"default": False}


def test_enqueue_signals_once_stored(engine: Engine, shop: Any) -> None:
    from django.db import transaction

    seen: list[str] = []

    def receiver(sender: Any, task_result: Any, **_: Any) -> None:
        seen.append(task_result.id)

    _compat.task_enqueued.connect(receiver)
    try:
        with transaction.atomic(using=engine.database):
            result = shop.add.using(backend=engine.backend).enqueue(1, 1)
            assert seen == []  # the job exists once the transaction commits
        assert seen == [result.id]
    finally:
        _compat.task_enqueued.disconnect(receiver)


# -- what lands on the job ----------------------------------------------------------


@pytest.mark.parametrize("priority", [-100, 0, 7, 100])
def test_priority_and_queue_land_on_the_job(engine: Engine, shop: Any, priority: int) -> None:
    task = shop.add.using(backend=engine.backend, priority=priority, queue_name="emails")
    result = task.enqueue(1, 2)
    job = engine.job(result.id, "emails")
    assert (job.queue, job.priority) == ("emails", priority)
    assert engine.job(result.id, "default") is None
    found = _result(engine, result.id)
    assert (found.task.queue_name, found.task.priority) == ("emails", priority)


def test_the_worker_claims_by_priority(engine: Engine, shop: Any) -> None:
    engine.run_worker(queues=["emails"])  # empty the queue first
    low = shop.whoami.using(backend=engine.backend, queue_name="emails", priority=-5).enqueue("l")
    high = shop.whoami.using(backend=engine.backend, queue_name="emails", priority=5).enqueue("h")
    order: list[str] = []

    def receiver(sender: Any, task_result: Any, **_: Any) -> None:
        order.append(task_result.id)

    _compat.task_started.connect(receiver)
    try:
        engine.run_worker(queues=["emails"], concurrency=1, prefetch=0)
    finally:
        _compat.task_started.disconnect(receiver)
    assert order == [high.id, low.id]


def test_run_after_defers_the_job(engine: Engine, shop: Any) -> None:
    later = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    result = shop.add.using(backend=engine.backend, run_after=later).enqueue(1, 2)
    job = engine.job(result.id)
    assert job.run_at == later
    engine.run_worker()
    assert engine.job(result.id).state == "pending"  # not due: the burst run left it
    assert _result(engine, result.id).status == _compat.READY


def test_queues_the_backend_does_not_declare_are_refused(engine: Engine, shop: Any) -> None:
    with pytest.raises(Exception, match="not valid for backend"):
        shop.add.using(backend=engine.backend, queue_name="nowhere")


# -- get_result ----------------------------------------------------------------------


def test_get_result_goes_from_ready_to_successful(engine: Engine, shop: Any) -> None:
    result = shop.add.using(backend=engine.backend).enqueue(20, 22)
    assert _result(engine, result.id).status == _compat.READY
    engine.run_worker()
    done = _result(engine, result.id)
    assert done.status == _compat.SUCCESSFUL
    assert done.return_value == 42
    assert done.finished_at is not None
    assert done.is_finished
    result.refresh()
    assert result.status == _compat.SUCCESSFUL
    task = shop.add.using(backend=engine.backend)
    assert task.get_result(result.id).return_value == 42


def test_a_task_with_context_and_an_async_task_return_their_values(
    engine: Engine, shop: Any
) -> None:
    with_context = shop.whoami.using(backend=engine.backend).enqueue("x")
    awaited = shop.double.using(backend=engine.backend).enqueue(21)
    engine.run_worker()
    assert _result(engine, with_context.id).return_value == {
        "id": with_context.id,
        "attempt": 1,
        "tag": "x",
    }
    assert _result(engine, awaited.id).return_value == 42


def test_a_raising_task_is_failed_with_its_error(engine: Engine, shop: Any) -> None:
    finished: list[Any] = []

    def receiver(sender: Any, task_result: Any, **_: Any) -> None:
        finished.append(task_result)

    result = shop.boom.using(backend=engine.backend).enqueue("kaboom")
    _compat.task_finished.connect(receiver)
    try:
        counts = engine.run_worker()
    finally:
        _compat.task_finished.disconnect(receiver)
    assert counts.dead >= 1
    failed = _result(engine, result.id)
    assert failed.status == _compat.FAILED
    assert failed.finished_at is not None
    assert [e.exception_class for e in failed.errors] == [ValueError]
    assert "ValueError: kaboom" in failed.errors[0].traceback
    with pytest.raises(ValueError, match="failed"):
        failed.return_value  # noqa: B018
    mine = [r for r in finished if r.id == result.id]
    assert [r.status for r in mine] == [_compat.FAILED]
    assert mine[0].errors[0].exception_class is ValueError


def test_a_running_job_is_running(engine: Engine, shop: Any) -> None:
    result = shop.add.using(backend=engine.backend).enqueue(1, 2)
    handle = engine.app.queue("default").claim_one("test-worker")
    while handle is not None and handle.id != int(result.id):  # earlier tests' leftovers
        handle.release()
        handle = engine.app.queue("default").claim_one("test-worker")
    assert handle is not None
    try:
        running = _result(engine, result.id)
        assert running.status == _compat.RUNNING
        assert running.worker_ids == ["test-worker"]
    finally:
        handle.release()


@pytest.mark.parametrize("result_id", ["999999999999", "-1", "+1", "1_0", " 1", "nope", ""])
def test_an_unknown_id_does_not_exist(engine: Engine, result_id: str) -> None:
    with pytest.raises(_compat.TaskResultDoesNotExist):
        _result(engine, result_id)


def test_a_job_that_is_no_django_task_does_not_exist(engine: Engine) -> None:
    job_id = engine.app.queue("default").enqueue({"task": "somewhere.else", "args": []})
    with pytest.raises(_compat.TaskResultDoesNotExist):
        _result(engine, str(job_id))
    engine.app.queue("default").cancel(job_id)


# -- workers ----------------------------------------------------------------------


def test_the_management_command_runs_the_jobs(engine: Engine, shop: Any) -> None:
    from django.core.management import call_command

    result = shop.boom.using(backend=engine.backend).enqueue("by the command")
    call_command("alkstore_worker", "--burst", "--backend", engine.backend, "--log-level", "ERROR")
    assert engine.job(result.id).state == "dead"
    assert "by the command" in (engine.job(result.id).last_error or "")


def test_the_management_command_refuses_another_backend() -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="missing"):
        call_command("alkstore_worker", "--burst", "--backend", "missing")


def _child_env(django_project: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **django_project}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "manage.py", "alkstore_worker", "--burst", "--concurrency", "2"],
        [
            os.path.join(os.path.dirname(sys.executable), "alkstore"),
            "worker",
            "alkstore.contrib.django.worker:app",
            "--burst",
        ],
    ],
    ids=["manage.py", "alkstore-worker"],
)
def test_a_worker_process_runs_the_jobs(
    django_project: dict[str, str], shop: Any, command: list[str]
) -> None:
    from django.db import transaction
    from djshop.models import Order

    sqlite = Engine("sqlite", "default", "default")
    with transaction.atomic():
        order = _order(sqlite)
        result = shop.mark_paid.enqueue(order.pk)
    done = subprocess.run(
        command,
        cwd=HERE,
        env=_child_env(django_project),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert Order.objects.get(pk=order.pk).note == "paid"
    assert sqlite.job(result.id) is None or sqlite.job(result.id).state == "completed"


def test_manage_py_migrate_creates_the_stores_schema(
    django_project: dict[str, str], tmp_path: Any
) -> None:
    """docs/django.md: ``manage.py migrate`` creates the schema of the store
    on the migrated database, before any request opens a transaction on it."""
    import alkstore

    fresh = tmp_path / "fresh.db"
    env = {**_child_env(django_project), "ALKSTORE_DJANGO_SQLITE": str(fresh)}
    env.pop("ALKSTORE_DJANGO_POSTGRES", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with alkstore.open(f"sqlite:///{fresh}", migrate=False) as store:
        assert store.queue_names() == []


def test_import_alkstore_imports_no_django() -> None:
    code = (
        "import sys, alkstore, alkstore.contrib, alkstore.contrib.django; "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('django', 'django_tasks')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- settings and mapping -----------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"KEEP_COMPLETED_S": 10}, "unknown OPTIONS KEEP_COMPLETED_S"),
        ({"queue_options": {"max_attempts": 0}}, "bad queue options"),
        ({"queue_options": {"keep_completed_s": 1}}, "not in OPTIONS"),
        ({"url": 5}, "must be a str"),
        ({"enqueue_on_commit": "yes"}, "must be a bool"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from alkstore.contrib.django import AlkstoreBackend

    with pytest.raises(ImproperlyConfigured, match=message):
        AlkstoreBackend("bad", {"OPTIONS": options})


@pytest.mark.parametrize(
    ("last_error", "path"),
    [
        ("ValueError: boom\n\nTraceback ...", "builtins.ValueError"),
        ("djshop.errors.Gone: away\n\nTraceback ...", "djshop.errors.Gone"),
        ("max attempts exceeded; last error: KeyError: 'k'", "builtins.KeyError"),
        ("NotABuiltin: x", "builtins.Exception"),
        ("expired", "builtins.Exception"),
        ("user 42 is gone", "builtins.Exception"),
    ],
)
def test_last_error_becomes_a_task_error(last_error: str, path: str) -> None:
    from alkstore.contrib.django.backend import _task_error

    error = _task_error(last_error)
    assert (error.exception_class_path, error.traceback) == (path, last_error)
