"""The job store in this process's memory: every port of ``store/ports.py`` with the
semantics :class:`~celery_ratchet.store.jobstore.JobStore` gives them on a database, for
unit tests of the runtime. One lock makes each operation atomic; time is read from the
``now`` it is given, so a test moves the clock instead of sleeping. The contract suite
(tests/contract) runs on it beside the databases.

What it does not hold: batches and chords, job logs, the archive, the schema, and what a
database refuses (text longer than its column); those are JobStore's alone.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_ratchet.domain.control import CONTROL_WAKEUP, ControlCommand, ControlReply
from celery_ratchet.domain.dlq_alert import MAX_LISTED_JOBS, AlertState, AlertWindow
from celery_ratchet.domain.job import (
    REVOCATIONS_WAKEUP,
    SCHEDULES_QUEUE,
    ClaimedJob,
    JobStatus,
    JobSummary,
    JobType,
    NewJob,
    OnDuplicate,
    ResultRecord,
    Settlement,
    error_record,
)
from celery_ratchet.domain.priority import DEFAULT_BOOST_MINUTES, effective_priority
from celery_ratchet.domain.recovery import OrphanRecovery, recovery_limit_record
from celery_ratchet.domain.schedule import MASTER_PREFIX
from celery_ratchet.errors import DuplicateJob
from celery_ratchet.store.memory.rows import (
    ACTIVE,
    FAILED,
    PENDING,
    REVOKE_ONLY,
    REVOKED,
    RUNNING,
    TERMINAL,
    WAITING,
    AlertRow,
    ControlRow,
    JobRow,
    NodeRow,
    Permit,
    ReplyRow,
    Tables,
    Unrunnable,
    claimed_job,
    new_row,
    result_record,
    storable,
    summary,
    waiting_row,
)

logger = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class MemoryStore:
    """Job rows in memory. Thread-safe; ``now`` is its clock (UTC, aware)."""

    display_url = "memory://"

    def __init__(
        self,
        now: Callable[[], datetime] = utc_now,
        *,
        priority_boost_minutes: float = DEFAULT_BOOST_MINUTES,
        dlq_alert_task: str | None = None,
    ) -> None:
        self.now = now
        self.priority_boost_minutes = max(float(priority_boost_minutes), 0.0)
        self.dlq_alert_task = dlq_alert_task
        #: Every wake-up word announced, in order: what listening workers would have heard.
        self.announced: list[str] = []
        self._t = Tables()
        self._lock = threading.RLock()
        # ``store.control.control_store(store)`` returns this: the runtime reaches remote
        # control through it.
        self._control = self

    @contextlib.contextmanager
    def _atomic(self) -> Iterator[Tables]:
        """The tables, under the lock; on an exception every change made within is undone."""
        with self._lock:
            kept = copy.deepcopy(self._t)
            try:
                yield self._t
            except BaseException:
                self._t.__dict__.update(kept.__dict__)  # in place: other handles share it
                raise

    def another(
        self,
        *,
        priority_boost_minutes: float | None = None,
        dlq_alert_task: str | None = None,
    ) -> MemoryStore:
        """A second store on the same rows, clock and lock, with options of its own: what
        another node's JobStore on the same database is."""
        if priority_boost_minutes is None:
            priority_boost_minutes = self.priority_boost_minutes
        other = MemoryStore(
            self.now, priority_boost_minutes=priority_boost_minutes, dlq_alert_task=dlq_alert_task
        )
        other._t, other._lock, other.announced = self._t, self._lock, self.announced
        return other

    def snapshot(self) -> Tables:
        """A copy of every row held: what a test reads where it would query a database."""
        with self._lock:
            return copy.deepcopy(self._t)

    def forge(self, change: Callable[[Tables], None]) -> None:
        """Change rows as no operation would: what a test does where it would write SQL."""
        with self._lock:
            change(self._t)

    def clock(self) -> datetime:
        """The store's time (``ControlStore.clock``)."""
        return self.now()

    def _rows(self) -> Iterable[JobRow]:
        return self._t.jobs.values()

    # -- announcing -------------------------------------------------------------------------

    def announce(self, word: str) -> None:
        with self._lock:
            self.announced.append(word)

    def _announce_queues_of(self, job_ids: Iterable[str]) -> None:
        queues = {self._t.jobs[j].queue for j in job_ids if j in self._t.jobs}
        self.announced.extend(sorted(queues))

    # -- enqueue ----------------------------------------------------------------------------

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
        with self._atomic() as t:
            now = self.now()
            for step in waiting:
                if step.job_id not in t.jobs:
                    t.jobs[step.job_id] = waiting_row(t.take_id(), step, now)
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
            self.announced.extend(sorted({new.queue for new in jobs}))
            return held

    def _key_holder(self, t: Tables, key: str | None) -> str | None:
        """The active job holding ``key``: the database's partial unique index."""
        if key is None:
            return None
        for row in t.jobs.values():
            if row.business_key == key and row.holds_key():
                return row.job_id
        return None

    def _place(self, t: Tables, new: NewJob, now: datetime, retried: bool) -> str | None:
        """Write one job; the id of the active job holding its business key instead."""
        row = t.jobs.get(new.job_id)
        if row is not None and row.status == WAITING:
            # A chain step stored ahead, released: it keeps its group, type and no key.
            row.take(new, now, keep=("group_id", "job_type", "business_key"))
            row.created_at = now
            return None
        holder = self._key_holder(t, new.business_key)
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

    # -- claim and settle -------------------------------------------------------------------

    def _boost_for(self, queues: Sequence[str]) -> float:
        return 0.0 if list(queues) == [SCHEDULES_QUEUE] else self.priority_boost_minutes

    def _claim(
        self, t: Tables, node_id: str, queues: Sequence[str], limit: int, resource: str | None
    ) -> list[ClaimedJob]:
        now = self.now()
        boost = self._boost_for(queues)
        wanted = set(queues)
        due = [
            r
            for r in t.jobs.values()
            if r.status == PENDING
            and r.queue in wanted
            and r.scheduled_time <= now
            and r.resource == resource
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
            self._settle_one(t, Settlement(row.job_id, token, JobStatus.FAILED, error=error))
        return jobs

    def claim(self, node_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        if limit <= 0 or not queues:
            return []
        with self._atomic() as t:
            return self._claim(t, node_id, queues, limit, None)

    def claim_for_resource(
        self, node_id: str, queues: Sequence[str], resource: str, capacity: int, limit: int
    ) -> list[ClaimedJob]:
        if limit <= 0 or capacity <= 0 or not queues:
            return []
        with self._atomic() as t:
            t.resources[resource] = capacity
            t.permits = [p for p in t.permits if p.resource != resource or self._live(t, p)]
            held = sum(1 for p in t.permits if p.resource == resource)
            free = min(capacity - held, limit)
            if free <= 0:
                return []
            jobs = self._claim(t, node_id, queues, free, resource)
            now = self.now()
            t.permits += [Permit(resource, j.job_id, node_id, j.token, now) for j in jobs]
            return jobs

    @staticmethod
    def _live(t: Tables, permit: Permit) -> bool:
        row = t.jobs.get(permit.job_id)
        return row is not None and row.held_by(permit.job_id, permit.claim_token)

    def _release(self, t: Tables, job_id: str, token: str | None = None) -> None:
        t.permits = [
            p
            for p in t.permits
            if not (p.job_id == job_id and (token is None or p.claim_token == token))
        ]

    def _held(self, t: Tables, job_id: str, token: str | None) -> JobRow | None:
        row = t.jobs.get(job_id)
        return row if row is not None and row.held_by(job_id, token) else None

    def defer(self, deferrals: Sequence[tuple[str, str, datetime]]) -> int:
        """Give claimed jobs back due at the given times, no attempt counted."""
        with self._atomic() as t:
            changed = 0
            for job_id, token, due in deferrals:
                row = self._held(t, job_id, token)
                if row is not None:
                    row.status, row.scheduled_time = PENDING, due
                    row.claims -= 1
                    row.clear_claim()
                    changed += 1
                self._release(t, job_id, token)
            self._announce_queues_of(j for j, _, _ in deferrals)
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
        with self._atomic() as t:
            changed = 0
            for s in first.values():
                changed += self._settle_one(t, s)
                if s.resource is not None:
                    t.permits = [
                        p
                        for p in t.permits
                        if (p.resource, p.job_id, p.claim_token) != (s.resource, s.job_id, s.token)
                    ]
            self._announce_queues_of(
                s.job_id for s in first.values() if s.status is JobStatus.PENDING
            )
            return changed

    def _settle_one(self, t: Tables, s: Settlement) -> int:
        row = self._held(t, s.job_id, s.token)
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
            self._cancel_downstream(t, [s.job_id], s.error)
        if s.status is JobStatus.FAILED:
            self._count_dead_letters(t, [row])
        return 1

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
        with self._atomic() as t:
            row = self._held(t, job_id, token)
            if row is None:
                return False
            row.status, row.finished_at = status.value, self.now()
            row.job_result, row.result_type, row.result_meta = job_result, result_type, result_meta
            row.last_error, row.error_traceback = storable(error), storable(traceback)
            if status in (JobStatus.FAILED, JobStatus.REVOKED):
                self._cancel_downstream(t, [job_id], error)
            if status is JobStatus.FAILED:
                self._count_dead_letters(t, [row])
            return True

    def replace_running(self, token: str, new: NewJob) -> bool:
        """Reschedule the row this claim owns with a new message (a retry); it keeps its
        business key and type. False when the claim was lost."""
        with self._atomic() as t:
            row = self._held(t, new.job_id, token)
            if row is None:
                return False
            row.take(new, self.now(), keep=("business_key", "job_type"))
            row.clear_claim()
            self._release(t, new.job_id, token)
            self.announced.append(row.queue)
            return True

    def holds(self, job_id: str, token: str) -> bool:
        with self._lock:
            return self._held(self._t, job_id, token) is not None

    def next_due_in(self, queues: Sequence[str]) -> float | None:
        wanted = set(queues)
        with self._lock:
            due = [
                r.scheduled_time for r in self._rows() if r.status == PENDING and r.queue in wanted
            ]
            return None if not due else (min(due) - self.now()).total_seconds()

    def running_claims(self, node_id: str, *, older_than_seconds: float) -> list[tuple[str, str]]:
        with self._lock:
            cutoff = self.now() - timedelta(seconds=older_than_seconds)
            return [
                (r.job_id, r.claim_token or "")
                for r in self._rows()
                if r.status == RUNNING
                and r.picked_by == node_id
                and (r.claimed_at is None or r.claimed_at < cutoff)
            ]

    def result(self, job_id: str) -> ResultRecord | None:
        with self._lock:
            row = self._t.jobs.get(job_id)
            return None if row is None else result_record(row)

    def count_by_status(self) -> dict[str, int]:
        """Jobs per status; recurring masters are schedules, not counted."""
        counts: dict[str, int] = defaultdict(int)
        with self._lock:
            for r in self._rows():
                if r.job_type != JobType.RECURRING.value:
                    counts[r.status] += 1
        return dict(counts)

    # -- chain steps ------------------------------------------------------------------------

    def _walk_downstream(
        self, t: Tables, frontier: list[str], status: str, change: Callable[[JobRow], None]
    ) -> None:
        while frontier:
            found = [r for r in t.jobs.values() if r.depends_on in frontier and r.status == status]
            for row in found:
                change(row)
            frontier = [r.job_id for r in found]

    def _cancel_downstream(self, t: Tables, job_ids: list[str], error: str | None) -> None:
        now = self.now()

        def revoke(row: JobRow) -> None:
            row.status, row.finished_at = REVOKED, now
            row.last_error = row.last_error if row.last_error is not None else error

        self._walk_downstream(t, job_ids, WAITING, revoke)

    def _restore_downstream(self, t: Tables, job_ids: list[str]) -> None:
        def restore(row: JobRow) -> None:
            row.status, row.finished_at, row.last_error = WAITING, None, None

        self._walk_downstream(t, job_ids, REVOKED, restore)

    # -- nodes ------------------------------------------------------------------------------

    def register_node(
        self,
        node_id: str,
        hostname: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        schedule_keys: Sequence[str] | None = None,
    ) -> datetime:
        with self._lock:
            now = self.now()
            keys = None if schedule_keys is None else sorted(schedule_keys)
            self._t.nodes[node_id] = NodeRow(
                node_id, hostname, pid, ",".join(queues), concurrency, now, now, keys
            )
            return now

    def node_schedule_keys(self) -> dict[str, list[str] | None]:
        with self._lock:
            return {n.node_id: copy.copy(n.schedule_keys) for n in self._t.nodes.values()}

    def heartbeat(self, node_id: str) -> bool:
        with self._lock:
            node = self._t.nodes.get(node_id)
            if node is None:
                return False
            node.heartbeat_ts = self.now()
            return True

    def database_time(self) -> datetime | None:
        """This store's clock: what a node measures its own against."""
        return self.now()

    def set_node_queues(self, node_id: str, queues: Sequence[str]) -> None:
        with self._lock:
            node = self._t.nodes.get(node_id)
            if node is not None:
                node.queues = ",".join(queues)

    def remove_node(self, node_id: str) -> None:
        with self._lock:
            self._t.nodes.pop(node_id, None)

    def node_heartbeats(self) -> dict[str, datetime]:
        with self._lock:
            return {n.node_id: n.heartbeat_ts for n in self._t.nodes.values()}

    def live_node_queues(self, grace_seconds: float) -> dict[str, list[str]]:
        with self._lock:
            cutoff = self.now() - timedelta(seconds=grace_seconds)
            return {
                n.node_id: [q for q in n.queues.split(",") if q]
                for n in self._t.nodes.values()
                if n.heartbeat_ts >= cutoff
            }

    def list_nodes(self) -> list[dict[str, Any]]:
        with self._lock:
            running: dict[str | None, int] = defaultdict(int)
            for r in self._rows():
                if r.status == RUNNING:
                    running[r.picked_by] += 1
            nodes = sorted(self._t.nodes.values(), key=lambda n: n.started_at)
            return [
                {
                    "node_id": n.node_id,
                    "hostname": n.hostname,
                    "pid": n.pid,
                    "queues": n.queues,
                    "concurrency": n.concurrency,
                    "started_at": n.started_at,
                    "heartbeat_ts": n.heartbeat_ts,
                    "schedule_keys": n.schedule_keys,
                    "running": running[n.node_id],
                }
                for n in nodes
            ]

    def recover_orphans(
        self,
        grace_seconds: float,
        *,
        observed: Mapping[str, datetime] | None = None,
        max_recoveries: int | None = None,
    ) -> OrphanRecovery:
        """Take the RUNNING jobs of dead nodes back, as ``JobStore.recover_orphans`` does:
        a node is dead when its heartbeat is older than the grace (and, with ``observed``,
        still the one the caller saw); a job no registered node owns is orphaned once its
        claim is older than the grace."""
        with self._atomic() as t:
            now = self.now()
            cutoff = now - timedelta(seconds=grace_seconds)
            dead = sorted(
                n.node_id
                for n in t.nodes.values()
                if n.heartbeat_ts < cutoff
                and (observed is None or observed.get(n.node_id) == n.heartbeat_ts)
            )

            def orphaned(r: JobRow) -> bool:
                if r.status != RUNNING:
                    return False
                if r.picked_by in dead:
                    return True
                unowned = r.picked_by is None or r.picked_by not in t.nodes
                return unowned and (r.claimed_at is None or r.claimed_at < cutoff)

            requeued: list[str] = []
            given_up: list[JobRow] = []
            queues: set[str] = set()
            for row in [r for r in t.jobs.values() if orphaned(r)]:
                master = row.job_type == JobType.RECURRING.value
                if max_recoveries is not None and row.claims > max_recoveries and not master:
                    row.status, row.finished_at = FAILED, now
                    row.last_error = recovery_limit_record(row.claims, max_recoveries)
                    row.error_traceback = None
                    given_up.append(row)
                else:
                    row.status = PENDING
                    row.clear_claim()
                    requeued.append(row.job_id)
                    queues.add(row.queue)
            self.announced.extend(sorted(queues))
            dead_lettered = [r.job_id for r in given_up]
            for row in given_up:
                self._cancel_downstream(t, [row.job_id], row.last_error)
            self._count_dead_letters(t, given_up)
            gone = set(requeued) | set(dead_lettered)
            t.permits = [p for p in t.permits if p.job_id not in gone and p.node_id not in dead]
            for node_id in dead:
                del t.nodes[node_id]
            return OrphanRecovery(sorted(requeued), sorted(dead_lettered), dead, sorted(queues))

    # -- revocations ------------------------------------------------------------------------

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
        with self._atomic() as t:
            now = self.now()
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
                self.announced.append(REVOCATIONS_WAKEUP)
            self._cancel_downstream(t, not_run, error)
            return revoked, marked

    def revoke_pending(self, job_ids: Sequence[str], error: str) -> int:
        return self.request_revoke(job_ids, error)[0]

    def revocations(self, node_id: str) -> list[tuple[str, str, str]]:
        with self._lock:
            return [
                (r.job_id, r.claim_token or "", r.revoke_requested)
                for r in self._rows()
                if r.status == RUNNING and r.picked_by == node_id and r.revoke_requested
            ]

    # -- recurring masters ------------------------------------------------------------------

    _DEFINITION = (
        "task_name", "priority", "payload", "content_type", "content_encoding", "headers",
        "properties", "business_key", "schedule_spec",
    )  # fmt: skip

    def upsert_master(self, master: NewJob) -> str:
        """Register a recurring master: 'created', 'updated' or 'revived'."""
        with self._atomic() as t:
            now = self.now()
            row = t.jobs.get(master.job_id)
            if row is None:
                t.jobs[master.job_id] = new_row(t.take_id(), master, now)
                self.announced.append(master.queue)
                return "created"
            self.announced.append(SCHEDULES_QUEUE)
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
        now = self.now()
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
        self.announced.extend(sorted({o.queue for o in occurrences}))

    def fire_master(
        self, master: ClaimedJob, occurrences: Sequence[NewJob], next_due: datetime | None
    ) -> bool:
        """Create a claimed master's occurrences and set its next due time, atomically;
        False, with nothing written, when its claim was lost."""
        with self._atomic() as t:
            if self._held(t, master.job_id, master.token) is None:
                return False
            self._fire(t, master, occurrences, next_due)
            return True

    def fire_masters(
        self, firings: Sequence[tuple[ClaimedJob, Sequence[NewJob], datetime | None]]
    ) -> list[bool]:
        """:meth:`fire_master` for many: all in one write when every claim holds, else
        each on its own."""
        with self._atomic() as t:
            if all(self._held(t, m.job_id, m.token) is not None for m, _, _ in firings):
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
        with self._lock:
            row = self._t.jobs.get(job_id)
            if row is None or row.job_type != JobType.RECURRING.value or row.status not in allowed:
                return False
            row.status = status.value
            if status is JobStatus.PENDING:
                if due is not None:
                    row.scheduled_time = due
                self.announced.append(SCHEDULES_QUEUE)
            if status is JobStatus.REVOKED:
                row.finished_at = self.now()
            return True

    def run_master_now(self, job_id: str) -> bool:
        with self._lock:
            now = self.now()
            row = self._t.jobs.get(job_id)
            if (
                row is None
                or row.job_type != JobType.RECURRING.value
                or row.status != PENDING
                or row.scheduled_time <= now
            ):
                return False
            row.scheduled_time = now
            self.announced.append(SCHEDULES_QUEUE)
            return True

    def list_masters(self, *, include_cancelled: bool = False) -> list[dict[str, Any]]:
        with self._lock:
            masters = [
                r
                for r in self._rows()
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

    # -- listings and the dead-letter queue -------------------------------------------------

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
        with self._lock:
            cursor: int | None = None
            if before_job_id is not None:
                before = self._t.jobs.get(before_job_id)
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

            rows = sorted((r for r in self._rows() if listed(r)), key=lambda r: -r.id)
            return [summary(r) for r in rows[:limit]]

    def _failed(
        self, job_ids: Sequence[str] | None, task_name: str | None, queue: str | None
    ) -> list[JobRow]:
        wanted = None if job_ids is None else set(job_ids)
        rows = [
            r
            for r in self._rows()
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
        with self._atomic() as t:
            now = self.now()
            rows = self._failed(job_ids, task_name, queue)
            done = 0
            for row in rows:
                if self._key_holder(t, row.business_key) not in (None, row.job_id):
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
            ids = [r.job_id for r in rows]
            self._restore_downstream(t, ids)
            self._announce_queues_of(ids)
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
        with self._lock:
            rows = self._failed(job_ids, task_name, queue)
            for row in rows:
                del self._t.jobs[row.job_id]
            return len(rows)

    def purge_pending(self, queues: Sequence[str]) -> int:
        """Delete the PENDING jobs of ``queues``, recurring masters aside; the chain steps
        after each are revoked."""
        error = error_record("TaskRevokedError", ["purged with its queue"], "celery.exceptions")
        wanted = set(queues)
        with self._atomic() as t:
            rows = [
                r
                for r in t.jobs.values()
                if r.status == PENDING
                and r.queue in wanted
                and r.job_type != JobType.RECURRING.value
            ]
            ids = [r.job_id for r in rows]
            self._cancel_downstream(t, ids, error)
            for job_id in ids:
                del t.jobs[job_id]
            return len(ids)

    # -- dead-letter alerts -----------------------------------------------------------------

    def _count_dead_letters(self, t: Tables, rows: Sequence[JobRow]) -> None:
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

    def due_alert_windows(self, interval_seconds: float) -> list[str]:
        with self._lock:
            cutoff = self.now() - timedelta(seconds=interval_seconds)
            return sorted(
                a.task_name
                for a in self._t.alerts.values()
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
        with self._atomic() as t:
            now = self.now()
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
        with self._lock:
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
                for a in self._t.alerts.values()
                if a.task_name in set(task_names)
            }

    # -- remote control ---------------------------------------------------------------------

    def broadcast(
        self,
        command: str,
        arguments: str,
        *,
        destination: str | None = None,
        pattern: str | None = None,
        matcher: str | None = None,
        ticket: str | None = None,
        ttl_seconds: float,
    ) -> None:
        with self._lock:
            now = self.now()
            grace = now - timedelta(seconds=60)
            t = self._t
            t.commands = [c for c in t.commands if c.expires_at >= grace]
            t.replies = [r for r in t.replies if r.expires_at >= grace]
            expires = now + timedelta(seconds=ttl_seconds)
            t.commands.append(
                ControlRow(
                    t.take_id(),
                    command,
                    arguments,
                    destination,
                    pattern,
                    matcher,
                    ticket,
                    now,
                    expires,
                )
            )
            self.announced.append(CONTROL_WAKEUP)

    def commands_since(self, since: datetime) -> list[ControlCommand]:
        with self._lock:
            now = self.now()
            return [
                ControlCommand(
                    c.id,
                    c.command,
                    c.arguments,
                    c.destination,
                    c.pattern,
                    c.matcher,
                    c.ticket,
                    c.created_at,
                    c.expires_at,
                )
                for c in self._t.commands
                if c.created_at >= since and c.expires_at > now
            ]

    def reply(self, command: ControlCommand, hostname: str, reply: str) -> None:
        assert command.ticket is not None
        with self._lock:
            t = self._t
            t.replies.append(
                ReplyRow(t.take_id(), command.ticket, hostname, reply, command.expires_at)
            )

    def replies(self, ticket: str, after: int = 0) -> list[ControlReply]:
        with self._lock:
            return [
                ControlReply(r.id, r.hostname, r.reply)
                for r in self._t.replies
                if r.ticket == ticket and r.id > after
            ]

    def drop_replies(self, ticket: str) -> int:
        with self._lock:
            kept = [r for r in self._t.replies if r.ticket != ticket]
            dropped = len(self._t.replies) - len(kept)
            self._t.replies = kept
            return dropped
