"""The dead-letter queue: jobs that failed for good (status FAILED), to inspect and requeue.

dlq = celery_ratchet.dlq(app)        # or DeadLetterQueue(JobStore(url))
dlq.list(task_name="shop.charge")
dlq.show(job_id)                     # args, kwargs, exception, traceback, attempts
dlq.retry(job_id); dlq.retry_all(task_name="shop.charge"); dlq.purge()
dlq.alerts_of(dlq.list())            # job id -> "sent", "due" or "-" (dead-letter alerts)

DeadLetterAlerts sends the alert of each closed window (see domain/dlq_alert.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery_ratchet.domain.dlq_alert import AlertWindow, alert_id, alert_shown, summarize
from celery_ratchet.domain.job import JobStatus, JobSummary, NewJob, Unreadable
from celery_ratchet.errors import rebuilt_message
from celery_ratchet.store.ports import DeadLetterStore

logger = logging.getLogger(__name__)

#: Builds the alert job: (its job id, the summary, the alert task's one argument).
AlertJobFactory = Callable[[str, dict[str, Any]], NewJob]


@dataclass(frozen=True)
class DeadLetter:
    job_id: str
    task_name: str
    queue: str
    attempts: int
    args: Any
    kwargs: Any
    exception: str | None
    traceback: str | None
    finished_at: datetime | Unreadable | None
    worker: str | None


def restart_retries(headers: str) -> str:
    """The message headers of a requeued job: Celery's retry count back to 0, and no ETA or
    expiry left over from its last run (an operator asked for it to run now)."""
    try:
        values = json.loads(headers)
    except (ValueError, RecursionError):
        return headers
    if not isinstance(values, dict):
        return headers
    values.update(retries=0, eta=None, expires=None)
    return json.dumps(values)


def exception_parts(stored: str | None) -> tuple[str, str, str | None] | None:
    """(type, message, module) of Celery's stored exception record; text that is no such
    record is its own message, of type ``error``."""
    if not stored:
        return None
    try:
        record = json.loads(stored)
    except (ValueError, RecursionError):  # written by hand or another tool: its own message
        return "error", stored, None
    if not isinstance(record, dict) or "exc_type" not in record:
        return "error", str(record), None
    message = record.get("exc_message")
    module = record.get("exc_module")
    if isinstance(message, list):
        message = rebuilt_message(str(record["exc_type"]), module, message) or ", ".join(
            str(m) for m in message
        )
    return str(record["exc_type"]), "" if message is None else str(message), module


def exception_line(stored: str | None) -> str | None:
    """``Type: message`` from Celery's stored exception record."""
    parts = exception_parts(stored)
    if parts is None:
        return None
    kind, message, _ = parts
    return message if kind == "error" else f"{kind}: {message}"


def _arguments(payload: bytes | None, content_type: str | None) -> tuple[Any, Any]:
    if not payload or content_type != "application/json":
        return None, None
    try:
        body = json.loads(payload)
        return body[0], body[1]
    except (ValueError, IndexError, KeyError, TypeError, RecursionError):
        return None, None


class DeadLetterQueue:
    def __init__(self, store: DeadLetterStore) -> None:
        self.store = store

    def list(
        self, *, task_name: str | None = None, queue: str | None = None, limit: int = 50
    ) -> list[JobSummary]:
        return self.store.list_jobs(
            status=JobStatus.FAILED, task_name=task_name, queue=queue, limit=limit
        )

    def alerts_of(self, letters: Sequence[JobSummary]) -> dict[str, str]:
        """Whether each dead letter's alert was sent (``sent``), is waiting for its window
        to close (``due``) or there is none (``-``), by job id."""
        states = self.store.alert_states([j.task_name for j in letters])
        shown = {}
        for letter in letters:
            state = states.get(letter.task_name)
            finished = letter.finished_at if isinstance(letter.finished_at, datetime) else None
            shown[letter.job_id] = alert_shown(
                finished,
                opened_at=state.opened_at if state else None,
                first_opened_at=state.first_opened_at if state else None,
                last_sent_at=state.last_sent_at if state else None,
            )
        return shown

    def show(self, job_id: str) -> DeadLetter | None:
        record = self.store.result(job_id)
        if record is None or record.status is not JobStatus.FAILED:
            return None
        args, kwargs = _arguments(record.payload, record.content_type)
        return DeadLetter(
            job_id=record.job_id,
            task_name=record.task_name,
            queue=record.queue,
            attempts=record.attempts,
            args=args,
            kwargs=kwargs,
            exception=exception_line(record.last_error),
            traceback=record.error_traceback,
            finished_at=record.finished_at,
            worker=record.picked_by,
        )

    def not_dead_letters(self, job_ids: Sequence[str]) -> dict[str, str]:
        """Those of ``job_ids`` not in the dead-letter queue, with their status (``unknown``
        for an id the store does not hold): a retry leaves them alone."""
        others = {}
        for job_id in dict.fromkeys(job_ids):
            record = self.store.result(job_id)
            if record is None:
                others[job_id] = "unknown"
            elif record.status is not JobStatus.FAILED:
                status = record.status
                others[job_id] = status.value if isinstance(status, JobStatus) else status
        return others

    def retry(self, *job_ids: str) -> int:
        """Requeue these failed jobs: due now, attempts 0, error cleared."""
        return self.store.retry_failed(list(job_ids), rewrite_headers=restart_retries)

    def retry_all(self, *, task_name: str | None = None, queue: str | None = None) -> int:
        return self.store.retry_failed(
            task_name=task_name, queue=queue, rewrite_headers=restart_retries
        )

    def purge(
        self,
        *job_ids: str,
        task_name: str | None = None,
        queue: str | None = None,
    ) -> int:
        return self.store.purge_failed(
            list(job_ids) if job_ids else None, task_name=task_name, queue=queue
        )


class DeadLetterAlerts:
    """Sends the alert of every closed window, once cluster-wide: each worker calls
    :meth:`send_due` now and then; the database lets one of them close each window."""

    def __init__(
        self, store: DeadLetterStore, interval_seconds: float, alert_job: AlertJobFactory
    ) -> None:
        self.store = store
        self.interval_seconds = interval_seconds
        self.alert_job = alert_job

    def send_due(self) -> list[NewJob]:
        """Send the alerts due now; returns the alert jobs this node wrote."""
        sent = []
        for task_name in self.store.due_alert_windows(self.interval_seconds):
            try:
                alert = self.store.close_alert_window(task_name, self.interval_seconds, self._job)
            except Exception as exc:  # one task name's alert must not hold up the others'
                logger.warning(
                    "ratchet: the dead-letter alert of task %s was not sent; its window stays "
                    "open and is tried again: %s",
                    task_name,
                    exc,
                )
                continue
            if alert is not None:
                logger.warning(
                    "ratchet: dead-letter alert %s sent for task %s", alert.job_id, task_name
                )
                sent.append(alert)
        return sent

    def _job(self, window: AlertWindow, job_ids: list[str], now: datetime) -> NewJob:
        summary = summarize(
            window,
            job_ids,
            now,
            self.interval_seconds,
            newest_error=exception_line(window.newest_error),
        )
        return self.alert_job(alert_id(window), summary.as_message())
