"""A group of a generator sends each member as the generator yields it, as stock Celery
does (Celery issue #3021: a chord header's first tasks run while the rest are produced),
rather than writing all of them together when the group's sends end. Only the group's own
batch does so: a producer the caller gave (``bulk()``, an outer group) keeps its jobs until
it is released, and a ``bulk()`` in the generator's own code is written as usual. Such a
group is not stored whole or not at all: what was sent before a refusal stays, as in stock
Celery (which sends the members of a group nested in it as its own)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from celery_ratchet.celery.compat import group_tasks_are_lazy, wrap_group_apply_async
from celery_ratchet.celery.send import alike_groups
from celery_ratchet.celery.state import is_ratchet_app


def _one_by_one_when_lazy(apply_async: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(apply_async)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not group_tasks_are_lazy(self):
            if is_ratchet_app(self.app):
                sent = _send_alike(self, *args, **kwargs)
                if sent is not None:
                    return sent
            return apply_async(self, *args, **kwargs)
        app = self.app
        if kwargs.get("producer") is not None or not is_ratchet_app(app):
            return apply_async(self, *args, **kwargs)  # the caller's batch: as it says
        # The group's own producer, given to it: a batch acquired by the generator's own
        # code (a bulk()) is written as usual.
        with app.producer_or_acquire(None) as producer:
            producer.one_by_one = True
            return apply_async(self, *args, producer=producer, **kwargs)

    return wrapper


def _send_alike(
    group: Any,
    args: Any = None,
    kwargs: Any = None,
    add_to_parent: bool = True,
    producer: Any = None,
    link: Any = None,
    link_error: Any = None,
    **options: Any,
) -> Any | None:
    """``group.apply_async``'s arguments, for :func:`alike_groups.send_alike`."""
    if link is not None or link_error is not None:  # Celery's own refusal
        return None
    return alike_groups.send_alike(group, args, kwargs, add_to_parent, producer, options)


def connect() -> None:
    """Idempotent, process-wide; groups of apps that are not ratchet apps are unaffected."""
    wrap_group_apply_async(_one_by_one_when_lazy)
