"""Result rows of jobs and groups."""

from __future__ import annotations

import contextlib
from typing import Any

from sqlalchemy import (
    and_,
    case,
    delete,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from celery_ratchet.domain.job import (
    JobStatus,
    ResultRecord,
    parse_status,
)
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import (
    db_now,
    db_now_minus,
)
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import (
    transaction,
)
from celery_ratchet.store.job_rows import (
    TERMINAL,
    as_bytes,
    job,
    listed_column,
)
from celery_ratchet.store.packets import refuse_oversized
from celery_ratchet.store.schema import (
    scheduler_group_result,
)


class Results:
    """Result rows of jobs and groups."""

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect

    # -- results ----------------------------------------------------------------------------

    def result(self, job_id: str) -> ResultRecord | None:
        stmt = select(
            job.c.job_id,
            job.c.task_name,
            job.c.status,
            job.c.attempts,
            job.c.queue,
            job.c.job_result,
            job.c.result_type,
            job.c.result_meta,
            job.c.last_error,
            job.c.error_traceback,
            listed_column(job.c.finished_at),
            job.c.picked_by,
            job.c.headers,
            job.c.payload,
            job.c.content_type,
            job.c.content_encoding,
        ).where(job.c.job_id == job_id)
        row = self.db.run(lambda conn: conn.execute(stmt).first(), "the result was not read")
        if row is None:
            return None
        return ResultRecord(
            **{
                **row._asdict(),
                "status": parse_status(row.status),
                "payload": as_bytes(row.payload),
            }
        )

    def forget(self, job_id: str) -> None:
        """Drop a finished job's row; an active job only loses its stored result."""

        def work(conn: Connection) -> None:
            deleted = conn.execute(
                delete(job).where(job.c.job_id == job_id, job.c.status.in_(TERMINAL))
            ).rowcount
            if not deleted:
                conn.execute(
                    update(job)
                    .where(job.c.job_id == job_id)
                    .values(job_result=None, result_type=None, result_meta=None)
                )

        self.db.run(work, "the result was not forgotten")

    def expire_results(self, older_than_seconds: float) -> int:
        """Clear stored return values of jobs finished longer ago than the given age."""
        stmt = (
            update(job)
            .where(
                job.c.status.in_(TERMINAL),
                job.c.finished_at < db_now_minus(older_than_seconds),
                job.c.job_result.is_not(None),
            )
            .values(job_result=None, result_meta=None)
        )
        return self.db.run(lambda conn: conn.execute(stmt).rowcount, "results were not expired")

    def save_group(self, group_id: str, result: str) -> None:
        g = scheduler_group_result

        def work(conn: Connection) -> None:
            with transaction(conn):
                conn.execute(delete(g).where(g.c.group_id == group_id))
                conn.execute(
                    insert(g).values(group_id=group_id, result=result, created_at=db_now())
                )

        self.db.run(work, "the group was not saved")

    def load_group(self, group_id: str) -> str | None:
        g = scheduler_group_result
        stmt = select(g.c.result).where(g.c.group_id == group_id)
        return self.db.run(lambda conn: conn.execute(stmt).scalar(), "the group was not read")

    def delete_group(self, group_id: str) -> None:
        g = scheduler_group_result
        stmt = delete(g).where(g.c.group_id == group_id)
        self.db.run(lambda conn: conn.execute(stmt), "the group was not deleted")

    def store_untracked_result(
        self,
        job_id: str,
        task_name: str,
        status: JobStatus,
        *,
        job_result: str | None = None,
        result_type: str | None = None,
        result_meta: str | None = None,
        error: str | None = None,
        traceback: str | None = None,
    ) -> None:
        """A result written without a claim (an eager run, a manual ``mark_as_*``).

        A finished row takes the new state; an active row keeps its state (its claim decides)
        but records the result; with no row, a finished row is inserted. An interim state
        (``EXTERNAL``: a task another process runs) changes only an ``EXTERNAL`` row or
        inserts one: a job of the store, running or finished, stays as it is.
        """
        result_values = {
            "job_result": job_result,
            "result_type": result_type,
            "result_meta": result_meta,
            "last_error": error,
            "error_traceback": traceback,
        }
        refuse_oversized(self.db.engine, result_values, f"the result of {job_id} was not stored")

        # A revoked job never ran, so it cannot have failed since: it stays REVOKED and keeps
        # the error (Celery writes a failed chain step's exception to the steps after it).
        new_status: Any = status.value
        if status is JobStatus.FAILED:
            new_status = case(
                (job.c.status == JobStatus.REVOKED.value, JobStatus.REVOKED.value),
                else_=status.value,
            )

        # An interim state changes only a row of its own kind: never a finished result (stock
        # Celery ignores a state that comes after SUCCESS), never a job of the store.
        replaces: Any = job.c.status.in_(
            [JobStatus.EXTERNAL.value] if status is JobStatus.EXTERNAL else TERMINAL
        )
        if status is not JobStatus.EXTERNAL:
            # A WAITING row no chain step releases: a replaced task's row waiting for its
            # group's chord body (store.wait_in_place), whose chord failed.
            replaces = or_(
                replaces,
                and_(job.c.status == JobStatus.WAITING.value, job.c.depends_on.is_(None)),
            )

        def work(conn: Connection) -> None:
            finished = conn.execute(
                update(job)
                .where(job.c.job_id == job_id, replaces)
                .values(status=new_status, finished_at=db_now(), **result_values)
            ).rowcount
            if finished:
                return
            if status is JobStatus.EXTERNAL:
                if conn.execute(select(job.c.job_id).where(job.c.job_id == job_id)).first():
                    return
            else:
                active = conn.execute(
                    update(job).where(job.c.job_id == job_id).values(**result_values)
                ).rowcount
                if active:
                    return
            # Inserted concurrently by another writer: that row stands.
            with contextlib.suppress(IntegrityError):
                conn.execute(
                    insert(job).values(
                        job_id=job_id,
                        task_name=task_name,
                        queue="",
                        status=status.value,
                        priority=0,
                        scheduled_time=db_now(),
                        created_at=db_now(),
                        finished_at=db_now(),
                        payload=b"",
                        content_type="",
                        content_encoding="",
                        headers="{}",
                        properties="{}",
                        **result_values,
                    )
                )

        self.db.run(work, "the result was not stored")
