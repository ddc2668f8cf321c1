"""Housekeeping every ratchet app carries: the archiver (a recurring system job, once per
cluster) and job logs written from inside tasks."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from celery import Celery

from celery_ratchet.celery.compat import current_task_object
from celery_ratchet.celery.schedules import recurring
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.schedule import MisfirePolicy

logger = logging.getLogger("celery_ratchet.job")

ARCHIVE_TASK = "celery_ratchet.archive"
ARCHIVER_KEY = "celery_ratchet.archiver"


def register_tasks(app: Celery) -> None:
    @app.task(name=ARCHIVE_TASK, shared=False, bind=True)
    def archive(self: Any) -> dict[str, int]:
        """Move finished jobs past their retention to the archive; drop old job logs."""
        state = ratchet_state(self.app)
        settings, store = state.settings, state.store
        moved = store.archive_finished(settings.job_retention_days, settings.job_archive_batch_size)
        purged = store.purge_logs(settings.log_retention_days)
        batches = state.batches.prune(settings.job_retention_days)
        logger.info(
            "ratchet: archived %d finished jobs, deleted %d log lines and %d finished batches",
            moved,
            purged,
            batches,
        )
        return {"archived": moved, "log_lines_deleted": purged, "batches_deleted": batches}


def register_archiver(app: Celery) -> list[str]:
    """The archiver's schedule (at worker start), or its removal when switched off."""
    settings = ratchet_state(app).settings
    if not settings.job_archive_enabled:
        with contextlib.suppress(LookupError, ValueError):  # never registered: nothing to stop
            recurring.cancel_recurring(app, ARCHIVER_KEY)
        return []
    return [
        recurring.schedule_recurring(
            app,
            settings.job_archiver_cron,
            "UTC",
            app.signature(ARCHIVE_TASK),
            business_key=ARCHIVER_KEY,
            misfire=MisfirePolicy.fire_once(),
            name="job archiver",
        )
    ]


class JobLogger:
    """Lines a task writes about its job, stored with the job (``ratchet jobs show``) and
    also passed to the ``celery_ratchet.job`` logger."""

    def __init__(self, task: Any) -> None:
        self.task = task

    def _write(self, level: int, msg: str, *args: Any) -> None:
        text = msg % args if args else msg
        job_id = self.task.request.id
        logger.log(level, "%s: %s", job_id, text)
        try:
            ratchet_state(self.task.app).store.add_log(job_id, logging.getLevelName(level), text)
        except Exception as exc:  # a log line must never fail the task
            logger.warning("ratchet: job log line of %s not stored: %s", job_id, exc)

    def debug(self, msg: str, *args: Any) -> None:
        self._write(logging.DEBUG, msg, *args)

    def info(self, msg: str, *args: Any) -> None:
        self._write(logging.INFO, msg, *args)

    def warning(self, msg: str, *args: Any) -> None:
        self._write(logging.WARNING, msg, *args)

    def error(self, msg: str, *args: Any) -> None:
        self._write(logging.ERROR, msg, *args)


def job_logger() -> JobLogger:
    """The job log of the task running now: ``celery_ratchet.job_logger().info("...")``."""
    task = current_task_object()
    if task is None or not getattr(task.request, "id", None):
        raise RuntimeError("job_logger() writes to the running job's log: call it inside a task")
    return JobLogger(task)
