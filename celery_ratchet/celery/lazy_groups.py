"""A group of a generator sends each member as the generator yields it, as stock Celery
does (Celery issue #3021: a chord header's first tasks run while the rest are produced),
rather than writing all of them together when the group's sends end."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from celery_ratchet.celery.compat import group_tasks_are_lazy, wrap_group_apply_async
from celery_ratchet.celery.sender import sent_one_by_one


def _one_by_one_when_lazy(apply_async: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(apply_async)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not group_tasks_are_lazy(self):
            return apply_async(self, *args, **kwargs)
        with sent_one_by_one():
            return apply_async(self, *args, **kwargs)

    return wrapper


def connect() -> None:
    """Idempotent, process-wide; groups of apps that are not ratchet apps are unaffected."""
    wrap_group_apply_async(_one_by_one_when_lazy)
