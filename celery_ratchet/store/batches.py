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
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import and_, case, delete, func, select, update
from sqlalchemy.engine import Connection

from celery_ratchet.domain.batch import (
    FAILED_STATES,
    BatchKind,
    BatchPart,
    BatchState,
    BatchSummary,
    NewBatch,
    expected_children,
)
from celery_ratchet.domain.job import TERMINAL_STATUSES, JobStatus
from celery_ratchet.store.engine import db_now, db_now_minus, insert_ignoring_conflicts, transaction
from celery_ratchet.store.schema import (
    scheduler_batch,
    scheduler_batch_part,
    scheduler_job,
    scheduler_workflow_condition,
)

logger = logging.getLogger(__name__)

batch = scheduler_batch
part_table = scheduler_batch_part
job = scheduler_job
condition = scheduler_workflow_condition

#: A failed step cancels at most this many levels of steps after it (chains are far shorter).
_MAX_CHAIN_DEPTH = 10_000
_FINISHED = [s.value for s in TERMINAL_STATUSES]


def cancel_downstream(conn: Connection, job_ids: str | Sequence[str], error: str | None) -> int:
    """Revoke the chain steps still waiting on these jobs, and the steps after those.

    Returns how many were revoked. The failed step's error goes with them, so their results
    raise it (Celery does the same for a failed chain).
    """
    frontier = [job_ids] if isinstance(job_ids, str) else list(job_ids)
    revoked = 0
    for _ in range(_MAX_CHAIN_DEPTH):
        if not frontier:
            break
        waiting = [
            r.job_id
            for r in conn.execute(
                select(job.c.job_id).where(
                    job.c.depends_on.in_(frontier), job.c.status == JobStatus.WAITING.value
                )
            )
        ]
        if not waiting:
            break
        revoked += conn.execute(
            update(job)
            .where(job.c.job_id.in_(waiting), job.c.status == JobStatus.WAITING.value)
            .values(
                status=JobStatus.REVOKED.value,
                finished_at=db_now(),
                last_error=func.coalesce(job.c.last_error, error),
            )
        ).rowcount
        frontier = waiting
    return revoked


def record_part(conn: Connection, part: BatchPart) -> None:
    """Count a finished child once (a second report of the same child is ignored)."""
    conn.execute(
        insert_ignoring_conflicts(conn.dialect, part_table).values(
            batch_id=part.batch_id,
            job_id=part.job_id,
            position=part.position,
            state=part.state,
            result=part.result,
            finished_at=db_now(),
        )
    )


@dataclass(frozen=True)
class BatchRecord:
    """A batch row with its signatures, for whoever completes it."""

    batch_id: str
    kind: BatchKind
    name: str | None
    state: BatchState
    total: int | None
    added: int
    on_success: str | None
    on_failure: str | None
    on_progress: str | None

    @property
    def expected(self) -> int | None:
        return expected_children(self.total, self.added)


@dataclass(frozen=True)
class Progress:
    done: int
    failed: int


