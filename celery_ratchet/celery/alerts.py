"""Dead-letter alerts sent through Celery: the alert job is built by Celery's own send path
(routing, serializer, task options of ``ratchet_dlq_alert_task``) into a batch that is
never written; the store writes it in the transaction that closes the window."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_ratchet.celery.app import install, ratchet_state
from celery_ratchet.celery.sender import JobBatch
from celery_ratchet.domain.job import NewJob
from celery_ratchet.runtime.dlq import DeadLetterAlerts


def dead_letter_alerts(app: Celery) -> DeadLetterAlerts | None:
    """The alert sender of this app, or None when ``ratchet_dlq_alert_task`` is not set."""
    install(app)  # the alert is sent by name: the send path must be ratchet's already
    state = ratchet_state(app)
    settings = state.settings
    task_name = settings.dlq_alert_task
    if task_name is None:
        return None

    def alert_job(job_id: str, summary: dict[str, Any]) -> NewJob:
        batch = JobBatch(app)
        app.send_task(task_name, args=[summary], task_id=job_id, producer=batch)
        [job] = batch.jobs
        return job

    return DeadLetterAlerts(state.store, settings.dlq_alert_interval_seconds, alert_job)
