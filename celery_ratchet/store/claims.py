"""Claiming due jobs: a batch from a node's queues, or as many as a resource's free permits
allow; a claim whose reply was lost adopted by its token; claimed rows that cannot be run
failed at once."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence

from sqlalchemy import bindparam, delete, func, insert, or_, select, text, update
from sqlalchemy.engine import Connection

from celery_ratchet.domain.job import (
    SCHEDULES_QUEUE,
    ClaimedJob,
    JobStatus,
    Settlement,
    error_record,
)
from celery_ratchet.errors import RatchetError
from celery_ratchet.store.claim_sql import (
    RETURNED,
    Claimed,
    ClaimShape,
    MalformedRow,
    claim_params,
    decode,
)
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import db_now, db_now_minus
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import transaction
from celery_ratchet.store.job_rows import best_first, insert_ignoring_duplicates, job
from celery_ratchet.store.schema import (
    KeptDateTime,
    scheduler_resource,
    scheduler_resource_permit,
)
from celery_ratchet.store.settle import Settle

logger = logging.getLogger(__name__)


class Claims:
    """Claiming due jobs, each claim under a fresh token that every write of its execution
    must show. ``settler``: fails the claimed rows that cannot be run;
    ``priority_boost_minutes``: aging, a waiting job gains one priority level per this many
    minutes (0: never)."""

    def __init__(
        self,
        db: Database,
        dialect: Dialect,
        settler: Settle,
        *,
        priority_boost_minutes: float,
    ) -> None:
        self.db = db
        self.dialect = dialect
        self.settler = settler
        self.priority_boost_minutes = priority_boost_minutes
        self._claim = dialect.claim_strategy()
        #: The rows a claim under ``:token`` holds (a claim whose reply was lost, adopted).
        self.select_claimed = text(
            f"SELECT {RETURNED} FROM scheduler_job "
            "WHERE claim_token = :token AND status = 'RUNNING'"
        ).columns(scheduled_time=KeptDateTime())
        permit = scheduler_resource_permit
        self._known_resources: set[str] = set()
        self._count_permits = (
            select(func.count())
            .select_from(permit)
            .where(permit.c.resource == bindparam("resource"))
        )
        still_running = (
            select(job.c.id)
            .where(
                job.c.job_id == permit.c.job_id,
                job.c.claim_token == permit.c.claim_token,
                job.c.status == JobStatus.RUNNING.value,
            )
            .correlate(permit)
        )
        self._drop_stale_permits = delete(permit).where(
            permit.c.resource == bindparam("resource"), ~still_running.exists()
        )

    # -- claim ------------------------------------------------------------------------------

    def claim(self, node_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs of ``queues`` that need no resource permit."""
        if limit <= 0 or not queues:
            return []
        shape = ClaimShape(len(queues), False, self._boost_for(queues))
        token = uuid.uuid4().hex
        params = claim_params(node_id, token, queues, limit)

        def claim(conn: Connection) -> Claimed:
            if not self._claim.needs_transaction:
                return self._claim.claim(conn, shape, params)
            with transaction(conn):
                return self._claim.claim(conn, shape, params)

        return self.claiming(token, claim)

    def claim_for_resource(
        self, node_id: str, queues: Sequence[str], resource: str, capacity: int, limit: int
    ) -> list[ClaimedJob]:
        """Claim due jobs needing ``resource``, as many as its free permits allow (at most
        ``capacity`` such jobs RUNNING cluster-wide), each with its permit, atomically."""
        if limit <= 0 or capacity <= 0 or not queues:
            return []
        shape = ClaimShape(len(queues), True, self._boost_for(queues))
        token = uuid.uuid4().hex
        self._ensure_resource_row(resource, capacity)

        def claim(conn: Connection) -> Claimed:
            with transaction(conn):
                self._lock_resource(conn, resource, capacity)
                conn.execute(self._drop_stale_permits, {"resource": resource})
                held = conn.execute(self._count_permits, {"resource": resource}).scalar_one()
                free = min(capacity - held, limit)
                if free <= 0:
                    return Claimed([], [])
                params = claim_params(node_id, token, queues, free, resource)
                claimed = self._claim.claim(conn, shape, params)
                if claimed.jobs:  # a malformed row is failed at once: it needs no permit
                    permits = [
                        {"resource": resource, "job_id": j.job_id, "node_id": node_id}
                        for j in claimed.jobs
                    ]
                    conn.execute(
                        insert(scheduler_resource_permit).values(
                            acquired_at=db_now(), claim_token=token
                        ),
                        permits,
                    )
                return claimed

        return self.claiming(token, claim)

    def _boost_for(self, queues: Sequence[str]) -> float:
        # Recurring masters fire strictly by due time; aging would only cost them.
        return 0.0 if list(queues) == [SCHEDULES_QUEUE] else self.priority_boost_minutes

    def claiming(
        self, token: str, claim: Callable[[Connection], Claimed], what: str = "no job was claimed"
    ) -> list[ClaimedJob]:
        tries = 0

        def work(conn: Connection) -> Claimed:
            nonlocal tries
            tries += 1
            if tries > 1:
                # The connection broke after an earlier try: that claim may have committed
                # with its reply lost. Take its rows over rather than leave them RUNNING.
                adopted = self._claimed_with(conn, token)
                if adopted.jobs or adopted.malformed:
                    return adopted
            return claim(conn)

        claimed = self.db.run(work, what)
        if claimed.malformed:
            self._fail_malformed(token, claimed.malformed)
        jobs = sorted(claimed.jobs, key=lambda j: j.id)
        return best_first(jobs, self.priority_boost_minutes)

    def _fail_malformed(self, token: str, rows: Sequence[MalformedRow]) -> None:
        """Fail claimed rows that cannot be run, with the reason; never their arguments.
        Were this write lost, the rows stay claimed until orphan recovery, then fail again."""
        settlements = []
        for row in rows:
            reason = f"job row {row.id} cannot be run: {row.reason}; it was failed unrun"
            logger.error("ratchet: job %s: %s", row.job_id, reason)
            error = error_record("MalformedJob", [reason], "celery_ratchet.errors")
            settlements.append(Settlement(row.job_id, token, JobStatus.FAILED, error=error))
        try:
            self.settler.settle(settlements)
        except RatchetError as exc:
            logger.warning("ratchet: malformed jobs were not failed yet: %s", exc)

    def _ensure_resource_row(self, resource: str, capacity: int) -> None:
        if resource in self._known_resources:
            return
        r = scheduler_resource
        stmt = insert_ignoring_duplicates(
            self.db.engine.dialect, r, {"resource": resource, "capacity": capacity}
        )
        self.db.run(lambda conn: conn.execute(stmt), "the resource was not registered")
        self._known_resources.add(resource)

    def _lock_resource(self, conn: Connection, resource: str, capacity: int) -> None:
        """Serialise the claims of one resource: the row lock (SQLite: the write lock taken
        by BEGIN IMMEDIATE) is held until the permits are written."""
        r = scheduler_resource
        lock = (
            update(r).where(r.c.resource == resource).values(capacity=capacity, updated_at=db_now())
        )
        if conn.execute(lock).rowcount == 0:  # the row was deleted by hand: make it again
            values = {"resource": resource, "capacity": capacity}
            conn.execute(insert_ignoring_duplicates(conn.dialect, r, values))
            conn.execute(lock)

    def _claimed_with(self, conn: Connection, token: str) -> Claimed:
        rows = conn.execute(self.select_claimed, {"token": token}).all()
        return decode(rows, token)

    def running_claims(self, node_id: str, *, older_than_seconds: float) -> list[tuple[str, str]]:
        """(job id, claim token) of every row ``node_id`` has held RUNNING for a while."""
        stmt = select(job.c.job_id, job.c.claim_token).where(
            job.c.status == JobStatus.RUNNING.value,
            job.c.picked_by == node_id,
            or_(job.c.claimed_at.is_(None), job.c.claimed_at < db_now_minus(older_than_seconds)),
        )
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "claims were not listed")
        return [(r.job_id, r.claim_token) for r in rows]

    def next_due_in(self, queues: Sequence[str], node_id: str | None = None) -> float | None:
        """Seconds (by the database's clock) until the earliest pending job of ``queues`` is
        due: negative when one is overdue, None when none is pending. With ``node_id``, a
        job handed to another node (which that node alone claims) is not counted."""
        if not queues:
            return None
        stmt = select(func.min(job.c.scheduled_time), db_now()).where(
            job.c.status == JobStatus.PENDING.value, job.c.queue.in_(list(queues))
        )
        if node_id is not None:
            stmt = stmt.where(or_(job.c.picked_by.is_(None), job.c.picked_by == node_id))
        due, now = self.db.run(lambda conn: conn.execute(stmt).one(), "no due time was read")
        return None if due is None else (due - now).total_seconds()
