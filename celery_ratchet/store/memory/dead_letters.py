"""The in-memory store's listings, its dead-letter queue, and the alert windows of jobs
that failed for good."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from celery_ratchet.domain.dlq_alert import MAX_LISTED_JOBS, AlertState, AlertWindow
from celery_ratchet.domain.job import (
    JobStatus,
    JobSummary,
    JobType,
    NewJob,
)
from celery_ratchet.domain.schedule import MASTER_PREFIX
from celery_ratchet.errors import DuplicateJob
from celery_ratchet.store.memory.rows import (
    FAILED,
    PENDING,
    JobRow,
    new_row,
    summary,
)
from celery_ratchet.store.memory.state import MemoryState

logger = logging.getLogger(__name__)


class DeadLetterRows:
    """Listings, the dead-letter queue and its alert windows."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        task_name: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        business_key: str | None = None,
        limit: int = 50,
        include_schedules: bool = False,
        before_job_id: str | None = None,
        task_contains: str | None = None,
        ticks: bool = True,
        created_since: datetime | None = None,
        created_until: datetime | None = None,
    ) -> list[JobSummary]:
        """Jobs, newest first, as ``JobStore.list_jobs`` filters them."""
        with self.state.lock:
            cursor: int | None = None
            if before_job_id is not None:
                before = self.state.t.jobs.get(before_job_id)
                if before is None:
                    return []
                cursor = before.id

            def listed(r: JobRow) -> bool:
                return (
                    (cursor is None or r.id < cursor)
                    and (include_schedules or r.job_type != JobType.RECURRING.value)
                    and (task_contains is None or task_contains.lower() in r.task_name.lower())
                    and (ticks or not r.job_id.startswith(MASTER_PREFIX))
                    and (created_since is None or r.created_at >= created_since)
                    and (created_until is None or r.created_at < created_until)
                    and (tag is None or f",{tag}," in (r.tags or ""))
                    and (business_key is None or r.business_key == business_key)
                    and (status is None or r.status == status.value)
                    and (task_name is None or r.task_name == task_name)
                    and (queue is None or r.queue == queue)
                )

            rows = sorted((r for r in self.state.rows() if listed(r)), key=lambda r: -r.id)
            return [summary(r) for r in rows[:limit]]

    def _failed(
        self, job_ids: Sequence[str] | None, task_name: str | None, queue: str | None
    ) -> list[JobRow]:
        wanted = None if job_ids is None else set(job_ids)
        rows = [
            r
            for r in self.state.rows()
            if r.status == FAILED
            and (wanted is None or r.job_id in wanted)
            and (task_name is None or r.task_name == task_name)
            and (queue is None or r.queue == queue)
        ]
        return sorted(rows, key=lambda r: r.id)

    def retry_failed(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task_name: str | None = None,
        queue: str | None = None,
        rewrite_headers: Callable[[str], str] = lambda headers: headers,
    ) -> int:
        """FAILED jobs back to PENDING, due now, error cleared, attempts at 0; one whose
        business key another active job holds stays FAILED."""
        if job_ids is not None and not job_ids:
            return 0
        with self.state.atomic() as t:
            now = self.state.now()
            rows = self._failed(job_ids, task_name, queue)
            done = 0
            requeued: list[str] = []
            for row in rows:
                if self.state.key_holder(t, row.business_key) not in (None, row.job_id):
                    logger.warning(
                        "ratchet: failed job %s left in the dead-letter queue: another active "
                        "job holds its business key",
                        row.job_id,
                    )
                    continue
                row.status, row.scheduled_time, row.expires_at = PENDING, now, None
                row.attempts = row.claims = 0
                row.headers = rewrite_headers(row.headers)
                row.clear_claim()
                row.clear_result()
                done += 1
                requeued.append(row.job_id)
            self.state.restore_downstream(t, requeued)
            self.state.announce_queues_of(requeued)
            return done

    def purge_failed(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task_name: str | None = None,
        queue: str | None = None,
    ) -> int:
        if job_ids is not None and not job_ids:
            return 0
        with self.state.lock:
            rows = self._failed(job_ids, task_name, queue)
            for row in rows:
                del self.state.t.jobs[row.job_id]
            return len(rows)

    def due_alert_windows(self, interval_seconds: float) -> list[str]:
        with self.state.lock:
            cutoff = self.state.now() - timedelta(seconds=interval_seconds)
            return sorted(
                a.task_name
                for a in self.state.t.alerts.values()
                if a.opened_at is not None and a.opened_at <= cutoff
            )

    def close_alert_window(
        self,
        task_name: str,
        interval_seconds: float,
        alert_job: Callable[[AlertWindow, list[str], datetime], NewJob],
    ) -> NewJob | None:
        """Close the task name's window if it is due and open, writing the alert job made
        from it in the same write: once per window."""
        with self.state.atomic() as t:
            now = self.state.now()
            window = t.alerts.get(task_name)
            cutoff = now - timedelta(seconds=interval_seconds)
            if window is None or window.opened_at is None or window.opened_at > cutoff:
                return None
            window.alerts_sent += 1
            window.last_sent_at = now
            opened = window.opened_at
            failed = sorted(
                (
                    r
                    for r in t.jobs.values()
                    if r.task_name == task_name
                    and r.status == FAILED
                    and r.finished_at is not None
                    and opened <= r.finished_at <= now
                ),
                key=lambda r: (r.finished_at, r.job_id),
                reverse=True,
            )
            closed = AlertWindow(
                task_name=task_name,
                opened_at=opened,
                failed=window.failed,
                newest_job_id=window.newest_job_id,
                newest_error=window.newest_error,
                newest_at=window.newest_at,
                sequence=window.alerts_sent,
            )
            new = alert_job(closed, [r.job_id for r in failed[:MAX_LISTED_JOBS]], now)
            if new.job_id in t.jobs:
                raise DuplicateJob(new.job_id)
            t.jobs[new.job_id] = new_row(t.take_id(), new, now)
            window.last_count, window.last_alert_id = window.failed, new.job_id
            window.opened_at = window.newest_job_id = window.newest_error = None
            window.newest_at = None
            window.failed = 0
            return new

    def alert_states(self, task_names: Sequence[str]) -> dict[str, AlertState]:
        with self.state.lock:
            return {
                a.task_name: AlertState(
                    a.task_name,
                    a.opened_at,
                    a.failed,
                    a.first_opened_at,
                    a.last_sent_at,
                    a.last_alert_id,
                    a.last_count,
                )
                for a in self.state.t.alerts.values()
                if a.task_name in set(task_names)
            }
