"""Revokes: pending jobs end, running ones are marked for their node."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import (
    select,
    update,
)
from sqlalchemy.engine import Connection

from celery_ratchet.domain.job import (
    REVOCATIONS_WAKEUP,
    JobStatus,
)
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import (
    db_now,
)
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import (
    transaction,
)
from celery_ratchet.store.job_rows import (
    REVOKE_ONLY,
    job,
)
from celery_ratchet.store.step_rows import (
    cancel_downstream,
    record_ended_parts,
)


class Revocations:
    """Revokes: pending jobs end, running ones are marked for their node."""

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect

    def revoke_pending(self, job_ids: Sequence[str], error: str) -> int:
        """Pending jobs become REVOKED and never run; returns how many were pending."""
        return self.request_revoke(job_ids, error)[0]

    def request_revoke(
        self,
        job_ids: Sequence[str],
        error: str,
        *,
        terminate_signal: str | None = None,
        batches: list[str] | None = None,
    ) -> tuple[int, int]:
        """Pending jobs become REVOKED; running ones are marked for their node, which drops
        them if not started yet and, given ``terminate_signal``, terminates them.
        Returns (pending revoked, running marked). Revoked children of chords and batches
        are counted as ended; ``batches`` receives the ids of those batches."""
        if not job_ids:
            return 0, 0
        ids = list(job_ids)
        not_started = [JobStatus.PENDING.value, JobStatus.WAITING.value]
        pending = (
            update(job)
            .where(job.c.job_id.in_(ids), job.c.status.in_(not_started))
            .values(status=JobStatus.REVOKED.value, finished_at=db_now(), last_error=error)
        )
        running = (
            update(job)
            .where(job.c.job_id.in_(ids), job.c.status == JobStatus.RUNNING.value)
            .values(revoke_requested=terminate_signal or REVOKE_ONLY)
        )

        def work(conn: Connection) -> tuple[int, int]:
            # One transaction, running rows first: a job moving from RUNNING back to PENDING
            # (a retry) in between is caught by one statement or the other.
            with transaction(conn):
                marked = conn.execute(running).rowcount
                not_run = [
                    r.job_id
                    for r in conn.execute(
                        select(job.c.job_id)
                        .where(job.c.job_id.in_(ids), job.c.status.in_(not_started))
                        .with_for_update()
                    )
                ]
                revoked = conn.execute(pending).rowcount if not_run else 0
                if marked:  # delivered at commit: the nodes check their revocations now
                    self.db.announce_in(conn, REVOCATIONS_WAKEUP)
                # A running step decides for itself: it may still succeed and go on.
                cancel_downstream(conn, not_run, error)
                touched = record_ended_parts(conn, not_run, "REVOKED")
                if batches is not None:
                    batches.extend(touched)
                return revoked, marked

        return self.db.run(work, "no job was revoked")

    def revocations(self, node_id: str) -> list[tuple[str, str, str]]:
        """(job id, claim token, request) of this node's running jobs asked to stop; the
        request is ``REVOKE`` or a signal name."""
        stmt = select(job.c.job_id, job.c.claim_token, job.c.revoke_requested).where(
            job.c.status == JobStatus.RUNNING.value,
            job.c.picked_by == node_id,
            job.c.revoke_requested.is_not(None),
        )
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "revocations were not read")
        return [(r.job_id, r.claim_token, r.revoke_requested) for r in rows]
