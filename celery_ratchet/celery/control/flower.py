"""Flower (``celery -A app flower``) on a ratchet app: events from the events Redis, queue
lengths from the job store.

Everything else Flower does already goes through the app: the worker pages and their
controls call ``app.control`` (broadcast through the store,
:mod:`celery_ratchet.celery.control.control`), revokes act on the store, tasks sent from
Flower's API are stored jobs. Two things Flower builds without asking the app, and these are
its only touch points here, each checked by a test in tests/unit/test_flower_seams.py:

- ``flower.events.EventReceiver``: Flower reads events with Celery's own receiver class on
  the app's broker connection, not with the app's ``events.Receiver``; a ratchet app's events
  travel over ``ratchet_events_url``, which only the app's receiver knows.
- ``flower.views.BaseHandler.get_broker``: Flower asks the broker (by its URL scheme) for the
  length of each queue; a ratchet app's queues are rows in the job store.

The hooks are installed when Flower loads the app's modules (Celery's ``import_modules``
signal, sent by ``Flower.__init__``) and change nothing for an app that is not a ratchet app.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterable
from typing import Any

from celery import signals
from celery.events.receiver import EventReceiver

from celery_ratchet.celery.state import is_ratchet_app, ratchet_state

logger = logging.getLogger(__name__)

#: Marks Flower's names replaced by this module, so that installing twice wraps nothing twice.
_HOOKED = "_ratchet_hooked"


def queue_lengths(app: Any, names: Iterable[str]) -> list[dict[str, Any]]:
    """The queues ``names`` as Flower's Broker page and ``/api/queues/length`` show them, with
    RabbitMQ's meaning: ready messages are PENDING jobs, unacknowledged ones are RUNNING
    jobs (claimed by a worker), messages both."""
    counts: dict[tuple[str, str], int] = {}
    for row in ratchet_state(app).store.queue_stats()["counts"]:
        counts[(row["queue"], row["status"])] = int(row["count"])
    found = []
    for name in names:
        ready = counts.get((name, "PENDING"), 0)
        unacked = counts.get((name, "RUNNING"), 0)
        found.append(
            {
                "name": name,
                "messages": ready + unacked,
                "messages_ready": ready,
                "messages_unacknowledged": unacked,
            }
        )
    return found


class StoreQueues:
    """What Flower takes for a broker (``await broker.queues(names)``), answered by the job
    store, off Flower's event loop."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def queues(self, names: Iterable[str]) -> list[dict[str, Any]]:
        wanted = list(names)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, queue_lengths, self.app, wanted)


def event_receiver(channel: Any, *args: Any, app: Any = None, **kwargs: Any) -> Any:
    """Celery's ``EventReceiver(channel, ..., app=app)`` as Flower calls it, built as the
    app's own ``app.events.Receiver`` for a ratchet app (which reads ``ratchet_events_url``)."""
    if app is not None and is_ratchet_app(app):
        if not ratchet_state(app).settings.events_url:
            logger.warning(
                "ratchet: ratchet_events_url is unset, so workers send no events and Flower "
                "lists no tasks and no workers; set it to a Redis URL and start workers with -E"
            )
        return app.events.Receiver(channel, *args, **kwargs)
    return EventReceiver(channel, *args, app=app, **kwargs)


def install_hooks() -> bool:
    """Hook Flower's two seams, if Flower is loaded. Idempotent; returns whether it is."""
    views = sys.modules.get("flower.views")
    events = sys.modules.get("flower.events")
    if views is None or events is None:
        return False
    handler = views.BaseHandler
    get_broker = getattr(handler, "get_broker", None)
    if get_broker is None:
        logger.warning(
            "ratchet: this Flower has no BaseHandler.get_broker (Flower < 2.2): its Broker "
            "page and /api/queues/length cannot read queue lengths from the job store"
        )
    elif not getattr(get_broker, _HOOKED, False):
        handler.get_broker = _get_broker_from(get_broker)
    if not getattr(events.EventReceiver, _HOOKED, False):
        setattr(event_receiver, _HOOKED, True)
        setattr(events, "EventReceiver", event_receiver)  # noqa: B010
    return True


def _get_broker_from(original: Any) -> Any:
    def get_broker(self: Any) -> Any:
        if is_ratchet_app(self.capp):
            return StoreQueues(self.capp)
        return original(self)

    setattr(get_broker, _HOOKED, True)
    return get_broker


def _on_import_modules(sender: Any = None, **_: Any) -> None:
    if sender is not None and is_ratchet_app(sender):
        install_hooks()


def connect() -> None:
    """Install the hooks whenever a ratchet app's modules are loaded with Flower present.
    Once per process: the signal keeps one receiver per ``dispatch_uid``."""
    signals.import_modules.connect(
        _on_import_modules, weak=False, dispatch_uid="celery_ratchet.flower"
    )
