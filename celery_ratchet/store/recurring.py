"""Recurring masters: their upsert, firing and status."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from celery_ratchet.domain.job import (
    SCHEDULES_QUEUE,
    ClaimedJob,
    JobStatus,
    JobType,
    NewJob,
)
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import (
    db_now,
)
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import (
    transaction,
)
from celery_ratchet.store.enqueue import Enqueue
from celery_ratchet.store.job_rows import (
    ACTIVE,
    CLEARED_CLAIM,
    DEFINITION,
    MASTER_IDS_PER_UPDATE,
    ClaimLost,
    claim_held,
    job,
    job_params,
    new_job_values,
)
from celery_ratchet.store.row_writer import RowWriter
from celery_ratchet.store.schema import (
    UTCDateTime,
)


class Masters:
    """Recurring masters: their upsert, firing and status. ``rows``: the job INSERT;
    ``enqueue``: the finished row a fired occurrence may reuse."""

    def __init__(self, db: Database, dialect: Dialect, rows: RowWriter, enqueue: Enqueue) -> None:
        self.db = db
        self.dialect = dialect
        self.rows = rows
        self.enqueue = enqueue

    # -- recurring masters ------------------------------------------------------------------

    def upsert_master(self, master: NewJob) -> str:
        """Register a recurring master; its job id (from the business key) makes it unique.
        Registering again updates it in place: 'created', 'updated', or 'revived' (a
        cancelled master registered again)."""
        params = job_params(master)
        spec_changed = job.c.schedule_spec != bindparam("p_schedule_spec")
        redefine = (
            update(job)
            .where(job.c.job_id == master.job_id, job.c.status.in_(ACTIVE))
            .values(
                **{k: v for k, v in new_job_values().items() if k in DEFINITION},
                # A new schedule takes effect now, not after the old one's next fire.
                scheduled_time=case(
                    (
                        and_(spec_changed, job.c.status == JobStatus.PENDING.value),
                        bindparam("p_due", type_=UTCDateTime()),
                    ),
                    else_=job.c.scheduled_time,
                ),
            )
        )

        def work(conn: Connection) -> str:
            try:
                conn.execute(self.rows.insert, params)
                return "created"
            except IntegrityError:
                pass
            # The insert notifies by itself; an update in place tells the workers too, whose
            # schedule checks sleep until the next due time they know of.
            if conn.execute(redefine, params).rowcount == 1:
                self.db.announce_in(conn, SCHEDULES_QUEUE)
                return "updated"
            if conn.execute(self.enqueue.reuse_finished, params).rowcount == 1:
                self.db.announce_in(conn, SCHEDULES_QUEUE)
                return "revived"
            conn.execute(self.rows.insert, params)  # deleted in between: insert it after all
            return "created"

        return self.db.run(work, "the recurring job was not registered")

    def fire_master(
        self, master: ClaimedJob, occurrences: Sequence[NewJob], next_due: datetime | None
    ) -> bool:
        """Create a claimed master's occurrences and set its next due time, atomically.

        Occurrence ids are unique per (master, fire time): one that exists already is left
        alone, so a master fired twice for the same time (after a crash) creates nothing
        twice. False, with nothing written, when the master's claim was lost.
        """
        params = [job_params(o) for o in occurrences]
        resume = (
            update(job)
            .where(*claim_held(master.job_id, master.token))
            .values(
                status=(JobStatus.PENDING if next_due else JobStatus.SUCCEEDED).value,
                scheduled_time=next_due or master.scheduled_time,
                finished_at=None if next_due else db_now(),
                **CLEARED_CLAIM,
            )
        )

        def work(conn: Connection) -> bool:
            with transaction(conn):
                if params:
                    self.rows.insert_many(conn, params, ignore_existing=True)
                if conn.execute(resume).rowcount != 1:
                    raise ClaimLost
            return True

        try:
            return self.db.run(work, "the recurring job did not fire")
        except ClaimLost:
            return False

    def fire_masters(
        self, firings: Sequence[tuple[ClaimedJob, Sequence[NewJob], datetime | None]]
    ) -> list[bool]:
        """:meth:`fire_master` for many claimed masters in one transaction: every
        occurrence in one insert, the masters' next due times in one UPDATE per distinct
        (claim, next due time). When any master's claim was lost, nothing of the batch is
        kept and each is fired on its own instead, so that the others still fire; the
        result says, per master, whether it fired."""
        if len(firings) <= 1:
            return [self.fire_master(*f) for f in firings]
        params = [job_params(o) for _, occurrences, _ in firings for o in occurrences]
        groups: dict[tuple[str, datetime | None], list[str]] = {}
        for master, _, next_due in firings:
            groups.setdefault((master.token, next_due), []).append(master.job_id)
        statements = []
        for (token, next_due), job_ids in groups.items():
            for start in range(0, len(job_ids), MASTER_IDS_PER_UPDATE):
                chunk = job_ids[start : start + MASTER_IDS_PER_UPDATE]
                values: dict[str, Any] = dict(CLEARED_CLAIM)
                if next_due is None:  # no fire time left: the schedule is over
                    values.update(status=JobStatus.SUCCEEDED.value, finished_at=db_now())
                else:
                    values.update(status=JobStatus.PENDING.value, scheduled_time=next_due)
                held = and_(
                    job.c.job_id.in_(chunk),
                    job.c.claim_token == token,
                    job.c.status == JobStatus.RUNNING.value,
                )
                statements.append((update(job).where(held).values(**values), len(chunk)))

        def work(conn: Connection) -> bool:
            with transaction(conn):
                if params:
                    self.rows.insert_many(conn, params, ignore_existing=True)
                for statement, expected in statements:
                    if conn.execute(statement).rowcount != expected:
                        raise ClaimLost
            return True

        try:
            self.db.run(work, "the recurring jobs did not fire")
        except ClaimLost:
            return [self.fire_master(*f) for f in firings]
        return [True] * len(firings)

    def set_master_status(
        self, job_id: str, status: JobStatus, *, due: datetime | None = None
    ) -> bool:
        """Pause (PENDING → PAUSED), resume (PAUSED → PENDING at ``due``) or cancel (any
        active → REVOKED) a recurring master; False when it was not in a state to."""
        allowed = {
            JobStatus.PAUSED: [JobStatus.PENDING.value],
            JobStatus.PENDING: [JobStatus.PAUSED.value],
            JobStatus.REVOKED: list(ACTIVE),
        }[status]
        values: dict[str, Any] = {"status": status.value}
        if status is JobStatus.PENDING and due is not None:
            values["scheduled_time"] = due
        if status is JobStatus.REVOKED:
            values["finished_at"] = db_now()
        stmt = (
            update(job)
            .where(
                job.c.job_id == job_id,
                job.c.job_type == JobType.RECURRING.value,
                job.c.status.in_(allowed),
            )
            .values(**values)
        )

        def work(conn: Connection) -> bool:
            changed = conn.execute(stmt).rowcount == 1
            if changed and status is JobStatus.PENDING:  # resumed: due again
                self.db.announce_in(conn, SCHEDULES_QUEUE)
            return changed

        return self.db.run(work, "the recurring job was not changed")

    def run_master_now(self, job_id: str) -> bool:
        """Make a PENDING recurring master due now (by the database clock), when its next
        fire time is later; False when it was not in that state. Its firing plans the one
        fire time now and resumes at the next one of its schedule, the time it had."""
        now = db_now()
        stmt = (
            update(job)
            .where(
                job.c.job_id == job_id,
                job.c.job_type == JobType.RECURRING.value,
                job.c.status == JobStatus.PENDING.value,
                job.c.scheduled_time > now,
            )
            .values(scheduled_time=now)
        )

        def work(conn: Connection) -> bool:
            with transaction(conn):
                changed = conn.execute(stmt).rowcount == 1
                if changed:  # the nodes' schedule checks sleep until the due time they knew
                    self.db.announce_in(conn, SCHEDULES_QUEUE)
            return changed

        return self.db.run(work, "the recurring job was not made due")

    def list_masters(self, *, include_cancelled: bool = False) -> list[dict[str, Any]]:
        conditions = [job.c.job_type == JobType.RECURRING.value]
        if not include_cancelled:
            conditions.append(job.c.status.in_(ACTIVE))
        stmt = (
            select(
                job.c.job_id,
                job.c.business_key,
                job.c.task_name,
                job.c.status,
                job.c.priority,
                job.c.scheduled_time,
                job.c.schedule_spec,
            )
            .where(*conditions)
            .order_by(job.c.business_key)
        )
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "schedules were not listed")
        return [r._asdict() for r in rows]
