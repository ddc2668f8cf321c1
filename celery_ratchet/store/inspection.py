"""Reads for the web dashboard that the CLI's listings do not make: throughput per minute,
one job's links to its chain and batch, a batch's children by status, resource permits.

Beside :mod:`celery_ratchet.store.admin` (``list_jobs``, ``queue_stats``, ``list_nodes``)
and :mod:`celery_ratchet.store.batches` (``summaries``), which the dashboard reads as well.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.db_clock import (
    db_now,
    db_now_minus,
)
from celery_ratchet.store.job_rows import _RAN_TO_AN_END
from celery_ratchet.store.schema import (
    scheduler_job,
    scheduler_resource,
    scheduler_resource_permit,
)

job = scheduler_job
#: Steps waiting on one job that a job page lists.
DEPENDENTS_SHOWN = 20


class Inspection:
    """Read-only views of a :class:`~celery_ratchet.store.jobstore.JobStore`'s database."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _run(self, work: Any, what: str) -> Any:
        return self.store._run(work, what)

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
                job.c.status.in_(_RAN_TO_AN_END),
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
            job.c.scheduled_time,
            job.c.created_at,
            job.c.started_at,
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
