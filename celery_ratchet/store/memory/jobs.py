"""The in-memory store's jobs: written (plain, keyed, chain steps released, finished ids
re-armed), claimed best first, settled by a compare-and-swap on the claim, and revoked."""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from celery_ratchet.domain.job import (
    REVOCATIONS_WAKEUP,
    SCHEDULES_QUEUE,
    ClaimedJob,
    JobStatus,
    JobType,
    NewJob,
    OnDuplicate,
    ResultRecord,
    Settlement,
    error_record,
)
from celery_ratchet.domain.priority import effective_priority
from celery_ratchet.errors import DuplicateJob
from celery_ratchet.store.memory.rows import (
    PENDING,
    REVOKE_ONLY,
    REVOKED,
    RUNNING,
    TERMINAL,
    WAITING,
    WAITING_COLUMNS,
    JobRow,
    Permit,
    Tables,
    Unrunnable,
    claimed_job,
    new_row,
    result_record,
    storable,
    waiting_row,
)
from celery_ratchet.store.memory.state import MemoryState

logger = logging.getLogger(__name__)


class JobRows:
    """Jobs written, claimed and settled; revokes of them."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

    def enqueue(self, new: NewJob, *, maybe_committed: bool = False) -> dict[str, str]:
        return self.enqueue_many([new], maybe_committed=maybe_committed)

    def enqueue_many(
        self,
        jobs: Sequence[NewJob],
        waiting: Sequence[NewJob] = (),
        *,
        maybe_committed: bool = False,
    ) -> dict[str, str]:
        """All or nothing, as ``JobStore.enqueue_many``: a taken id re-arms a finished job,
        releases a waiting step or raises :class:`DuplicateJob`; a held business key maps
        the job's id to its holder's (or raises, for ``OnDuplicate.RAISE``)."""
        if not jobs and not waiting:
            return {}
        heads = {w.depends_on for w in waiting}
        with self.state.atomic() as t:
            now = self.state.now()
            for step in waiting:
                row = t.jobs.get(step.job_id)
                if row is None:
                    t.jobs[step.job_id] = waiting_row(t.take_id(), step, now)
                elif step.takes_over and row.held_by(step.job_id, step.takes_over):
                    self._take_over(t, row, waiting_row(row.id, step, now))
            held: dict[str, str] = {}
            for new in jobs:
                holder = self._place(t, new, now, maybe_committed)
                if holder is None:
                    continue
                if new.job_id in heads:
                    raise DuplicateJob(
                        holder,
                        business_key=new.business_key,
                        reason="a chain cannot follow a job that is not its first step: "
                        "send the chain again once that job has ended",
                    )
                if new.on_duplicate is OnDuplicate.RAISE:
                    raise DuplicateJob(holder, business_key=new.business_key)
                held[new.job_id] = holder
            self.state.announced.extend(sorted({new.queue for new in jobs}))
            return held

    def _take_over(self, t: Tables, row: JobRow, step: JobRow) -> None:
        """The running row becomes the WAITING step that ends the chain replacing its job
        (``enqueue._take_over``): its claim and outcome cleared (a revoke asked of its id
        kept), its permit released. Its own execution's end then finds its claim gone."""
        token = row.claim_token
        for column in WAITING_COLUMNS:
            setattr(row, column, getattr(step, column))
        revoke = row.revoke_requested
        row.clear_claim()
        row.clear_result()
        row.revoke_requested = revoke
        self.state.release(t, row.job_id, token)

    def _place(self, t: Tables, new: NewJob, now: datetime, retried: bool) -> str | None:
        """Write one job; the id of the active job holding its business key instead."""
        row = t.jobs.get(new.job_id)
        if row is not None and row.status == WAITING:
            # A chain step stored ahead, released: it keeps its group, type and no key.
            row.take(new, now, keep=("group_id", "job_type", "business_key"))
            row.created_at = now
            return None
        holder = self.state.key_holder(t, new.business_key)
        if holder == new.job_id:
            return None  # this very job: sent before, still active
        if holder is not None:
            return holder
        if row is None:
            t.jobs[new.job_id] = new_row(t.take_id(), new, now)
            return None
        if new.parent_id is not None and row.depends_on == new.parent_id:
            return None  # a chain step released already, sent again: it runs once
        if retried and (row.headers, row.payload) == (new.message.headers, new.message.payload):
            return None  # stored by an earlier try whose reply was lost
        if row.status in TERMINAL:
            row.take(new, now)
            row.clear_claim()
            row.clear_result()
            row.created_at = now
            return None
        raise DuplicateJob(new.job_id)

    def _boost_for(self, queues: Sequence[str]) -> float:
        return 0.0 if list(queues) == [SCHEDULES_QUEUE] else self.state.priority_boost_minutes

    def _claim(
        self, t: Tables, node_id: str, queues: Sequence[str], limit: int, resource: str | None
    ) -> list[ClaimedJob]:
        now = self.state.now()
        boost = self._boost_for(queues)
        wanted = set(queues)
        due = [
            r
            for r in t.jobs.values()
            if r.status == PENDING
            and r.queue in wanted
            and r.scheduled_time <= now
            and r.resource == resource
            and (r.picked_by is None or r.picked_by == node_id)  # handed to one node
        ]
        due.sort(
            key=lambda r: (
                -effective_priority(r.priority, r.scheduled_time, now, boost),
                r.scheduled_time,
                r.id,
            )
        )
        token = uuid.uuid4().hex
        jobs: list[ClaimedJob] = []
        unrunnable: list[tuple[JobRow, str]] = []
        for row in due[:limit]:
            row.status, row.picked_by, row.claim_token = RUNNING, node_id, token
            row.claimed_at, row.started_at = now, None
            row.claims += 1
            try:
                jobs.append(claimed_job(row, now))
            except Unrunnable as exc:
                unrunnable.append((row, str(exc)))
        for row, reason in unrunnable:  # failed at once, never handed to a worker
            why = f"job row {row.id} cannot be run: {reason}; it was failed unrun"
            logger.error("ratchet: job %s: %s", row.job_id, why)
            error = error_record("MalformedJob", [why], "celery_ratchet.errors")
            self.state.settle_one(t, Settlement(row.job_id, token, JobStatus.FAILED, error=error))
        return jobs

    def claim(self, node_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        if limit <= 0 or not queues:
            return []
        with self.state.atomic() as t:
            return self._claim(t, node_id, queues, limit, None)

    def claim_for_resource(
        self, node_id: str, queues: Sequence[str], resource: str, capacity: int, limit: int
    ) -> list[ClaimedJob]:
        if limit <= 0 or capacity <= 0 or not queues:
            return []
        with self.state.atomic() as t:
            t.resources[resource] = capacity
            t.permits = [p for p in t.permits if p.resource != resource or self.state.live(t, p)]
            held = sum(1 for p in t.permits if p.resource == resource)
            free = min(capacity - held, limit)
            if free <= 0:
                return []
            jobs = self._claim(t, node_id, queues, free, resource)
            now = self.state.now()
            t.permits += [Permit(resource, j.job_id, node_id, j.token, now) for j in jobs]
            return jobs

    def defer(self, deferrals: Sequence[tuple[str, str, datetime]]) -> int:
        """Give claimed jobs back due at the given times, no attempt counted."""
        with self.state.atomic() as t:
            changed = 0
            for job_id, token, due in deferrals:
                row = self.state.held(t, job_id, token)
                if row is not None:
                    row.status, row.scheduled_time = PENDING, due
                    row.claims -= 1
                    row.clear_claim()
                    changed += 1
                self.state.release(t, job_id, token)
            self.state.announce_queues_of(j for j, _, _ in deferrals)
            return changed

    def hand_to(self, handoffs: Sequence[tuple[str, str, str]]) -> int:
        """Give claimed jobs back PENDING, due as they were, for one node alone to claim
        (``TaskHandoff.hand_to``); the claim is not counted."""
        with self.state.atomic() as t:
            changed = 0
            for job_id, token, node_id in handoffs:
                row = self.state.held(t, job_id, token)
                if row is not None:
                    row.status = PENDING
                    row.clear_claim()
                    row.claims -= 1
                    row.picked_by = node_id
                    changed += 1
                self.state.release(t, job_id, token)
            self.state.announce_queues_of(j for j, _, _ in handoffs)
            return changed

    def settle(
        self,
        settlements: Iterable[Settlement],
        *,
        lock_wait: float | None = None,
        retry_conflicts: bool = True,
    ) -> int:
        """Finish claimed executions: a compare-and-swap on (job id, claim token, RUNNING)
        each; an execution reported twice keeps its first outcome."""
        first: dict[tuple[str, str], Settlement] = {}
        for s in settlements:
            first.setdefault((s.job_id, s.token), s)
        with self.state.atomic() as t:
            changed = 0
            for s in first.values():
                changed += self.state.settle_one(t, s)
                if s.resource is not None:
                    t.permits = [
                        p
                        for p in t.permits
                        if (p.resource, p.job_id, p.claim_token) != (s.resource, s.job_id, s.token)
                    ]
            self.state.announce_queues_of(
                s.job_id for s in first.values() if s.status is JobStatus.PENDING
            )
            return changed

    def store_outcome(
        self,
        job_id: str,
        token: str,
        status: JobStatus,
        *,
        job_result: str | None = None,
        result_type: str | None = None,
        result_meta: str | None = None,
        error: str | None = None,
        traceback: str | None = None,
    ) -> bool:
        """Finish the execution this claim owns, with its result; False if the claim was lost."""
        with self.state.atomic() as t:
            row = self.state.held(t, job_id, token)
            if row is None:
                return False
            row.status, row.finished_at = status.value, self.state.now()
            row.job_result, row.result_type, row.result_meta = job_result, result_type, result_meta
            row.last_error, row.error_traceback = storable(error), storable(traceback)
            if status in (JobStatus.FAILED, JobStatus.REVOKED):
                self.state.cancel_downstream(t, [job_id], error)
            if status is JobStatus.FAILED:
                self.state.count_dead_letters(t, [row])
            return True

    def replace_running(self, token: str, new: NewJob) -> bool:
        """Reschedule the row this claim owns with a new message (a retry); it keeps its
        business key and type. False when the claim was lost."""
        with self.state.atomic() as t:
            row = self.state.held(t, new.job_id, token)
            if row is None:
                return False
            row.take(new, self.state.now(), keep=("business_key", "job_type"))
            row.clear_claim()
            self.state.release(t, new.job_id, token)
            self.state.announced.append(row.queue)
            return True

    def holds(self, job_id: str, token: str) -> bool:
        with self.state.lock:
            return self.state.held(self.state.t, job_id, token) is not None

    def next_due_in(self, queues: Sequence[str], node_id: str | None = None) -> float | None:
        wanted = set(queues)
        with self.state.lock:
            rows = self.state.rows()
            due = [
                r.scheduled_time
                for r in rows
                if r.status == PENDING
                and r.queue in wanted
                and (node_id is None or r.picked_by is None or r.picked_by == node_id)
            ]
            return None if not due else (min(due) - self.state.now()).total_seconds()

    def running_claims(self, node_id: str, *, older_than_seconds: float) -> list[tuple[str, str]]:
        with self.state.lock:
            cutoff = self.state.now() - timedelta(seconds=older_than_seconds)
            return [
                (r.job_id, r.claim_token or "")
                for r in self.state.rows()
                if r.status == RUNNING
                and r.picked_by == node_id
                and (r.claimed_at is None or r.claimed_at < cutoff)
            ]

    def result(self, job_id: str) -> ResultRecord | None:
        with self.state.lock:
            row = self.state.t.jobs.get(job_id)
            return None if row is None else result_record(row)

    def count_by_status(self) -> dict[str, int]:
        """Jobs per status; recurring masters are schedules, not counted."""
        counts: dict[str, int] = defaultdict(int)
        with self.state.lock:
            for r in self.state.rows():
                if r.job_type != JobType.RECURRING.value:
                    counts[r.status] += 1
        return dict(counts)

    def request_revoke(
        self,
        job_ids: Sequence[str],
        error: str,
        *,
        terminate_signal: str | None = None,
        batches: list[str] | None = None,
    ) -> tuple[int, int]:
        """Pending (and waiting) jobs become REVOKED; running ones are marked for their
        node. Returns (pending revoked, running marked)."""
        with self.state.atomic() as t:
            now = self.state.now()
            rows = [t.jobs[j] for j in dict.fromkeys(job_ids) if j in t.jobs]
            marked = revoked = 0
            not_run: list[str] = []
            for row in rows:
                if row.status == RUNNING:
                    row.revoke_requested = terminate_signal or REVOKE_ONLY
                    marked += 1
                elif row.status in (PENDING, WAITING):
                    row.status, row.finished_at, row.last_error = REVOKED, now, error
                    not_run.append(row.job_id)
                    revoked += 1
            if marked:
                self.state.announced.append(REVOCATIONS_WAKEUP)
            self.state.cancel_downstream(t, not_run, error)
            return revoked, marked

    def revoke_pending(self, job_ids: Sequence[str], error: str) -> int:
        return self.request_revoke(job_ids, error)[0]

    def revocations(self, node_id: str) -> list[tuple[str, str, str]]:
        with self.state.lock:
            return [
                (r.job_id, r.claim_token or "", r.revoke_requested)
                for r in self.state.rows()
                if r.status == RUNNING and r.picked_by == node_id and r.revoke_requested
            ]

    def purge_pending(self, queues: Sequence[str]) -> int:
        """Delete the PENDING jobs of ``queues``, recurring masters aside; the chain steps
        after each are revoked."""
        error = error_record("TaskRevokedError", ["purged with its queue"], "celery.exceptions")
        wanted = set(queues)
        with self.state.atomic() as t:
            rows = [
                r
                for r in t.jobs.values()
                if r.status == PENDING
                and r.queue in wanted
                and r.job_type != JobType.RECURRING.value
            ]
            ids = [r.job_id for r in rows]
            self.state.cancel_downstream(t, ids, error)
            for job_id in ids:
                del t.jobs[job_id]
            return len(ids)
