"""Celery's task and worker events over the events Redis (``ratchet_events_url``).

A ratchet app has no broker to carry events, so its event dispatchers and receivers use
their own connection to ``ratchet_events_url`` instead: workers started with ``-E`` send
``task-received``, ``task-started``, ``task-succeeded``, ``task-failed``, ``task-retried``
and their heartbeats there, clients send ``task-sent`` (``task_send_sent_event``), and
``celery -A app events`` reads them back. ``task-sent`` and ``task-received`` carry the
job's seeds' types (``job_type``, ``public_type``). Without ``ratchet_events_url`` events
go nowhere, as before. An event that cannot be sent never fails a task or a send.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from celery.app.events import Events
from celery.events.dispatcher import EventDispatcher
from celery.events.receiver import EventReceiver
from kombu.connection import Connection

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import ClaimedJob, JobType, public_type

logger = logging.getLogger(__name__)


def events_url(app: Any) -> str | None:
    return ratchet_state(app).settings.events_url


#: The job the worker is handing to Celery in this thread: its ``task-received`` event is
#: sent from within (by Celery's strategy), and carries its type.
RECEIVING: ContextVar[ClaimedJob | None] = ContextVar("ratchet_receiving", default=None)


def type_fields(job_type: JobType | str) -> dict[str, str]:
    """A job's types as its events carry them: the seeds' execution and public types."""
    stored = job_type.value if isinstance(job_type, JobType) else str(job_type)
    return {"job_type": stored, "public_type": public_type(stored)}


class RatchetEventDispatcher(EventDispatcher):
    def __init__(self, connection: Any = None, hostname: str | None = None, **kwargs: Any):
        app = kwargs.get("app") or self.app
        url = events_url(app)
        self._own: Connection | None = Connection(url) if url else None
        if self._own is not None:
            connection = self._own
            kwargs["channel"] = None
        super().__init__(connection, hostname, **kwargs)

    def send(self, type: str, *args: Any, **fields: Any) -> Any:
        job = RECEIVING.get()
        if type == "task-received" and job is not None and fields.get("uuid") == job.job_id:
            fields = {**type_fields(job.job_type), **fields}
        return super().send(type, *args, **fields)

    def close(self) -> None:
        super().close()
        if self._own is not None:
            self._own.release()
            self._own = None


class RatchetEventReceiver(EventReceiver):
    def __init__(self, channel: Any, *args: Any, **kwargs: Any) -> None:
        app = kwargs.get("app") or self.app
        url = events_url(app)
        if url:
            channel = Connection(url)
        super().__init__(channel, *args, **kwargs)


class RatchetEvents(Events):
    dispatcher_cls = "celery_ratchet.celery.control.events:RatchetEventDispatcher"
    receiver_cls = "celery_ratchet.celery.control.events:RatchetEventReceiver"


def send_task_sent(app: Any, fields: dict[str, Any]) -> None:
    """Celery's ``task-sent`` event, for a job just stored (``task_send_sent_event``)."""
    if not events_url(app):
        return
    try:
        ratchet_state(app).event_sender().send("task-sent", **fields)
    except Exception as exc:  # the job is stored: a lost event must not fail the send
        logger.warning("ratchet: task-sent event of %s not sent: %s", fields.get("uuid"), exc)
