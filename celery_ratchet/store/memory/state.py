"""What the parts of the in-memory store share: its rows, one lock, its clock and options,
the wake-ups it said, and the writes more than one part makes (a settle, a chain's steps
cancelled or restored, dead letters counted)."""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone

from celery_ratchet.domain.job import (
    JobStatus,
    Settlement,
)
from celery_ratchet.domain.priority import DEFAULT_BOOST_MINUTES
from celery_ratchet.store.memory.rows import (
    FAILED,
    REVOKED,
    WAITING,
    AlertRow,
    JobRow,
    Permit,
    Tables,
    storable,
)

logger = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class MemoryState:
    """The rows and what goes with them; every write holds :attr:`lock`."""

    def __init__(
        self,
        now: Callable[[], datetime] = utc_now,
        *,
        priority_boost_minutes: float = DEFAULT_BOOST_MINUTES,
        dlq_alert_task: str | None = None,
        shared: MemoryState | None = None,
    ) -> None:
        """``shared``: another state whose rows, lock, clock and wake-ups this one uses,
        with options of its own (another node's store on the same database)."""
        self.now: Callable[[], datetime] = now if shared is None else shared.now
        self.priority_boost_minutes = max(float(priority_boost_minutes), 0.0)
        #: The task sent dead-letter alerts: with one, each job failing for good is counted
        #: into its task name's alert window.
        self.dlq_alert_task = dlq_alert_task
        #: Every wake-up word announced, in order: what listening workers would have heard.
        self.announced: list[str] = [] if shared is None else shared.announced
        self.t: Tables = Tables() if shared is None else shared.t
        self.lock: threading.RLock = threading.RLock() if shared is None else shared.lock

    @contextlib.contextmanager
    def atomic(self) -> Iterator[Tables]:
        """The tables, under the lock; on an exception every change made within is undone."""
        with self.lock:
            kept = copy.deepcopy(self.t)
            try:
                yield self.t
            except BaseException:
                self.t.__dict__.update(kept.__dict__)  # in place: other handles share it
                raise

    def rows(self) -> Iterable[JobRow]:
        return self.t.jobs.values()

    def held(self, t: Tables, job_id: str, token: str | None) -> JobRow | None:
        row = t.jobs.get(job_id)
        return row if row is not None and row.held_by(job_id, token) else None

    def release(self, t: Tables, job_id: str, token: str | None = None) -> None:
        t.permits = [
            p
            for p in t.permits
            if not (p.job_id == job_id and (token is None or p.claim_token == token))
        ]

    def settle_one(self, t: Tables, s: Settlement) -> int:
        row = self.held(t, s.job_id, s.token)
        if row is None:
            if s.result is not None:
                logger.warning(
                    "ratchet: result of job %s not written by this execution: its row was no "
                    "longer running under its claim (finished already, or recovered from a "
                    "node presumed dead)",
                    s.job_id,
                )
            return 0
        now = self.now()
        row.status = s.status.value
        if s.result is not None:
            row.finished_at = now
            row.job_result, row.result_type = s.result.value, s.result.type_name
            row.result_meta = s.result.meta
            row.last_error = row.error_traceback = None
        elif s.status is JobStatus.PENDING:
            row.finished_at = None
            row.clear_claim()
        else:
            row.finished_at = now
            error, traceback = storable(s.error), storable(s.traceback)
            row.last_error = error if error is not None else row.last_error
            row.error_traceback = traceback if traceback is not None else row.error_traceback
        if s.status in (JobStatus.FAILED, JobStatus.REVOKED):
            self.cancel_downstream(t, [s.job_id], s.error)
        if s.status is JobStatus.FAILED:
            self.count_dead_letters(t, [row])
        return 1

    def cancel_downstream(self, t: Tables, job_ids: list[str], error: str | None) -> None:
        now = self.now()

        def revoke(row: JobRow) -> None:
            row.status, row.finished_at = REVOKED, now
            row.last_error = row.last_error if row.last_error is not None else error

        self.walk_downstream(t, job_ids, WAITING, revoke)

    def restore_downstream(self, t: Tables, job_ids: list[str]) -> None:
        def restore(row: JobRow) -> None:
            row.status, row.finished_at, row.last_error = WAITING, None, None

        self.walk_downstream(t, job_ids, REVOKED, restore)

    def count_dead_letters(self, t: Tables, rows: Sequence[JobRow]) -> None:
        """Count jobs that failed for good into their task name's open window (opening one
        at the first one's finish time), as ``dlq_alerts.count_dead_letters``."""
        if self.dlq_alert_task is None:
            return
        by_task: dict[str, list[JobRow]] = defaultdict(list)
        for row in rows:
            if row.task_name != self.dlq_alert_task and row.status == FAILED:
                by_task[row.task_name].append(row)
        for task_name, group in by_task.items():
            group = sorted(group, key=lambda r: (r.finished_at or self.now(), r.job_id))
            window = t.alerts.setdefault(task_name, AlertRow(task_name))
            window.failed += len(group)
            window.opened_at = window.opened_at or group[0].finished_at
            window.first_opened_at = window.first_opened_at or group[0].finished_at
            newest = group[-1]
            window.newest_job_id, window.newest_error = newest.job_id, newest.last_error
            window.newest_at = newest.finished_at

    def key_holder(self, t: Tables, key: str | None) -> str | None:
        """The active job holding ``key``: the database's partial unique index."""
        if key is None:
            return None
        for row in t.jobs.values():
            if row.business_key == key and row.holds_key():
                return row.job_id
        return None

    def announce_queues_of(self, job_ids: Iterable[str]) -> None:
        queues = {self.t.jobs[j].queue for j in job_ids if j in self.t.jobs}
        self.announced.extend(sorted(queues))

    @staticmethod
    def live(t: Tables, permit: Permit) -> bool:
        row = t.jobs.get(permit.job_id)
        return row is not None and row.held_by(permit.job_id, permit.claim_token)

    def walk_downstream(
        self, t: Tables, frontier: list[str], status: str, change: Callable[[JobRow], None]
    ) -> None:
        while frontier:
            found = [r for r in t.jobs.values() if r.depends_on in frontier and r.status == status]
            for row in found:
                change(row)
            frontier = [r.job_id for r in found]
