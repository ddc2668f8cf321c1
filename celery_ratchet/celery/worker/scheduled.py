"""``celery inspect scheduled`` without a broker. A job sent with an ETA or a countdown waits
in the store, not in a worker's timer; a worker lists the waiting jobs of the queues it
consumes in the shape stock Celery gives its timer's entries. Each job is listed by one of
the live nodes consuming its queue (see :func:`~celery_ratchet.domain.control.lister_of`)."""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.request import Request
from kombu.message import Message
from kombu.utils.json import loads

from celery_ratchet.celery.send.inflate import uncompressed_body
from celery_ratchet.celery.send.message import safe_accept
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.control import lister_of
from celery_ratchet.domain.job import ClaimedJob

logger = logging.getLogger(__name__)

#: The priority Celery's worker gives the timer entry of an ETA task (``celery.worker.strategy``).
ETA_TIMER_PRIORITY = 6
#: The soonest-due waiting jobs of its queues a worker looks at for one listing.
SCHEDULED_LOOKED_AT = 1000


def scheduled(consumer: Any) -> list[dict[str, Any]]:
    """The reply of Celery's ``scheduled`` command for this worker."""
    state = ratchet_state(consumer.app)
    runtime = state.runtime
    if runtime is None:
        return []
    queues = sorted(consumer.app.amqp.queues.consume_from)
    live = state.store.live_node_queues(state.settings.node_orphan_grace_seconds)
    live.setdefault(runtime.node_id, queues)
    accept, _ = safe_accept(consumer.app.conf.accept_content, state.settings.allow_pickle)
    listed = []
    for job in state.store.scheduled_jobs(queues, SCHEDULED_LOOKED_AT):
        if lister_of(job.job_id, job.queue, live) != runtime.node_id:
            continue
        request = _request(consumer, job, accept)
        if request is not None:
            eta = request.eta
            listed.append(
                {
                    "eta": eta.isoformat() if eta else None,
                    "priority": ETA_TIMER_PRIORITY,
                    "request": request.info(),
                }
            )
    return listed


def _request(consumer: Any, job: ClaimedJob, accept: set[str]) -> Request | None:
    """The job as the request a worker holding it would list; ``None`` for a job this
    worker could not run (an unregistered task, a message it would not decode)."""
    task = consumer.app.tasks.get(job.task_name)
    if task is None:
        return None
    try:
        properties = loads(job.message.properties)
        # Stock's transports deliver a message without a priority as priority 0.
        properties["priority"] = properties.get("priority") or 0
        headers = loads(job.message.headers)
        max_payload_kb = ratchet_state(consumer.app).settings.max_payload_kb
        message = Message(
            body=uncompressed_body(job.message.payload, headers, max_payload_kb, job.task_name),
            content_type=job.message.content_type,
            content_encoding=job.message.content_encoding,
            delivery_info={
                "exchange": "",
                "routing_key": job.queue,
                "priority": properties["priority"],
                "redelivered": False,
            },
            properties=properties,
            headers=headers,
            accept=accept,
        )
        return Request(message, app=consumer.app, hostname=consumer.hostname, task=task)
    except Exception as exc:
        logger.warning("ratchet: waiting job %s not listed: %s", job.job_id, type(exc).__name__)
        return None
