"""The in-memory store's recurring masters: registered, fired once per fire time under
their claim, paused, resumed and cancelled."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from celery_ratchet.domain.job import (
    SCHEDULES_QUEUE,
    ClaimedJob,
    JobStatus,
    JobType,
    NewJob,
)
from celery_ratchet.store.memory.rows import (
    ACTIVE,
    PENDING,
    Tables,
    new_row,
)
from celery_ratchet.store.memory.state import MemoryState


class MasterRows:
    """Recurring masters: registered, fired once per fire time, paused, resumed."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    _DEFINITION = (
        "task_name", "priority", "payload", "content_type", "content_encoding", "headers",
        "properties", "business_key", "schedule_spec",
    )  # fmt: skip

    def upsert_master(self, master: NewJob) -> str:
        """Register a recurring master: 'created', 'updated' or 'revived'."""
        with self.state.atomic() as t:
            now = self.state.now()
            row = t.jobs.get(master.job_id)
            if row is None:
                t.jobs[master.job_id] = new_row(t.take_id(), master, now)
                self.state.announced.append(master.queue)
                return "created"
            self.state.announced.append(SCHEDULES_QUEUE)
            if row.status in ACTIVE:
                fresh = new_row(0, master, now)
                spec_changed = row.schedule_spec != master.schedule_spec
                for column in self._DEFINITION:
                    setattr(row, column, getattr(fresh, column))
                if spec_changed and row.status == PENDING:
                    row.scheduled_time = fresh.scheduled_time
                return "updated"
            row.take(master, now)
            row.clear_claim()
            row.clear_result()
            row.created_at = now
            return "revived"

    def _fire(self, t: Tables, master: ClaimedJob, occurrences: Sequence[NewJob],
              next_due: datetime | None) -> None:  # fmt: skip
        now = self.state.now()
        for occurrence in occurrences:  # unique per (master, fire time): made once
            if occurrence.job_id not in t.jobs:
                t.jobs[occurrence.job_id] = new_row(t.take_id(), occurrence, now)
        row = t.jobs[master.job_id]
        row.clear_claim()
        if next_due is None:  # no fire time left: the schedule is over
            row.status, row.finished_at = JobStatus.SUCCEEDED.value, now
            row.scheduled_time = master.scheduled_time
        else:
            row.status, row.scheduled_time = PENDING, next_due
        self.state.announced.extend(sorted({o.queue for o in occurrences}))

    def fire_master(
        self, master: ClaimedJob, occurrences: Sequence[NewJob], next_due: datetime | None
    ) -> bool:
        """Create a claimed master's occurrences and set its next due time, atomically;
        False, with nothing written, when its claim was lost."""
        with self.state.atomic() as t:
            if self.state.held(t, master.job_id, master.token) is None:
                return False
            self._fire(t, master, occurrences, next_due)
            return True

    def fire_masters(
        self, firings: Sequence[tuple[ClaimedJob, Sequence[NewJob], datetime | None]]
    ) -> list[bool]:
        """:meth:`fire_master` for many: all in one write when every claim holds, else
        each on its own."""
        with self.state.atomic() as t:
            if all(self.state.held(t, m.job_id, m.token) is not None for m, _, _ in firings):
                for firing in firings:
                    self._fire(t, *firing)
                return [True] * len(firings)
        return [self.fire_master(*firing) for firing in firings]

    def set_master_status(
        self, job_id: str, status: JobStatus, *, due: datetime | None = None
    ) -> bool:
        """Pause (PENDING → PAUSED), resume (PAUSED → PENDING at ``due``) or cancel (any
        active → REVOKED) a recurring master; False when it was not in a state to."""
        allowed = {
            JobStatus.PAUSED: {PENDING},
            JobStatus.PENDING: {JobStatus.PAUSED.value},
            JobStatus.REVOKED: set(ACTIVE),
        }[status]
        with self.state.lock:
            row = self.state.t.jobs.get(job_id)
            if row is None or row.job_type != JobType.RECURRING.value or row.status not in allowed:
                return False
            row.status = status.value
            if status is JobStatus.PENDING:
                if due is not None:
                    row.scheduled_time = due
                self.state.announced.append(SCHEDULES_QUEUE)
            if status is JobStatus.REVOKED:
                row.finished_at = self.state.now()
            return True

    def run_master_now(self, job_id: str) -> bool:
        with self.state.lock:
            now = self.state.now()
            row = self.state.t.jobs.get(job_id)
            if (
                row is None
                or row.job_type != JobType.RECURRING.value
                or row.status != PENDING
                or row.scheduled_time <= now
            ):
                return False
            row.scheduled_time = now
            self.state.announced.append(SCHEDULES_QUEUE)
            return True

    def list_masters(self, *, include_cancelled: bool = False) -> list[dict[str, Any]]:
        with self.state.lock:
            masters = [
                r
                for r in self.state.rows()
                if r.job_type == JobType.RECURRING.value
                and (include_cancelled or r.status in ACTIVE)
            ]
            masters.sort(key=lambda r: (r.business_key is None, r.business_key or ""))
            return [
                {
                    "job_id": r.job_id,
                    "business_key": r.business_key,
                    "task_name": r.task_name,
                    "status": r.status,
                    "priority": r.priority,
                    "scheduled_time": r.scheduled_time,
                    "schedule_spec": r.schedule_spec,
                }
                for r in masters
            ]
