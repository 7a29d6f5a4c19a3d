"""The test project's tasks: plain Django tasks, nothing alkstore-specific."""

from typing import Any

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task

from djshop.models import Order


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def boom(message: str) -> None:
    raise ValueError(message)


@task()
def mark_paid(order_id: int, database: str = "default") -> str:
    order = Order.objects.using(database).get(pk=order_id)
    order.note = "paid"
    order.save(using=database)
    return f"order {order_id} paid"


@task(takes_context=True)
def whoami(context: Any, tag: str) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt, "tag": tag}


@task()
async def double(x: int) -> int:
    return 2 * x
