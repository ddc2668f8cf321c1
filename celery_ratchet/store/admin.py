"""What operators ask: the dead-letter queue, archiving, job logs, listings and counts."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import BindParameter

from celery_ratchet.domain.dlq_alert import AlertWindow
from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    JobSummary,
    NewJob,
    error_record,
)
from celery_ratchet.domain.schedule import MASTER_PREFIX
from celery_ratchet.store import dlq_alerts
from celery_ratchet.store.claim_sql import RETURNED, MalformedRow, to_claimed
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import (
    db_now,
    db_now_minus,
)
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import (
    savepoint,
    transaction,
)
from celery_ratchet.store.id_bounds import created_id_bounds
from celery_ratchet.store.job_rows import (
    CLEARED_CLAIM,
    CLEARED_RESULT,
    JOBS_ONLY,
    RAN_TO_AN_END,
    TERMINAL,
    check_fields,
    is_active_key_conflict,
    job,
    job_params,
    job_summary,
    listed_column,
    storable,
)
from celery_ratchet.store.row_writer import RowWriter
from celery_ratchet.store.schema import (
    scheduler_job,
    scheduler_job_archive,
    scheduler_job_log,
    scheduler_node,
)
from celery_ratchet.store.step_rows import (
    cancel_downstream,
    record_ended_parts,
    restore_downstream,
)

logger = logging.getLogger(__name__)

#: Purged jobs whose chains and batches are told, per statement.
_PURGE_CHUNK = 1000


class _NotEveryRow(Exception):
    """Rolls a requeue of a page back to its savepoint, to requeue it row by row."""


class Admin:
    """What operators ask: the dead-letter queue, archiving, job logs, listings and counts."""

    def __init__(self, db: Database, dialect: Dialect, rows: RowWriter) -> None:
        self.db = db
        self.dialect = dialect
        self.rows = rows

    def purge_pending(self, queues: Sequence[str]) -> int:
        """Delete the PENDING jobs of ``queues`` (``celery purge``, the dashboard's purge);
        returns how many. A recurring master is a schedule, not a job of its queue: never
        purged. What waited on a purged job goes with it: the chain steps after it are
        revoked, and its chord or batch counts it as revoked, so that neither waits for a
        job that is gone."""
        pending = and_(
            job.c.status == JobStatus.PENDING.value, job.c.queue.in_(list(queues)), JOBS_ONLY
        )
        waiting = job.alias("waiting")
        waited_on = select(waiting.c.depends_on).where(
            waiting.c.status == JobStatus.WAITING.value, waiting.c.depends_on.is_not(None)
        )
        awaited = (
            select(job.c.job_id)
            .where(pending, or_(job.c.group_id.is_not(None), job.c.job_id.in_(waited_on)))
            .with_for_update()
        )
        error = error_record("TaskRevokedError", ["purged with its queue"], "celery.exceptions")

        def work(conn: Connection) -> int:
            with transaction(conn):
                ids = list(conn.execute(awaited).scalars())
                for start in range(0, len(ids), _PURGE_CHUNK):
                    chunk = ids[start : start + _PURGE_CHUNK]
                    conn.execute(
                        update(job).where(job.c.job_id.in_(chunk)).values(last_error=error)
                    )
                    cancel_downstream(conn, chunk, error)
                    record_ended_parts(conn, chunk, "REVOKED")
                return int(conn.execute(delete(job).where(pending)).rowcount)

        purged: int = self.db.run(work, "no job was purged")
        return purged

    # -- the dead-letter queue: FAILED jobs ----------------------------------------------------

    def _failed(
        self, job_ids: Sequence[str] | None, task_name: str | None, queue: str | None
    ) -> Any:
        conditions = [job.c.status == JobStatus.FAILED.value]
        if job_ids is not None:
            conditions.append(job.c.job_id.in_(list(job_ids)))
        if task_name is not None:
            conditions.append(job.c.task_name == task_name)
        if queue is not None:
            conditions.append(job.c.queue == queue)
        return and_(*conditions)

    def retry_failed(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task_name: str | None = None,
        queue: str | None = None,
        rewrite_headers: Callable[[str], str] = lambda headers: headers,
    ) -> int:
        """Send FAILED jobs (all, or those named or matching) back to PENDING, due now, with
        their error cleared and attempts restarted at 0; ``rewrite_headers`` restarts the
        message's own retry count. Returns how many were requeued."""
        if job_ids is not None and not job_ids:
            return 0
        where = self._failed(job_ids, task_name, queue)
        requeue = (
            update(job)
            .where(job.c.job_id == bindparam("p_job_id"), job.c.status == JobStatus.FAILED.value)
            .values(
                status=JobStatus.PENDING.value,
                scheduled_time=db_now(),
                expires_at=None,
                attempts=0,
                claims=0,
                headers=bindparam("p_headers"),
                **CLEARED_CLAIM,
                **CLEARED_RESULT,
            )
        )
        page = (
            select(job.c.id, job.c.job_id, job.c.headers)
            .where(where, job.c.id > bindparam("after"))
            .order_by(job.c.id)
            .limit(500)
        )

        def requeue_page(conn: Connection, after: int) -> tuple[int, int | None]:
            rows = conn.execute(page, {"after": after}).all()
            if not rows:
                return 0, None
            params = [{"p_job_id": r.job_id, "p_headers": rewrite_headers(r.headers)} for r in rows]
            with transaction(conn):
                changed, requeued = self._requeue_each(conn, requeue, params)
                # The chain steps their failures revoked wait for them again; those of a
                # job left FAILED stay revoked.
                restore_downstream(conn, requeued)
                self.db.announce_queues_of(conn, requeued)
            return changed, rows[-1].id

        done, after = 0, 0
        while True:
            changed, last = self.db.run(
                functools.partial(requeue_page, after=after), "no job was requeued"
            )
            if last is None:
                return done
            done, after = done + changed, last

    def _requeue_each(
        self, conn: Connection, requeue: Any, params: list[dict[str, Any]]
    ) -> tuple[int, list[str]]:
        """Requeue FAILED rows in one statement; when one's business key is held by an active
        job meanwhile, one by one, leaving those FAILED (two active jobs of a key may not be).
        Returns how many were requeued, and the ids of those not left FAILED for their key."""
        try:
            with savepoint(conn, "ratchet_requeue"):
                if int(conn.execute(requeue, params).rowcount) == len(params):
                    return len(params), [p["p_job_id"] for p in params]
                # One was no longer FAILED (purged or retried since the page was read):
                # one by one, to know which were requeued.
                raise _NotEveryRow
        except _NotEveryRow:
            pass
        except IntegrityError as exc:
            if not is_active_key_conflict(exc):
                raise
        changed = 0
        requeued: list[str] = []
        for p in params:
            try:
                with savepoint(conn, "ratchet_requeue"):
                    if conn.execute(requeue, p).rowcount:
                        changed += 1
                        requeued.append(p["p_job_id"])
            except IntegrityError as exc:
                if not is_active_key_conflict(exc):
                    raise
                logger.warning(
                    "ratchet: failed job %s left in the dead-letter queue: another active job "
                    "holds its business key",
                    p["p_job_id"],
                )
        return changed, requeued

    def purge_failed(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task_name: str | None = None,
        queue: str | None = None,
    ) -> int:
        """Delete FAILED jobs (all, or those named or matching); returns how many."""
        if job_ids is not None and not job_ids:
            return 0
        stmt = delete(job).where(self._failed(job_ids, task_name, queue))
        return self.db.run(lambda conn: conn.execute(stmt).rowcount, "the DLQ was not purged")

    # -- archiving and job logs --------------------------------------------------------------

    def archive_finished(
        self,
        older_than_days: float,
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Move finished jobs (finished longer ago than ``older_than_days``) to
        ``scheduler_job_archive``, ``batch_size`` rows per transaction. Returns how many."""
        cutoff = db_now_minus(older_than_days * 86400)
        columns = [c.name for c in scheduler_job.columns]
        picked = (
            select(job.c.id)
            .where(job.c.status.in_(TERMINAL), job.c.finished_at < cutoff)
            .order_by(job.c.id)
            .limit(batch_size)
        )
        ids: BindParameter[Any] = bindparam("ids", expanding=True)
        copy = scheduler_job_archive.insert().from_select(
            [*columns, "archived_at"],
            select(*[job.c[c] for c in columns], db_now()).where(job.c.id.in_(ids)),
        )
        # Re-checked on delete: a finished job whose id was reused in between stays.
        remove = delete(job).where(job.c.id.in_(ids), job.c.status.in_(TERMINAL))

        def one_batch(conn: Connection) -> int:
            with transaction(conn):
                chosen = list(conn.execute(picked).scalars())
                if not chosen:
                    return 0
                conn.execute(copy, {"ids": chosen})
                conn.execute(remove, {"ids": chosen})
                return len(chosen)

        moved = 0
        while True:
            done = self.db.run(one_batch, "finished jobs were not archived")
            moved += done
            if progress is not None and done:
                progress(moved)
            if done < batch_size:
                return moved

    def add_log(self, job_id: str, level: str, message: str) -> None:
        stmt = insert(scheduler_job_log).values(
            job_id=job_id, logged_at=db_now(), level=level[:16], message=storable(message) or ""
        )
        self.db.run(lambda conn: conn.execute(stmt), "the job log line was not written")

    def job_log(self, job_id: str, limit: int = 1000) -> list[tuple[datetime, str, str]]:
        lg = scheduler_job_log
        stmt = (
            select(lg.c.logged_at, lg.c.level, lg.c.message)
            .where(lg.c.job_id == job_id)
            .order_by(lg.c.id)
            .limit(limit)
        )
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "the job log was not read")
        return [(r.logged_at, r.level, r.message) for r in rows]

    def purge_logs(self, older_than_days: float) -> int:
        lg = scheduler_job_log
        stmt = delete(lg).where(lg.c.logged_at < db_now_minus(older_than_days * 86400))
        return self.db.run(lambda conn: conn.execute(stmt).rowcount, "job logs were not purged")

    # -- inspection -------------------------------------------------------------------------

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
        """Jobs, newest first; recurring masters (schedules) only with ``include_schedules``.
        ``before_job_id``: the next page, the jobs older than that one (a keyset: no OFFSET,
        so a page deep in a million rows costs what the first one does).
        ``task_contains``: task names holding this text, in any case; ``ticks=False``
        leaves out the occurrences of recurring schedules; ``created_since`` /
        ``created_until``: jobs created in [since, until)."""
        conditions: list[Any] = []
        if before_job_id is not None:
            cursor = select(job.c.id).where(job.c.job_id == before_job_id).scalar_subquery()
            conditions.append(job.c.id < cursor)
        if not include_schedules:
            conditions.append(JOBS_ONLY)
        if task_contains is not None:
            conditions.append(job.c.task_name.icontains(task_contains, autoescape=True))
        if not ticks:
            conditions.append(~job.c.job_id.startswith(MASTER_PREFIX, autoescape=True))
        if created_since is not None:
            conditions.append(job.c.created_at >= created_since)
        if created_until is not None:
            conditions.append(job.c.created_at < created_until)
        if tag is not None:
            # A tag is matched as written: % and _ in it are no wildcards.
            conditions.append(job.c.tags.contains(f",{tag},", autoescape=True))
        if business_key is not None:
            conditions.append(job.c.business_key == business_key)
        if status is not None:
            conditions.append(job.c.status == status.value)
        if task_name is not None:
            conditions.append(job.c.task_name == task_name)
        if queue is not None:
            conditions.append(job.c.queue == queue)
        stmt = (
            select(
                job.c.job_id,
                job.c.task_name,
                job.c.queue,
                job.c.status,
                job.c.priority,
                job.c.attempts,
                listed_column(job.c.scheduled_time),
                listed_column(job.c.created_at),
                listed_column(job.c.finished_at),
                job.c.picked_by,
                job.c.last_error,
                job.c.business_key,
                job.c.tags,
                listed_column(job.c.claimed_at),
                listed_column(job.c.started_at),
                job.c.job_type,
            )
            .where(and_(*conditions))
            .order_by(job.c.id.desc())
            .limit(limit)
        )

        def work(conn: Connection) -> list[Any]:
            bounds = created_id_bounds(conn, created_since, created_until)
            return list(conn.execute(stmt.where(*bounds)).all())

        rows = self.db.run(work, "jobs were not listed")
        return [job_summary(r) for r in rows]

    # -- dead-letter alerts -------------------------------------------------------------------

    def due_alert_windows(self, interval_seconds: float) -> list[str]:
        """Task names whose alert window has closed (by the database clock)."""
        return self.db.run(
            lambda conn: dlq_alerts.due_windows(conn, interval_seconds),
            "alert windows were not read",
        )

    def close_alert_window(
        self,
        task_name: str,
        interval_seconds: float,
        alert_job: Callable[[AlertWindow, list[str], datetime], NewJob],
    ) -> NewJob | None:
        """Close the task name's window if it is due and still open, inserting the alert job
        ``alert_job`` makes from it in the same transaction: once cluster-wide per window.
        None when there was nothing to close (not due, or closed by another node)."""

        def work(conn: Connection) -> NewJob | None:
            made: list[NewJob] = []

            def insert_alert(window: AlertWindow, job_ids: list[str], now: datetime) -> str:
                new = alert_job(window, job_ids, now)
                check_fields(new)
                conn.execute(self.rows.insert, job_params(new))
                made.append(new)
                return new.job_id

            with transaction(conn):
                closed = dlq_alerts.close_window(conn, task_name, interval_seconds, insert_alert)
            return made[0] if closed is not None else None

        return self.db.run(work, "the dead-letter alert was not sent")

    def alert_states(self, task_names: Sequence[str]) -> dict[str, dlq_alerts.AlertState]:
        return self.db.run(
            lambda conn: dlq_alerts.alert_states(conn, task_names), "alert states were not read"
        )

    def scheduled_jobs(self, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        """Pending jobs of ``queues`` due later than now by the database clock, soonest
        first, at most ``limit``; decoded as a claim decodes them, with no claim (token
        ``""``). A row that would not decode is left out: its claim will fail it."""
        if not queues:
            return []
        columns = [job.c[name.strip()] for name in RETURNED.split(",")]
        stmt = (
            select(*columns)
            .where(
                job.c.status == JobStatus.PENDING.value,
                job.c.queue.in_(list(queues)),
                job.c.scheduled_time > db_now(),
            )
            .order_by(job.c.scheduled_time, job.c.id)
            .limit(limit)
        )
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "scheduled jobs were not read")
        listed = []
        for row in rows:
            with contextlib.suppress(MalformedRow):
                listed.append(to_claimed(row, ""))
        return listed

    def list_nodes(self) -> list[dict[str, Any]]:
        n = scheduler_node
        running = (
            select(func.count())
            .where(job.c.picked_by == n.c.node_id, job.c.status == JobStatus.RUNNING.value)
            .scalar_subquery()
        )
        stamps = ("started_at", "heartbeat_ts")
        columns = [listed_column(c) if c.name in stamps else c for c in n.c]
        stmt = select(*columns, running.label("running")).order_by(n.c.started_at)
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "nodes were not listed")
        return [r._asdict() for r in rows]

    def queue_stats(self) -> dict[str, Any]:
        """Counts per (queue, status), jobs finished in the last minute, and per queue the
        age in seconds of its oldest due pending job, by the database clock. Recurring
        masters are schedules (``schedules``), not counted here."""
        by_queue = (
            select(job.c.queue, job.c.status, func.count())
            .where(JOBS_ONLY)
            .group_by(job.c.queue, job.c.status)
        )
        finished = select(func.count()).where(
            job.c.status.in_(RAN_TO_AN_END), job.c.finished_at >= db_now_minus(60)
        )
        oldest = (
            select(job.c.queue, func.min(job.c.scheduled_time).label("due"))
            .where(
                JOBS_ONLY,
                job.c.status == JobStatus.PENDING.value,
                job.c.scheduled_time <= db_now(),
            )
            .group_by(job.c.queue)
        )
        clock = select(db_now())

        def work(conn: Connection) -> dict[str, Any]:
            now = conn.execute(clock).scalar_one()
            return {
                "counts": [
                    {"queue": q, "status": st, "count": n} for q, st, n in conn.execute(by_queue)
                ],
                "finished_last_minute": conn.execute(finished).scalar_one(),
                "oldest_pending_seconds": {
                    q: round((now - due).total_seconds(), 3) for q, due in conn.execute(oldest)
                },
            }

        return self.db.run(work, "statistics were not read")

    def count_by_status(self) -> dict[str, int]:
        """Jobs per status; recurring masters are schedules, not jobs, and are not counted."""
        stmt = select(job.c.status, func.count()).where(JOBS_ONLY).group_by(job.c.status)
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "jobs were not counted")
        return {status: count for status, count in rows}
