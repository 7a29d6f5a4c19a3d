"""The one module that picks where Django Tasks comes from: Django's own
``django.tasks`` (Django 6 and later) when present, else the ``django-tasks``
backport (``django_tasks``, 0.9 or later). Every other module of
:mod:`alkstore.contrib.django` imports these names from here.

The backport named the success status ``SUCCEEDED`` before 0.12, and
``SUCCESSFUL`` from 0.12 on, as Django 6 does: :data:`SUCCESSFUL` is
whichever the installed version has.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

__all__ = [
    "FAILED",
    "READY",
    "RUNNING",
    "SOURCE",
    "SUCCESSFUL",
    "BaseTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "get_backend",
    "normalize_json",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def _source() -> str:
    try:
        importlib.import_module("django.tasks")
    except ImportError:
        return "django_tasks"
    return "django.tasks"


def _normalize_json(value: Any) -> Any:
    """JSON-compatible types for ``value`` (tuples become lists), as the
    backport's ``normalize_json``; used where the source has none."""
    if isinstance(value, Mapping):
        return {_normalize_json(k): _normalize_json(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Sequence):
        return [_normalize_json(v) for v in value]
    raise TypeError(f"Unsupported type: {type(value)}")


#: ``"django.tasks"`` or ``"django_tasks"``: the package the names below come from.
SOURCE = _source()

if TYPE_CHECKING:
    # Type-checked against the backport (typed; Django itself has no stubs here).
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json
else:

    def _module(name: str) -> ModuleType:
        return importlib.import_module(f"{SOURCE}.{name}" if name else SOURCE)

    task_backends = _module("").task_backends
    BaseTaskBackend = _module("backends.base").BaseTaskBackend
    _base = _module("base")
    Task = _base.Task
    TaskContext = _base.TaskContext
    TaskError = _base.TaskError
    TaskResult = _base.TaskResult
    TaskResultStatus = _base.TaskResultStatus
    TaskResultDoesNotExist = _module("exceptions").TaskResultDoesNotExist
    _signals = _module("signals")
    task_enqueued = _signals.task_enqueued
    task_finished = _signals.task_finished
    task_started = _signals.task_started
    normalize_json = getattr(_module("utils"), "normalize_json", None) or _normalize_json

# The statuses, typed (TaskResultStatus is a TextChoices, which a type
# checker without Django's stubs cannot read).
_statuses: Any = TaskResultStatus
READY: TaskResultStatus = _statuses.READY
RUNNING: TaskResultStatus = _statuses.RUNNING
FAILED: TaskResultStatus = _statuses.FAILED
#: The status of a task that returned (``SUCCESSFUL``, or ``SUCCEEDED`` in
#: the backport before 0.12).
SUCCESSFUL: TaskResultStatus = getattr(_statuses, "SUCCESSFUL", None) or _statuses.SUCCEEDED


def get_backend(alias: str) -> Any:
    """The task backend configured as ``TASKS[alias]`` (one instance per thread)."""
    return task_backends[alias]
