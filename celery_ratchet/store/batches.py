"""Batches (groups, chords, ``celery_ratchet.batch()``), chain steps and workflow conditions
in the job store.

A batch completes exactly once: a compare-and-swap of its ``state`` (OPEN → SUCCEEDED or
FAILED) in the transaction that also writes what follows it. Children are counted by their
parts, written in the transaction of each child's own outcome, so a child run twice (taken
over from a dead node) counts once, and a node dying between the two writes loses nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.engine import Connection

from celery_ratchet.domain.batch import (
    FAILED_STATES,
    BatchKind,
    BatchPart,
    BatchState,
    BatchSummary,
    NewBatch,
    expected_children,
    parse_known,
)
from celery_ratchet.domain.job import TERMINAL_STATUSES, JobStatus
from celery_ratchet.store.batch_progress import ProgressReports
from celery_ratchet.store.batch_rows import BatchRecord, BatchRows, Progress
from celery_ratchet.store.batch_streams import Streams
from celery_ratchet.store.db_clock import (
    db_now,
    db_now_minus,
)
from celery_ratchet.store.db_errors import in_callers_transaction
from celery_ratchet.store.delegation import delegated
from celery_ratchet.store.engine import (
    insert_ignoring_conflicts,
    transaction,
)
from celery_ratchet.store.schema import (
    scheduler_batch,
    scheduler_batch_part,
    scheduler_job,
    scheduler_workflow_condition,
)
from celery_ratchet.store.step_rows import (
    COUNTED_KINDS,
    record_part,
)
from celery_ratchet.store.units import Unit, connection_of, is_callers
from celery_ratchet.store.workflow_conditions import Conditions

if TYPE_CHECKING:
    from celery_ratchet.store.jobstore import JobStore

logger = logging.getLogger(__name__)

batch = scheduler_batch
part_table = scheduler_batch_part
job = scheduler_job
condition = scheduler_workflow_condition

_FINISHED = [s.value for s in TERMINAL_STATUSES]


class BatchStore:
    """Batch operations on a :class:`~celery_ratchet.store.jobstore.JobStore`'s database:
    batch rows here; streams, workflow conditions and progress reports in parts of their
    own, over the same :class:`BatchRows`."""

    def __init__(self, store: JobStore) -> None:
        self.rows = BatchRows(store)
        self.dialect = self.rows.dialect
        self.streams = Streams(self.rows)
        self.workflow = Conditions(self.rows)
        self.reports = ProgressReports(self.rows)

    # Streams (batch_streams.py)
    write_chunk = delegated("streams", Streams.write_chunk)
    renew_lease = delegated("streams", Streams.renew_lease)
    end_stream = delegated("streams", Streams.end_stream)
    abandoned_streams = delegated("streams", Streams.abandoned_streams)

    # Conditions (workflow_conditions.py)
    add_conditions = delegated("workflow", Conditions.add_conditions)
    conditions = delegated("workflow", Conditions.conditions)
    deciding = delegated("workflow", Conditions.deciding)
    decide = delegated("workflow", Conditions.decide)

    # ProgressReports (batch_progress.py)
    write_progress = delegated("reports", ProgressReports.write_progress)
    progress_ended = delegated("reports", ProgressReports.progress_ended)
    progress_behind = delegated("reports", ProgressReports.progress_behind)

    # -- batches ----------------------------------------------------------------------------

    def open(
        self,
        new: NewBatch,
        *,
        restart: bool = False,
        unit: Unit | None = None,
        lease_seconds: float | None = None,
    ) -> None:
        """Create a batch row; an existing one is kept, unless ``restart`` (a frozen chord
        applied again: a new run under the same id) clears it and its parts first.
        ``lease_seconds``: a streaming batch, held by its producer for that long."""
        values: dict[str, Any] = {
            "batch_id": new.batch_id,
            "kind": new.kind.value,
            "name": new.name,
            "state": BatchState.OPEN.value,
            "total": new.total,
            "added": 0,
            "on_success": new.on_success,
            "on_failure": new.on_failure,
            "on_progress": new.on_progress,
            "created_at": datetime.now(timezone.utc),
        }
        if lease_seconds is not None:
            values["lease_until"] = db_now_minus(-lease_seconds)

        def work(c: Connection) -> None:
            if restart:
                c.execute(delete(part_table).where(part_table.c.batch_id == new.batch_id))
                c.execute(delete(batch).where(batch.c.batch_id == new.batch_id))
            c.execute(insert_ignoring_conflicts(c.dialect, batch).values(**values))

        if restart and unit is None:
            self.rows.run(lambda c: _in_transaction(c, work), "the batch was not created")
            return
        self.rows.write(unit, work, "the batch was not created")

    def open_groups(self, group_ids: Sequence[str], unit: Unit | None = None) -> None:
        """Note Celery groups being sent (their children are counted from the job rows);
        in ``unit`` when the jobs are written in the caller's transaction."""
        rows = [
            {"batch_id": g, "kind": BatchKind.GROUP.value, "state": BatchState.OPEN.value,
             "added": 0, "created_at": datetime.now(timezone.utc)}
            for g in dict.fromkeys(group_ids)
        ]  # fmt: skip
        if not rows:
            return
        self.rows.write(
            unit,
            lambda c: c.execute(insert_ignoring_conflicts(c.dialect, batch), rows),
            "the group was not recorded",
        )

    def discard_unsent(self, batch_ids: Sequence[str], unit: Unit | None = None) -> int:
        """Chords whose header the send that opened them could not write (refused: a held
        business key, an invalid job): their rows go, so that none stays open waiting for
        children that never come. One with a child row, a finished part or a count of
        either is kept all the same. Returns how many went."""
        if not batch_ids:
            return 0
        has_child = select(job.c.id).where(job.c.group_id == batch.c.batch_id).exists()
        has_part = select(part_table.c.batch_id).where(part_table.c.batch_id == batch.c.batch_id)
        stmt = delete(batch).where(
            batch.c.batch_id.in_(list(dict.fromkeys(batch_ids))),
            batch.c.kind == BatchKind.CHORD.value,
            batch.c.state == BatchState.OPEN.value,
            batch.c.done == 0,
            batch.c.added == 0,
            ~has_child,
            ~has_part.exists(),
        )
        discarded: int = self.rows.write(
            unit, lambda c: c.execute(stmt).rowcount, "the unsent batch was not discarded"
        )
        return discarded

    def set_total(self, batch_id: str, total: int, unit: Unit | None = None) -> None:
        """The number of children, known once the last of them is being sent."""
        stmt = update(batch).where(batch.c.batch_id == batch_id).values(total=total)
        self.rows.write(unit, lambda c: c.execute(stmt), "the batch size was not stored")

    def add_children(self, batch_id: str, count: int = 1, unit: Unit | None = None) -> None:
        """A running child added children (``replace()`` in a chord): wait for them too."""
        stmt = update(batch).where(batch.c.batch_id == batch_id).values(added=batch.c.added + count)
        self.rows.write(unit, lambda c: c.execute(stmt), "the batch was not extended")

    def failed_children(self, batch_id: str, limit: int) -> list[str]:
        """Ids of up to ``limit`` failed children, the first to fail first."""
        stmt = (
            select(part_table.c.job_id)
            .where(part_table.c.batch_id == batch_id, part_table.c.state.in_(FAILED_STATES))
            .order_by(part_table.c.finished_at, part_table.c.job_id)
            .limit(limit)
        )
        rows = self.rows.run(lambda conn: conn.execute(stmt).all(), "the batch was not read")
        return [r.job_id for r in rows]

    def record_part(self, part: BatchPart) -> BatchRecord | None:
        """Count a finished child (once) and return its batch as it is now."""

        def work(conn: Connection) -> BatchRecord | None:
            with transaction(conn):
                record_part(conn, part)
            return self.rows.get_record(conn, part.batch_id)

        result: BatchRecord | None = self.rows.run(work, "the batch child was not counted")
        return result

    def progress(self, batch_id: str) -> Progress:
        record = self.get(batch_id)
        return Progress(0, 0) if record is None else record.progress

    def get(self, batch_id: str, unit: Unit | None = None) -> BatchRecord | None:
        """The batch, or None; read in ``unit`` (a caller's transaction) when given."""
        if unit is not None:
            conn = connection_of(unit)
            with in_callers_transaction(conn, "the batch was not read", callers=is_callers(unit)):
                return self.rows.get_record(conn, batch_id)
        found: BatchRecord | None = self.rows.run(
            lambda c: self.rows.get_record(c, batch_id), "the batch was not read"
        )
        return found

    def parts(self, batch_id: str) -> list[BatchPart]:
        """Finished children in batch order (by position, then by when they finished)."""
        stmt = (
            select(part_table)
            .where(part_table.c.batch_id == batch_id)
            .order_by(
                case((part_table.c.position.is_(None), 1), else_=0),
                part_table.c.position,
                part_table.c.finished_at,
            )
        )
        rows = self.rows.run(lambda conn: conn.execute(stmt).all(), "the batch was not read")
        return [BatchPart(r.batch_id, r.job_id, r.position, r.state, r.result) for r in rows]

    @contextmanager
    def finishing(
        self, batch_id: str, state: BatchState, *, abandoned: bool = False
    ) -> Iterator[Unit | None]:
        """Complete a batch: yields a unit of work when this caller won the compare-and-swap
        (send what follows the batch in it; it commits with the swap), or ``None`` when the
        batch was complete already. ``abandoned``: only a streaming batch
        still unended whose lease ran out (its producer may have just ended it)."""
        swap = (
            update(batch)
            .where(batch.c.batch_id == batch_id, batch.c.state == BatchState.OPEN.value)
            .values(state=state.value, finished_at=db_now())
        )
        if abandoned:
            swap = swap.where(batch.c.total.is_(None), batch.c.lease_until < db_now())
        reopen = (
            update(batch)
            .where(batch.c.batch_id == batch_id)
            .values(state=BatchState.OPEN.value, finished_at=None)
        )
        with self.rows.unit_of_work() as conn:
            if conn.execute(swap).rowcount != 1:
                yield None
                return
            try:
                yield Unit(conn, store_owned=True)
            except BaseException:
                if self.dialect.single_writer:  # committed already: undo by hand
                    conn.execute(reopen)
                raise

    def unfinished_complete(self, older_than_seconds: float, limit: int = 100) -> list[str]:
        """Open batches all of whose children finished a while ago: their completion was cut
        short (the node died between a last child's outcome and the completion)."""
        stmt = (
            select(batch.c.batch_id)
            .where(
                batch.c.state == BatchState.OPEN.value,
                batch.c.kind.in_(COUNTED_KINDS),
                batch.c.total.is_not(None),
                batch.c.created_at < db_now_minus(older_than_seconds),
                batch.c.done >= batch.c.total + batch.c.added,
            )
            .order_by(batch.c.created_at)
            .limit(limit)
        )
        rows = self.rows.run(lambda conn: conn.execute(stmt).all(), "batches were not read")
        return [r.batch_id for r in rows]

    def summaries(
        self, *, state: BatchState | None = None, limit: int = 50, batch_id: str | None = None
    ) -> list[BatchSummary]:
        """Newest batches first, with their progress."""
        stmt = select(batch).order_by(batch.c.created_at.desc(), batch.c.batch_id).limit(limit)
        if batch_id is not None:
            stmt = stmt.where(batch.c.batch_id == batch_id)
        if state is not None:
            stmt = stmt.where(batch.c.state == state.value)

        def work(conn: Connection) -> list[BatchSummary]:
            if state is not None:  # groups are closed when found complete: do that first
                self._close_groups(conn)
            return [self._summary(conn, row) for row in conn.execute(stmt).all()]

        result: list[BatchSummary] = self.rows.run(work, "batches were not read")
        return result

    def _summary(self, conn: Connection, row: Any) -> BatchSummary:
        kind: BatchKind | str = parse_known(BatchKind, row.kind)
        total = expected_children(row.total, row.added)
        state: BatchState | str = parse_known(BatchState, row.state)
        finished_at = row.finished_at
        if kind is BatchKind.GROUP:
            # A plain group's children report no parts: count their rows.
            finished = case((job.c.status.in_(_FINISHED), 1), else_=0)
            failed = case(
                (job.c.status.in_([JobStatus.FAILED.value, JobStatus.REVOKED.value]), 1),
                else_=0,
            )
            counts = conn.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(finished), 0),
                    func.coalesce(func.sum(failed), 0),
                ).where(job.c.group_id == row.batch_id)
            ).one()
            total, done, bad = int(counts[0]), int(counts[1]), int(counts[2])
            if total and done >= total and state is BatchState.OPEN:
                state = BatchState.FAILED if bad else BatchState.SUCCEEDED
                conn.execute(
                    update(batch)
                    .where(batch.c.batch_id == row.batch_id, batch.c.state == "OPEN")
                    .values(state=state.value, done=done, failed=bad, finished_at=db_now())
                )
                finished_at = conn.execute(
                    select(batch.c.finished_at).where(batch.c.batch_id == row.batch_id)
                ).scalar()
        else:
            done, bad = row.done, row.failed
        return BatchSummary(
            batch_id=row.batch_id,
            kind=kind,
            name=row.name,
            state=state,
            total=total,
            done=done,
            failed=bad,
            created_at=row.created_at,
            finished_at=finished_at,
            written=row.written,
        )

    def _close_groups(self, conn: Connection, limit: int = 1000) -> None:
        """Mark open Celery groups whose children all finished as finished."""
        open_groups = conn.execute(
            select(batch)
            .where(batch.c.state == BatchState.OPEN.value, batch.c.kind == BatchKind.GROUP.value)
            .order_by(batch.c.created_at)
            .limit(limit)
        ).all()
        for row in open_groups:
            self._summary(conn, row)

    def prune(self, older_than_days: float) -> int:
        """Delete finished batches (with their parts) and workflow conditions older than the
        job retention, and close the groups that finished meanwhile (the archiver)."""
        seconds = older_than_days * 86400

        def work(conn: Connection) -> int:
            self._close_groups(conn)
            old = (
                select(batch.c.batch_id)
                .where(
                    batch.c.state != BatchState.OPEN.value,
                    batch.c.finished_at < db_now_minus(seconds),
                )
                .limit(1000)
            )
            ids = [r.batch_id for r in conn.execute(old)]
            if ids:
                with transaction(conn):
                    conn.execute(delete(part_table).where(part_table.c.batch_id.in_(ids)))
                    conn.execute(delete(batch).where(batch.c.batch_id.in_(ids)))
            conn.execute(
                delete(condition).where(
                    condition.c.state != "WAITING",
                    condition.c.decided_at < db_now_minus(seconds),
                )
            )
            return len(ids)

        pruned: int = self.rows.run(work, "batches were not pruned")
        return pruned


def _in_transaction(conn: Connection, work: Any) -> Any:
    with transaction(conn):
        return work(conn)
