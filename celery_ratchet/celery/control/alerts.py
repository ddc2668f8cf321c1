"""Dead-letter alerts sent through Celery: the alert job is built by Celery's own send path
(routing, serializer, task options of ``ratchet_dlq_alert_task``) into a batch that is
never written; the store writes it in the transaction that closes the window."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_ratchet.celery.send.job_types import sending_as
from celery_ratchet.celery.send.sender import JobBatch
from celery_ratchet.celery.state import is_installed, ratchet_state
from celery_ratchet.domain.job import JobType, NewJob
from celery_ratchet.errors import ConfigurationError
from celery_ratchet.runtime.dlq import DeadLetterAlerts


def dead_letter_alerts(app: Celery) -> DeadLetterAlerts | None:
    """The alert sender of this installed app (the worker's consumer asks), or None when
    ``ratchet_dlq_alert_task`` is not set."""
    state = ratchet_state(app)
    settings = state.settings
    task_name = settings.dlq_alert_task
    if task_name is None:
        return None
    if not is_installed(app):
        # Sent by name, an alert from an app without ratchet would go to its broker.
        raise ConfigurationError(
            "dead-letter alerts need a ratchet app: call celery_ratchet.install(app) first"
        )

    def alert_job(job_id: str, summary: dict[str, Any]) -> NewJob:
        batch = JobBatch(app)
        with sending_as(JobType.SYSTEM):  # the seeds' DLQ_ALERT
            app.send_task(task_name, args=[summary], task_id=job_id, producer=batch)
        batch.end_sends()
        [job] = batch.jobs
        return job

    return DeadLetterAlerts(state.store, settings.dlq_alert_interval_seconds, alert_job)
