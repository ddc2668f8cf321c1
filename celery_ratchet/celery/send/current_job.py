"""The job this process is running now, as the writes a task makes of itself need it (a
retry, a replace): its claim token, found from Celery's current worker task."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_ratchet.celery.send.message import CLAIM_HEADER


def claim_of_current_job(app: Celery, task_id: str | None) -> str | None:
    """The claim token when ``task_id`` is the job this process is running right now."""
    current = app.current_worker_task
    if current is None or task_id is None:
        return None
    request: Any = current.request
    if request.id != task_id:
        return None
    token = getattr(request, CLAIM_HEADER, None)
    if token is None and isinstance(request.headers, dict):
        token = request.headers.get(CLAIM_HEADER)
    return token
