"""What the end of a step writes beside its own row, in its transaction: the chain steps after
it cancelled (or restored by a retry), and its part of its batch (counted once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import String, func, insert, literal, null, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from celery_ratchet.domain.batch import (
    FAILED_STATES,
    BatchKind,
    BatchPart,
)
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.db_clock import (
    db_now,
)
from celery_ratchet.store.engine import (
    insert_ignoring_conflicts,
    savepoint,
)
from celery_ratchet.store.schema import (
    scheduler_batch,
    scheduler_batch_part,
    scheduler_job,
)

batch = scheduler_batch
part_table = scheduler_batch_part
job = scheduler_job


#: A failed step cancels at most this many levels of steps after it (chains are far shorter).
_MAX_CHAIN_DEPTH = 10_000


def cancel_downstream(conn: Connection, job_ids: str | Sequence[str], error: str | None) -> int:
    """Revoke the chain steps still waiting on these jobs, and the steps after those.

    Returns how many were revoked. The failed step's error goes with them, so their results
    raise it (Celery does the same for a failed chain).
    """
    ids = [job_ids] if isinstance(job_ids, str) else list(job_ids)
    values = {
        "status": JobStatus.REVOKED.value,
        "finished_at": db_now(),
        "last_error": func.coalesce(job.c.last_error, error),
    }
    return _walk_downstream(conn, ids, JobStatus.WAITING, values)


def restore_downstream(conn: Connection, job_ids: Sequence[str]) -> int:
    """A failed step is retried (from the dead-letter queue): the steps its failure revoked
    wait for it again. Returns how many."""
    values = {"status": JobStatus.WAITING.value, "finished_at": None, "last_error": None}
    return _walk_downstream(conn, list(job_ids), JobStatus.REVOKED, values)


def _walk_downstream(
    conn: Connection, frontier: list[str], status: JobStatus, values: dict[str, Any]
) -> int:
    """Change the chain steps in ``status`` that depend on ``frontier``, then those that
    depend on them, level by level; returns how many rows changed."""
    changed = 0
    for _ in range(_MAX_CHAIN_DEPTH):
        if not frontier:
            break
        found = [
            r.job_id
            for r in conn.execute(
                select(job.c.job_id).where(
                    job.c.depends_on.in_(frontier), job.c.status == status.value
                )
            )
        ]
        if found:
            changed += conn.execute(
                update(job)
                .where(job.c.job_id.in_(found), job.c.status == status.value)
                .values(**values)
            ).rowcount
        frontier = found
    return changed


def record_part(conn: Connection, part: BatchPart) -> bool:
    """Count a finished child once (a second report of the same child is ignored); False
    when it was counted already. Call inside a transaction: the part and the batch's
    counters change together."""
    # A savepoint, not an "ignore" insert: whether the row went in decides the counters,
    # and row counts of ignored inserts differ by driver (MySQL reports found rows).
    try:
        with savepoint(conn, "ratchet_part"):
            conn.execute(
                insert(part_table).values(
                    batch_id=part.batch_id,
                    job_id=part.job_id,
                    position=part.position,
                    state=part.state,
                    result=part.result,
                    finished_at=db_now(),
                )
            )
    except IntegrityError:
        return False
    conn.execute(
        update(batch)
        .where(batch.c.batch_id == part.batch_id)
        .values(done=batch.c.done + 1, failed=batch.c.failed + int(part.state in FAILED_STATES))
    )
    return True


#: The kinds of batch whose children are counted by their parts.
COUNTED_KINDS = [BatchKind.CHORD.value, BatchKind.BATCH.value, BatchKind.STREAM.value]


def record_ended_parts(conn: Connection, job_ids: Sequence[str], state: str) -> list[str]:
    """Jobs of chords or batches that ended without Celery reporting them (revoked before
    they ran, failed before Celery took them): count them, with their stored error, in a
    few statements whatever their number. Returns the batches touched."""
    if not job_ids:
        return []
    ended = (
        select(
            job.c.group_id,
            job.c.job_id,
            null(),
            literal(state, String),
            job.c.last_error,
            db_now(),
        )
        .join(batch, batch.c.batch_id == job.c.group_id)
        .where(job.c.job_id.in_(list(job_ids)), batch.c.kind.in_(COUNTED_KINDS))
    )
    touched = sorted({r.group_id for r in conn.execute(ended)})
    if not touched:
        return []
    columns = ["batch_id", "job_id", "position", "state", "result", "finished_at"]
    conn.execute(insert_ignoring_conflicts(conn.dialect, part_table).from_select(columns, ended))
    # Recounted rather than incremented: some of these may have been counted already. The
    # rows are locked first: a child counting itself concurrently (done + 1) then either
    # committed its part before the count below is read, or adds itself after it.
    conn.execute(select(batch.c.batch_id).where(batch.c.batch_id.in_(touched)).with_for_update())
    counted = select(func.count()).where(part_table.c.batch_id == batch.c.batch_id)
    failed = counted.where(part_table.c.state.in_(FAILED_STATES))
    conn.execute(
        update(batch)
        .where(batch.c.batch_id.in_(touched))
        .values(
            done=counted.correlate(batch).scalar_subquery(),
            failed=failed.correlate(batch).scalar_subquery(),
        )
    )
    return touched
