"""Celery internals that celery_ratchet's app and task classes rely on, one name each.

tests/unit/test_compat.py checks every one of them against the installed Celery, one test
per name, so a Celery release that moves one fails the test named after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_ratchet.errors import ConfigurationError

#: The methods Celery's Django task class adds (``celery.contrib.django.task.DjangoTask``),
#: which Celery gives an app only when it sets no task class of its own.
DJANGO_TASK_METHODS = ("delay_on_commit", "apply_async_on_commit")


def django_task_method(name: str) -> Callable[..., Any]:
    """Celery's own ``DjangoTask.<name>``, to call with any task as ``self``."""
    if name not in DJANGO_TASK_METHODS:
        raise ValueError(f"{name!r} is not one of Celery's Django task methods")
    try:
        from celery.contrib.django.task import DjangoTask
    except ImportError:
        raise ConfigurationError(
            f"task.{name}() runs the send when the current Django transaction commits, and "
            "Django is not installed: install Django, or call delay()/apply_async()"
        ) from None
    method: Callable[..., Any] = getattr(DjangoTask, name)
    return method


def message_ignore_result_overrides_task() -> bool:
    """Whether the message's ``ignore_result`` (when the sender set it) overrides the task's own.

    Celery 5.6+ decides by the message when it carries the flag (``get_actual_ignore_result``);
    older releases always send it (False by default) and ignore a result when either the
    message or the task says so."""
    from celery.app import task

    return hasattr(task, "get_actual_ignore_result")


def wrap_group_apply_async(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace Celery's ``celery.canvas.group.apply_async`` by ``wrap(original)``, once per
    process: a group has no public seam between its members' sends."""
    from celery.canvas import group

    if not getattr(group.apply_async, "__ratchet_wrapped__", False):
        wrapped = wrap(group.apply_async)
        wrapped.__ratchet_wrapped__ = True  # type: ignore[attr-defined]
        group.apply_async = wrapped


def group_tasks_are_lazy(group: Any) -> bool:
    """Whether a group's members come from a generator that Celery reads as it sends them
    (``celery.utils.functional._regen``, what ``group(<generator>)`` keeps)."""
    from celery.utils.functional import _regen

    return isinstance(getattr(group, "tasks", None), _regen)
