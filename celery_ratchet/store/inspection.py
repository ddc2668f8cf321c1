"""Reads for the web dashboard that the CLI's listings do not make: throughput per minute,
one job's links to its chain and batch, a batch's children by status, resource permits.

Beside :mod:`celery_ratchet.store.admin` (``list_jobs``, ``queue_stats``, ``list_nodes``)
and :mod:`celery_ratchet.store.batches` (``summaries``), which the dashboard reads as well.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import case, func, select
from sqlalchemy.engine import Connection

from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.db_clock import (
    db_now,
    db_now_minus,
    seconds_between,
)
from celery_ratchet.store.job_rows import JOBS_ONLY, RAN_TO_AN_END, listed_column
from celery_ratchet.store.schema import (
    scheduler_job,
    scheduler_resource,
    scheduler_resource_permit,
)

if TYPE_CHECKING:
    from celery_ratchet.store.jobstore import JobStore

T = TypeVar("T")

job = scheduler_job
#: When a job started running: when its task said so (``task_track_started``), else when its
#: node claimed it.
_STARTED = func.coalesce(job.c.started_at, job.c.claimed_at)
_RUN_SECONDS = seconds_between(job.c.finished_at, _STARTED)
_WAIT_SECONDS = seconds_between(_STARTED, job.c.scheduled_time)
#: Steps waiting on one job that a job page lists.
DEPENDENTS_SHOWN = 20


class Inspection:
    """Read-only views of a :class:`~celery_ratchet.store.jobstore.JobStore`'s database."""

    def __init__(self, store: JobStore) -> None:
        self.db = store.db

    def _run(self, work: Callable[[Connection], T], what: str) -> T:
        return self.db.run(work, what)

    def database_now(self) -> datetime:
        """The database's clock: the one heartbeats are written by."""
        now: datetime = self._run(
            lambda conn: conn.execute(select(db_now())).scalar_one(), "the clock was not read"
        )
        return now

    def job_exists(self, job_id: str) -> bool:
        """Whether ``scheduler_job`` holds ``job_id`` (a page cursor must)."""
        stmt = select(job.c.id).where(job.c.job_id == job_id)
        found = self._run(lambda conn: conn.execute(stmt).first(), "the job was not read")
        return found is not None

    def finished_per_minute(self, minutes: int = 60) -> list[int]:
        """Jobs that ended in each of the last ``minutes`` minutes by the database clock,
        oldest minute first. One statement of a count per minute, each a range of the
        (status, finished_at) index: grouping the hour's rows by a computed minute instead
        costs an expression per row (four times slower on PostgreSQL at 500,000 rows)."""
        if not 1 <= minutes <= 1440:
            raise ValueError(f"minutes={minutes}: between 1 and 1440")
        counts = [
            select(func.count())
            .where(
                job.c.status.in_(RAN_TO_AN_END),
                job.c.finished_at >= db_now_minus(60 * (i + 1)),
                job.c.finished_at < db_now_minus(60 * i),
            )
            .scalar_subquery()
            .label(f"m{i}")
            for i in reversed(range(minutes))
        ]
        row = self._run(lambda conn: conn.execute(select(*counts)).one(), "throughput was not read")
        return [int(n) for n in row]

    def job_links(self, job_id: str) -> dict[str, Any] | None:
        """What places a job among others: its batch (group), the step it waits on, the
        steps that wait on it, its root and parent, and its timing columns."""
        stmt = select(
            job.c.job_type,
            job.c.priority,
            listed_column(job.c.scheduled_time),
            listed_column(job.c.created_at),
            listed_column(job.c.started_at),
            listed_column(job.c.claimed_at),
            job.c.claims,
            job.c.root_id,
            job.c.parent_id,
            job.c.group_id,
            job.c.depends_on,
            job.c.business_key,
            job.c.resource,
            job.c.tags,
        ).where(job.c.job_id == job_id)
        waiting = (
            select(job.c.job_id, job.c.status)
            .where(job.c.depends_on == job_id)
            .order_by(job.c.id)
            .limit(DEPENDENTS_SHOWN)
        )

        def work(conn: Connection) -> dict[str, Any] | None:
            row = conn.execute(stmt).first()
            if row is None:
                return None
            found = row._asdict()
            found["dependents"] = [(r.job_id, r.status) for r in conn.execute(waiting)]
            return found

        result: dict[str, Any] | None = self._run(work, "the job was not read")
        return result

    def children_by_status(self, batch_id: str) -> dict[str, int]:
        """How many children of a batch (a group, chord header or batch) are in each status."""
        stmt = (
            select(job.c.status, func.count())
            .where(job.c.group_id == batch_id)
            .group_by(job.c.status)
        )
        rows = self._run(lambda conn: conn.execute(stmt).all(), "the batch was not read")
        return {status: int(count) for status, count in rows}

    def resources(self) -> list[dict[str, Any]]:
        """Each resource with its capacity and the permits held now: by which job, on which
        node, since when. A permit counts only while its job runs under the same claim."""
        permit = scheduler_resource_permit
        capacities = select(scheduler_resource).order_by(scheduler_resource.c.resource)
        held = (
            select(permit.c.resource, permit.c.job_id, permit.c.node_id, permit.c.acquired_at)
            .join(job, job.c.job_id == permit.c.job_id)
            .where(
                job.c.status == JobStatus.RUNNING.value,
                job.c.claim_token == permit.c.claim_token,
            )
            .order_by(permit.c.resource, permit.c.acquired_at)
        )

        def work(conn: Connection) -> list[dict[str, Any]]:
            found: dict[str, dict[str, Any]] = {
                r.resource: {"resource": r.resource, "capacity": r.capacity, "held": []}
                for r in conn.execute(capacities)
            }
            for r in conn.execute(held):
                entry = found.setdefault(
                    r.resource, {"resource": r.resource, "capacity": None, "held": []}
                )
                entry["held"].append(
                    {"job_id": r.job_id, "node_id": r.node_id, "acquired_at": r.acquired_at}
                )
            return list(found.values())

        result: list[dict[str, Any]] = self._run(work, "resources were not read")
        return result

    def task_stats(self, window_seconds: float) -> list[dict[str, Any]]:
        """Per task name, the jobs that ended in the last ``window_seconds`` (database
        clock): how many succeeded, failed and were revoked, and their mean and longest run
        and wait times in seconds (run: start to end; wait: due to start). One range of
        the (status, finished_at) index."""
        stmt = (
            select(
                job.c.task_name,
                *_outcome_counts(),
                func.avg(_RUN_SECONDS).label("run_avg"),
                func.max(_RUN_SECONDS).label("run_max"),
                func.avg(_WAIT_SECONDS).label("wait_avg"),
                func.max(_WAIT_SECONDS).label("wait_max"),
            )
            .where(
                job.c.status.in_(RAN_TO_AN_END),
                job.c.finished_at >= db_now_minus(window_seconds),
            )
            .group_by(job.c.task_name)
            .order_by(job.c.task_name)
        )
        rows = self._run(lambda conn: conn.execute(stmt).all(), "task statistics were not read")
        return [_floats(r._asdict()) for r in rows]

    def task_series(
        self, task_name: str | None, window_seconds: float, buckets: int
    ) -> dict[str, Any]:
        """The jobs of ``task_name`` (None: every task) that ended in the last
        ``window_seconds``, in ``buckets`` equal spans of time, oldest first: per span how
        many succeeded, failed and were revoked, and the mean and longest run time.
        ``now`` is the database clock the spans end at."""
        if not 1 <= buckets <= 500:
            raise ValueError(f"buckets={buckets}: between 1 and 500")
        width = window_seconds / buckets
        since = db_now_minus(window_seconds)
        spans = seconds_between(job.c.finished_at, since) / width
        # None for an end time no timestamp holds: SQLAlchemy's floor() for SQLite (a Python
        # function) fails the whole statement on it.
        bucket = case((spans.is_(None), None), else_=func.floor(spans)).label("bucket")
        conditions = [job.c.status.in_(RAN_TO_AN_END), job.c.finished_at >= since]
        if task_name is not None:
            conditions.append(job.c.task_name == task_name)
        stmt = (
            select(
                bucket,
                *_outcome_counts(),
                func.avg(_RUN_SECONDS).label("run_avg"),
                func.max(_RUN_SECONDS).label("run_max"),
            )
            .where(*conditions)
            .group_by(bucket)
        )

        def work(conn: Connection) -> dict[str, Any]:
            now = conn.execute(select(db_now())).scalar_one()
            spans = [_floats({"succeeded": 0, "failed": 0, "revoked": 0}) for _ in range(buckets)]
            for row in conn.execute(stmt):
                if row.bucket is None:
                    continue
                at = min(max(int(row.bucket), 0), buckets - 1)  # the clock moved meanwhile
                found = _floats(row._asdict())
                for name in ("succeeded", "failed", "revoked"):
                    spans[at][name] += found[name]
                for name in ("run_avg", "run_max"):
                    if found[name] is not None:
                        spans[at][name] = max(spans[at].get(name) or 0.0, found[name])
            return {"now": now, "width_seconds": width, "spans": spans}

        result: dict[str, Any] = self._run(work, "the task's history was not read")
        return result

    def scheduled_later(self) -> dict[str, int]:
        """Per queue, the pending jobs due later than now (a countdown, an ETA, a retry's
        back-off): the ready index's rows past the database clock."""
        stmt = (
            select(job.c.queue, func.count())
            .where(
                job.c.status == JobStatus.PENDING.value,
                job.c.scheduled_time > db_now(),
                JOBS_ONLY,
            )
            .group_by(job.c.queue)
        )
        rows = self._run(lambda conn: conn.execute(stmt).all(), "scheduled jobs were not counted")
        return {queue: int(count) for queue, count in rows}


def _outcome_counts() -> list[Any]:
    return [
        func.sum(case((job.c.status == status.value, 1), else_=0)).label(status.value.lower())
        for status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.REVOKED)
    ]


def _floats(values: dict[str, Any]) -> dict[str, Any]:
    """Counts as ints and durations as floats, whatever numeric type the driver returns."""
    shown: dict[str, Any] = {}
    for name, value in values.items():
        if name in ("succeeded", "failed", "revoked"):
            shown[name] = int(value or 0)
        elif name.startswith(("run_", "wait_")):
            shown[name] = None if value is None else float(value)
        else:
            shown[name] = value
    return shown
