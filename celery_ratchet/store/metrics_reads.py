"""What one Prometheus scrape reads (``GET /metrics``): a few statements on one connection,
each bounded by what is live (jobs not finished, nodes, permits, schedules due, dead letters)
or by a recent window of finished jobs, never by the history ``scheduler_job`` keeps.

Counting finished jobs by queue and status would read every row of that history: 240-370 ms
for 1,000,000 rows on PostgreSQL. Finished jobs are counted over the window instead, by
status through the (status, finished_at) index alone, and their wait and run times are read
from at most ``limit`` of the newest of them.

Statuses are written into the SQL as literals: PostgreSQL serves ``status = 'PENDING' AND
resource IS NULL`` from a partial index only when it can prove the predicate, which a bound
parameter of a statement prepared by the driver (a scrape repeats) does not let it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    case,
    func,
    literal_column,
    select,
    union_all,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from celery_ratchet.domain.job import SCHEDULES_QUEUE, JobStatus
from celery_ratchet.store.db_clock import db_now, db_now_minus, seconds_between
from celery_ratchet.store.db_errors import is_missing_table
from celery_ratchet.store.job_rows import JOBS_ONLY, RAN_TO_AN_END, job
from celery_ratchet.store.read_ports import Durations, MetricsSnapshot, NodeReading
from celery_ratchet.store.schema import (
    scheduler_node,
    scheduler_queue_pause,
    scheduler_resource,
    scheduler_resource_permit,
)

if TYPE_CHECKING:
    from celery_ratchet.store.jobstore import JobStore

#: Statuses of jobs not finished yet that ``jobs`` counts per queue (PENDING apart).
_UNDER_WAY = ("RUNNING", "WAITING", "PAUSED")


def _status_is(*statuses: str) -> ColumnElement[bool]:
    """``status`` compared with literals (see the module's note on partial indexes)."""
    literals: list[ColumnElement[str]] = [
        literal_column(f"'{JobStatus(s).value}'") for s in statuses
    ]
    return job.c.status == literals[0] if len(literals) == 1 else job.c.status.in_(literals)


class MetricsReads:
    """The statements of a scrape, over a :class:`~celery_ratchet.store.jobstore.JobStore`."""

    def __init__(self, store: JobStore) -> None:
        self.db = store.db

    def read(
        self,
        *,
        window_seconds: float,
        limit: int,
        bounds: Sequence[float],
        late_shown: int = 50,
    ) -> MetricsSnapshot:
        """Everything a scrape shows, read on one connection. ``bounds``: the histogram's
        upper bounds in seconds, ascending; ``limit``: the newest finished jobs whose
        durations are read, at most."""
        if window_seconds <= 0 or limit < 1:
            raise ValueError(f"window_seconds={window_seconds}, limit={limit}: both above 0")
        bounds = tuple(float(b) for b in bounds)

        def work(conn: Connection) -> MetricsSnapshot:
            now: datetime = conn.execute(select(db_now())).scalar_one()
            jobs, due, oldest = _pending(conn, now)
            running_by_node, schedules = _under_way(conn, jobs)
            schedules["active"] = schedules.get("active", 0) + jobs.pop(
                (SCHEDULES_QUEUE, JobStatus.PENDING.value), 0
            )
            schedules_late = due.pop(SCHEDULES_QUEUE, 0)
            oldest.pop(SCHEDULES_QUEUE, None)
            waits, runs, sampled = _durations(conn, window_seconds, limit, bounds)
            paused = _paused(conn, now)
            return MetricsSnapshot(
                read_at=now,
                jobs=jobs,
                due=due,
                oldest_due_age=oldest,
                dead_letters=_dead_letters(conn),
                paused=paused,
                nodes=_nodes(conn, now),
                running_by_node=running_by_node,
                resources=_resources(conn),
                schedules=schedules,
                schedules_late=schedules_late,
                late_schedules=_late_schedules(conn, now, late_shown),
                finished=_finished(conn, window_seconds),
                waits=waits,
                runs=runs,
                sampled=sampled,
            )

        result: MetricsSnapshot = self.db.run(work, "metrics were not read")
        return result


def _pending(
    conn: Connection, now: datetime
) -> tuple[dict[tuple[str, str], int], dict[str, int], dict[str, float]]:
    """Pending jobs per queue, those due now, and the oldest due one: through the two
    partial indexes of pending rows (PostgreSQL, SQLite), or the (status, resource, queue,
    ...) index (MySQL/MariaDB), without reading a row."""
    jobs: dict[tuple[str, str], int] = {}
    due: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for queue, count, due_now, first_due in conn.execute(_pending_statement()):
        key = (queue, JobStatus.PENDING.value)
        jobs[key] = jobs.get(key, 0) + int(count)
        due[queue] = due.get(queue, 0) + int(due_now or 0)
        if first_due is not None:
            age = max(0.0, (now - first_due).total_seconds())
            oldest[queue] = max(age, oldest.get(queue, 0.0))
    return jobs, due, oldest


# Each statement is built once (and SQLAlchemy compiles it once): a scrape repeats them.
@functools.cache
def _pending_statement() -> Any:
    is_due = job.c.scheduled_time <= db_now()
    halves = [
        select(
            job.c.queue,
            func.count(),
            func.sum(case((is_due, 1), else_=0)),
            func.min(case((is_due, job.c.scheduled_time), else_=None)),
        )
        .where(_status_is("PENDING"), resource)
        .group_by(job.c.queue)
        for resource in (job.c.resource.is_(None), job.c.resource.is_not(None))
    ]
    return union_all(*halves)


def _under_way(
    conn: Connection, jobs: dict[tuple[str, str], int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Running and waiting jobs per queue (into ``jobs``), running ones per node, and the
    schedules firing or paused: as many index entries as jobs are under way. Two statements,
    so that each reads an index alone where one holds its columns: (status, resource, queue,
    ...) on MySQL/MariaDB, (status, picked_by) on every database."""
    per_queue, per_node = _under_way_statements()
    schedules: dict[str, int] = {"active": 0, "paused": 0}
    for queue, status, count in conn.execute(per_queue):
        if queue == SCHEDULES_QUEUE:
            state = "paused" if status == JobStatus.PAUSED.value else "active"
            schedules[state] += int(count)
        elif status != JobStatus.PAUSED.value:
            jobs[(queue, status)] = jobs.get((queue, status), 0) + int(count)
    by_node = {str(node): int(count) for node, count in conn.execute(per_node)}
    return by_node, schedules


@functools.cache
def _under_way_statements() -> tuple[Any, Any]:
    per_queue = (
        select(job.c.queue, job.c.status, func.count())
        .where(_status_is(*_UNDER_WAY))
        .group_by(job.c.queue, job.c.status)
    )
    per_node = (
        select(job.c.picked_by, func.count())
        .where(_status_is("RUNNING"), job.c.picked_by.is_not(None))
        .group_by(job.c.picked_by)
    )
    return per_queue, per_node


def _dead_letters(conn: Connection) -> dict[str, int]:
    """Failed jobs per queue (the recurring masters never fail): on MySQL/MariaDB from the
    (status, resource, queue, ...) index alone; per task, each would be a row read."""
    stmt = select(job.c.queue, func.count()).where(_status_is("FAILED")).group_by(job.c.queue)
    return {queue: int(n) for queue, n in conn.execute(stmt)}


def _nodes(conn: Connection, now: datetime) -> list[NodeReading]:
    n = scheduler_node
    stmt = select(n.c.node_id, n.c.hostname, n.c.concurrency, n.c.heartbeat_ts)
    return [
        NodeReading(node_id, host, int(concurrency), max(0.0, (now - beat).total_seconds()))
        for node_id, host, concurrency, beat in conn.execute(stmt.order_by(n.c.node_id))
    ]


def _paused(conn: Connection, now: datetime) -> dict[str, float]:
    """Seconds since each paused queue was paused; none on tables of a version before
    pauses (the scrape's statements run each in a transaction of its own)."""
    pause = scheduler_queue_pause
    try:
        rows = conn.execute(select(pause.c.queue, pause.c.paused_at)).all()
    except DBAPIError as exc:
        if not is_missing_table(exc):
            raise
        return {}
    return {queue: max(0.0, (now - paused_at).total_seconds()) for queue, paused_at in rows}


def _resources(conn: Connection) -> dict[str, tuple[int | None, int]]:
    """Each resource's capacity and its permits held: a permit counts while its job runs
    under the claim that took it (as the claim counts them)."""
    permit = scheduler_resource_permit
    held = (
        select(permit.c.resource, func.count())
        .join(job, job.c.job_id == permit.c.job_id)
        .where(_status_is("RUNNING"), job.c.claim_token == permit.c.claim_token)
        .group_by(permit.c.resource)
    )
    found: dict[str, tuple[int | None, int]] = {
        name: (int(capacity), 0)
        for name, capacity in conn.execute(
            select(scheduler_resource.c.resource, scheduler_resource.c.capacity)
        )
    }
    for name, count in conn.execute(held):
        found[name] = (found.get(name, (None, 0))[0], int(count))
    return found


def _late_schedules(conn: Connection, now: datetime, shown: int) -> dict[str, float]:
    """Schedules whose fire time has passed and that no worker has fired yet."""
    stmt = (
        select(job.c.business_key, job.c.scheduled_time)
        .where(
            _status_is("PENDING"),
            job.c.resource.is_(None),
            job.c.queue == SCHEDULES_QUEUE,
            job.c.scheduled_time <= db_now(),
        )
        .order_by(job.c.scheduled_time)
        .limit(shown)
    )
    return {
        str(key): max(0.0, (now - due).total_seconds()) for key, due in conn.execute(stmt) if key
    }


def _finished(conn: Connection, window_seconds: float) -> dict[str, int]:
    """Jobs that ended within the window, per status: a range of the (status, finished_at)
    index, no row read."""
    stmt = (
        select(job.c.status, func.count())
        .where(_status_is(*RAN_TO_AN_END), job.c.finished_at >= db_now_minus(window_seconds))
        .group_by(job.c.status)
    )
    return {status: int(n) for status, n in conn.execute(stmt)}


def _durations(
    conn: Connection, window_seconds: float, limit: int, bounds: tuple[float, ...]
) -> tuple[dict[str, Durations], dict[tuple[str, str], Durations], int]:
    """Wait (due → start) and run (start → end) times of the newest ``limit`` jobs that ran
    and ended within the window, bucketed by the database: a row per (task, status) comes
    back. The start is ``started_at`` (``task_track_started``), else the claim's time."""
    waits: dict[str, list[float]] = {}
    runs: dict[tuple[str, str], Durations] = {}
    sampled = 0
    width = len(bounds)
    for row in conn.execute(_durations_statement(window_seconds, limit, bounds)):
        task, status, count, wait_sum, run_sum = row[:5]
        wait_at_most = [int(n or 0) for n in row[5 : 5 + width]]
        run_at_most = tuple(int(n or 0) for n in row[5 + width :])
        sampled += int(count)
        runs[(task, status)] = Durations(int(count), float(run_sum or 0), run_at_most)
        # One task's waits add up over its statuses.
        kept = waits.setdefault(task, [0.0, 0.0] + [0.0] * width)
        kept[0] += int(count)
        kept[1] += float(wait_sum or 0)
        for i, n in enumerate(wait_at_most):
            kept[2 + i] += n
    return (
        {
            task: Durations(int(v[0]), v[1], tuple(int(n) for n in v[2:]))
            for task, v in waits.items()
        },
        runs,
        sampled,
    )


@functools.cache
def _durations_statement(window_seconds: float, limit: int, bounds: tuple[float, ...]) -> Any:
    start = func.coalesce(job.c.started_at, job.c.claimed_at)
    # Per status, the newest first along the (status, finished_at) index, so that at most
    # ``limit`` rows of each are read however many the window holds; then the newest of them.
    newest = [
        select(
            job.c.task_name.label("task"),
            job.c.status.label("status"),
            job.c.finished_at.label("finished_at"),
            seconds_between(start, job.c.scheduled_time).label("wait"),
            seconds_between(job.c.finished_at, start).label("run"),
        )
        .where(
            _status_is(status),
            job.c.finished_at >= db_now_minus(window_seconds),
            job.c.claimed_at.is_not(None),
            JOBS_ONLY,
        )
        .order_by(job.c.finished_at.desc())
        .limit(limit)
        .subquery(f"newest_{i}")
        for i, status in enumerate(RAN_TO_AN_END)
    ]
    each = union_all(*(select(*n.c) for n in newest)).subquery("each_status")
    recent = select(*each.c).order_by(each.c.finished_at.desc()).limit(limit).subquery("recent")
    # A negative span (an ETA after the claim: clocks apart) counts as 0.
    wait = case((recent.c.wait > 0, recent.c.wait), else_=0.0)
    run = case((recent.c.run > 0, recent.c.run), else_=0.0)
    columns: list[Any] = [recent.c.task, recent.c.status, func.count(), func.sum(wait)]
    columns += [func.sum(run)]
    columns += [func.sum(case((wait <= b, 1), else_=0)) for b in bounds]
    columns += [func.sum(case((run <= b, 1), else_=0)) for b in bounds]
    return select(*columns).group_by(recent.c.task, recent.c.status)
