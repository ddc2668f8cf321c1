"""A batch's progress reports: one per whole percent reached, each written once, run one at
a time and in order.

The batch row holds two whole percents: up to where its reports are written
(``progress_written``) and up to where they have run (``progress_ended``). Whoever finds
that the count of finished children reached new percents writes their reports under the
row's lock and moves ``progress_written``: of the children ending at the same instant, one
writes each report. Reports are written held (due at the far sentinel no claim reaches) and
released (due now) one at a time, once the report before it ended: its end moves
``progress_ended`` (the report's link says so), or its row is found ended (it ended without
running its links: revoked, refused, failed by orphan recovery). A report's id derives from
its percent, and a row whose id exists is left as it is: a report is never written twice,
nor run again by a second write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.engine import Connection

from celery_ratchet.domain.batch import (
    PERCENT,
    BatchKind,
    BatchState,
    next_progress_report,
    progress_reports_due,
)
from celery_ratchet.domain.job import TERMINAL_STATUSES, JobStatus, NewJob
from celery_ratchet.store.batch_rows import BatchRecord, BatchRows, batch
from celery_ratchet.store.db_clock import db_now, db_now_minus
from celery_ratchet.store.engine import transaction
from celery_ratchet.store.job_rows import NOTIFY_CHANNEL, WAITING_DUE, job, job_params

#: Makes the report jobs of these (percent, done at it) of the batch, in order.
MakeReports = Callable[[BatchRecord, Sequence[tuple[int, int]]], Sequence[NewJob]]
#: The job id of the batch's report at a percent.
ReportId = Callable[[BatchRecord, int], str]

#: Batches whose reports lag behind are looked for among those made this recently.
PROGRESS_SWEPT_SECONDS = 7 * 86400

_ENDED = frozenset(s.value for s in TERMINAL_STATUSES)


@dataclass(frozen=True)
class ProgressWrites:
    """What a write of progress did: the report jobs written, the queues of those released."""

    written: Sequence[NewJob] = ()
    released: Sequence[str] = field(default_factory=list)


class ProgressReports:
    """Progress reports of batches built with ``celery_ratchet.batch()``."""

    def __init__(self, rows: BatchRows) -> None:
        self.rows = rows

    def write_progress(
        self, batch_id: str, make: MakeReports, report_id: ReportId
    ) -> ProgressWrites:
        """Write the reports of the percents the batch's count reached since its last report
        (``make`` builds them), held, and release the next report due: in one transaction
        under the batch row's lock."""

        def work(conn: Connection) -> ProgressWrites:
            with transaction(conn):
                record = self._locked(conn, batch_id)
                if record is None or not record.on_progress or not record.expected:
                    return ProgressWrites()
                due = progress_reports_due(record.progress_written, record.done, record.expected)
                written: Sequence[NewJob] = ()
                if due:
                    written = make(record, due)
                    held = [job_params(replace(new, due=WAITING_DUE)) for new in written]
                    self.rows.rows.insert_many(conn, held, ignore_existing=True)
                    reached = due[-1][0]
                    conn.execute(
                        update(batch)
                        .where(batch.c.batch_id == batch_id)
                        .values(progress_written=reached)
                    )
                    record = replace(record, progress_written=reached)
                return ProgressWrites(written, self._release_next(conn, record, report_id))

        result: ProgressWrites = self.rows.run(work, "the batch's progress was not reported")
        return result

    def progress_ended(self, batch_id: str, percent: int, report_id: ReportId) -> list[str]:
        """The batch's report at ``percent`` ended: release the report after it. Returns the
        queues of the reports released."""

        def work(conn: Connection) -> list[str]:
            with transaction(conn):
                record = self._locked(conn, batch_id)
                if record is None:
                    return []
                if record.progress_ended < percent <= record.progress_written:
                    record = replace(record, progress_ended=percent)
                    self._set_ended(conn, batch_id, percent)
                return self._release_next(conn, record, report_id)

        result: list[str] = self.rows.run(work, "the batch's next progress report was not released")
        return result

    def progress_behind(self, limit: int = 100) -> list[str]:
        """Recent batches whose progress reports lag: one written whose predecessor ended
        without saying so, or a finished batch whose last reports were never written."""
        stmt = (
            select(batch.c.batch_id)
            .where(
                batch.c.state.in_([s.value for s in BatchState]),
                batch.c.kind.in_([BatchKind.BATCH.value, BatchKind.STREAM.value]),
                batch.c.created_at >= db_now_minus(PROGRESS_SWEPT_SECONDS),
                batch.c.on_progress.is_not(None),
                or_(
                    batch.c.progress_ended < batch.c.progress_written,
                    and_(
                        batch.c.state != BatchState.OPEN.value,
                        batch.c.total.is_not(None),
                        batch.c.progress_written < PERCENT,
                    ),
                ),
            )
            .order_by(batch.c.created_at)
            .limit(limit)
        )
        rows = self.rows.run(lambda conn: conn.execute(stmt).all(), "batches were not read")
        return [r.batch_id for r in rows]

    def _locked(self, conn: Connection, batch_id: str) -> BatchRecord | None:
        """The batch as it is, its row locked until the transaction ends (SQLite: the
        database's write lock), so that one writer at a time decides its reports."""
        conn.execute(
            update(batch)
            .where(batch.c.batch_id == batch_id)
            .values(progress_written=batch.c.progress_written)
        )
        return self.rows.get_record(conn, batch_id)

    def _set_ended(self, conn: Connection, batch_id: str, percent: int) -> None:
        conn.execute(
            update(batch).where(batch.c.batch_id == batch_id).values(progress_ended=percent)
        )

    def _release_next(
        self, conn: Connection, record: BatchRecord, report_id: ReportId
    ) -> list[str]:
        """Release the first report written whose predecessor ended, passing over reports
        that ended without saying so (or are gone); nothing while one is due or running."""
        total = record.expected or 0
        ended = record.progress_ended
        released: list[str] = []
        while True:
            percent = next_progress_report(ended, total)
            if percent is None or percent > record.progress_written:
                break
            found = conn.execute(
                select(job.c.status, job.c.queue).where(job.c.job_id == report_id(record, percent))
            ).first()
            if found is None or found.status in _ENDED:
                ended = percent
                continue
            held = found.status == JobStatus.PENDING.value
            if held and conn.execute(self._release(report_id(record, percent))).rowcount == 1:
                released.append(found.queue)
            break
        if ended != record.progress_ended:
            self._set_ended(conn, record.batch_id, ended)
        return released

    def _release(self, job_id: str) -> Any:
        """A held report, due now (PostgreSQL: idle workers are told, at the commit)."""
        stmt = (
            update(job)
            .where(
                job.c.job_id == job_id,
                job.c.status == JobStatus.PENDING.value,
                job.c.scheduled_time > db_now(),
            )
            .values(scheduled_time=db_now())
        )
        if self.rows.db.notify:
            stmt = stmt.returning(func.pg_notify(NOTIFY_CHANNEL, job.c.queue))
        return stmt