class BatchStore:
    """Batch operations on a :class:`~celery_ratchet.store.jobstore.JobStore`'s database."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _run(self, work: Any, what: str) -> Any:
        return self.store._run(work, what)

    # -- batches ----------------------------------------------------------------------------

    def open(self, new: NewBatch, *, restart: bool = False) -> None:
        """Create a batch row; an existing one is kept, unless ``restart`` (a frozen chord
        applied again: a new run under the same id) clears it and its parts first."""
        values = {
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

        def work(conn: Connection) -> None:
            if not restart:
                conn.execute(insert_ignoring_conflicts(conn.dialect, batch).values(**values))
                return
            with transaction(conn):
                conn.execute(delete(part_table).where(part_table.c.batch_id == new.batch_id))
                conn.execute(delete(batch).where(batch.c.batch_id == new.batch_id))
                conn.execute(batch.insert().values(**values))

        self._run(work, "the batch was not created")

    def open_groups(self, group_ids: Sequence[str], conn: Connection | None = None) -> None:
        """Note Celery groups being sent (their children are counted from the job rows);
        on ``conn`` when the jobs are written in a transaction of their own."""
        rows = [
            {"batch_id": g, "kind": BatchKind.GROUP.value, "state": BatchState.OPEN.value,
             "added": 0, "created_at": datetime.now(timezone.utc)}
            for g in dict.fromkeys(group_ids)
        ]  # fmt: skip
        if not rows:
            return
        if conn is not None:
            conn.execute(insert_ignoring_conflicts(conn.dialect, batch), rows)
            return
        self._run(
            lambda c: c.execute(insert_ignoring_conflicts(c.dialect, batch), rows),
            "the group was not recorded",
        )

    def set_total(self, batch_id: str, total: int) -> None:
        """The number of children, known once the last of them is being sent."""
        stmt = update(batch).where(batch.c.batch_id == batch_id).values(total=total)
        self._run(lambda conn: conn.execute(stmt), "the batch size was not stored")

    def add_children(self, batch_id: str, count: int = 1) -> None:
        """A running child added children (``replace()`` in a chord): wait for them too."""
        stmt = update(batch).where(batch.c.batch_id == batch_id).values(added=batch.c.added + count)
        self._run(lambda conn: conn.execute(stmt), "the batch was not extended")

    def record_part(self, part: BatchPart) -> Progress:
        """Count a finished child (once) and return the batch's progress."""

        def work(conn: Connection) -> Progress:
            record_part(conn, part)
            return self._progress(conn, part.batch_id)

        result: Progress = self._run(work, "the batch child was not counted")
        return result

    def _progress(self, conn: Connection, batch_id: str) -> Progress:
        failed = case((part_table.c.state.in_(FAILED_STATES), 1), else_=0)
        row = conn.execute(
            select(func.count(), func.coalesce(func.sum(failed), 0)).where(
                part_table.c.batch_id == batch_id
            )
        ).one()
        return Progress(done=int(row[0]), failed=int(row[1]))

    def get(self, batch_id: str) -> BatchRecord | None:
        row = self._run(
            lambda conn: conn.execute(select(batch).where(batch.c.batch_id == batch_id)).first(),
            "the batch was not read",
        )
        return None if row is None else _record(row)

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
        rows = self._run(lambda conn: conn.execute(stmt).all(), "the batch was not read")
        return [BatchPart(r.batch_id, r.job_id, r.position, r.state, r.result) for r in rows]

    @contextmanager
    def finishing(self, batch_id: str, state: BatchState) -> Iterator[Connection | None]:
        """Complete a batch: yields a connection in a transaction when this caller won the
        compare-and-swap (write what follows the batch on it; it commits with the swap), or
        ``None`` when the batch was complete already."""
        swap = (
            update(batch)
            .where(batch.c.batch_id == batch_id, batch.c.state == BatchState.OPEN.value)
            .values(state=state.value, finished_at=db_now())
        )
        self.store.ensure_schema()
        with self.store.engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                # One writer at a time: a transaction held open here would block the
                # follow-up writes made on other connections of this process.
                yield conn if conn.execute(swap).rowcount == 1 else None
                return
            conn = conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                yield conn if conn.execute(swap).rowcount == 1 else None

    def unfinished_complete(self, older_than_seconds: float, limit: int = 100) -> list[str]:
        """Open batches all of whose children finished a while ago: their completion was cut
        short (the node died between a last child's outcome and the completion)."""
        counted = (
            select(func.count())
            .where(part_table.c.batch_id == batch.c.batch_id)
            .correlate(batch)
            .scalar_subquery()
        )
        stmt = (
            select(batch.c.batch_id)
            .where(
                batch.c.state == BatchState.OPEN.value,
                batch.c.total.is_not(None),
                batch.c.created_at < db_now_minus(older_than_seconds),
                counted >= batch.c.total + batch.c.added,
            )
            .order_by(batch.c.created_at)
            .limit(limit)
        )
        rows = self._run(lambda conn: conn.execute(stmt).all(), "batches were not read")
        return [r.batch_id for r in rows]

    def summaries(
        self, *, state: BatchState | None = None, limit: int = 50, batch_id: str | None = None
    ) -> list[BatchSummary]:
        """Newest batches first, with their progress."""
        stmt = select(batch).order_by(batch.c.created_at.desc(), batch.c.batch_id).limit(limit)
        if batch_id is not None:
            stmt = stmt.where(batch.c.batch_id == batch_id)

        def work(conn: Connection) -> list[BatchSummary]:
            rows = conn.execute(stmt).all()
            out = [self._summary(conn, row) for row in rows]
            return [s for s in out if state is None or s.state is state]

        result: list[BatchSummary] = self._run(work, "batches were not read")
        return result

    def _summary(self, conn: Connection, row: Any) -> BatchSummary:
        kind = BatchKind(row.kind)
        total = expected_children(row.total, row.added)
        state = BatchState(row.state)
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
            if total and done >= total:
                state = BatchState.FAILED if bad else BatchState.SUCCEEDED
        else:
            progress = self._progress(conn, row.batch_id)
            done, bad = progress.done, progress.failed
        return BatchSummary(
            batch_id=row.batch_id,
            kind=kind,
            name=row.name,
            state=state,
            total=total,
            done=done,
            failed=bad,
            created_at=row.created_at,
            finished_at=row.finished_at,
        )

    # -- workflow conditions ----------------------------------------------------------------

    def add_conditions(self, parent_id: str, rows: Sequence[dict[str, Any]]) -> None:
        """Store a workflow's branches: dicts of kind, name, predicate, waits_for, branch."""
        values = [
            {"parent_id": parent_id, "position": i, "state": "WAITING", **r}
            for i, r in enumerate(rows)
        ]
        self._run(
            lambda conn: conn.execute(insert_ignoring_conflicts(conn.dialect, condition), values),
            "the workflow was not stored",
        )

    def conditions(self, parent_id: str) -> list[Any]:
        stmt = (
            select(condition)
            .where(condition.c.parent_id == parent_id)
            .order_by(condition.c.position)
        )
        rows: list[Any] = self._run(lambda conn: conn.execute(stmt).all(), "not read")
        return rows

    @contextmanager
    def deciding(self, parent_id: str) -> Iterator[Connection | None]:
        """Take a workflow's undecided branches for deciding: yields a connection in a
        transaction (send the fired branches on it, then :func:`decide` each) or ``None``
        when they were decided already."""
        self.store.ensure_schema()
        lock = (
            select(condition.c.position)
            .where(condition.c.parent_id == parent_id, condition.c.state == "WAITING")
            .with_for_update()
        )
        with self.store.engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                undecided = conn.execute(lock).first() is not None
                yield conn if undecided else None
                return
            conn = conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                undecided = conn.execute(lock).first() is not None
                yield conn if undecided else None


def decide(conn: Connection, parent_id: str, position: int, fired: bool) -> bool:
    """Mark one branch FIRED or SKIPPED; False when it was decided already."""
    stmt = (
        update(condition)
        .where(
            and_(
                condition.c.parent_id == parent_id,
                condition.c.position == position,
                condition.c.state == "WAITING",
            )
        )
        .values(state="FIRED" if fired else "SKIPPED", decided_at=db_now())
    )
    return bool(conn.execute(stmt).rowcount == 1)


def _record(row: Any) -> BatchRecord:
    return BatchRecord(
        batch_id=row.batch_id,
        kind=BatchKind(row.kind),
        name=row.name,
        state=BatchState(row.state),
        total=row.total,
        added=row.added,
        on_success=row.on_success,
        on_failure=row.on_failure,
        on_progress=row.on_progress,
    )
