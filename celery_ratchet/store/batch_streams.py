"""Streaming batches in the job store: chunks of children written as they are produced,
under a lease the producer renews.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, select, update
from sqlalchemy.engine import Connection

from celery_ratchet.domain.batch import (
    BatchKind,
    BatchState,
)
from celery_ratchet.domain.job import NewJob
from celery_ratchet.errors import StreamAbandoned
from celery_ratchet.store.batch_rows import BatchRecord, BatchRows
from celery_ratchet.store.db_clock import (
    db_now,
    db_now_minus,
)
from celery_ratchet.store.schema import (
    scheduler_batch,
)

batch = scheduler_batch


class Streams:
    """Streaming batches: see :mod:`celery_ratchet.celery.canvas.streams`."""

    def __init__(self, rows: BatchRows) -> None:
        self.rows = rows

    def write_chunk(
        self,
        batch_id: str,
        jobs: Sequence[NewJob],
        waiting: Sequence[NewJob],
        written: int,
        lease_seconds: float,
    ) -> None:
        """Insert a chunk of a streaming batch's children, count them (``written``: the
        children written once this chunk is in) and renew the producer's lease, in one
        transaction. :class:`StreamAbandoned` (and nothing written) when the batch is no
        longer open."""

        def count_and_renew(conn: Connection) -> None:
            if conn.execute(self._renewal(batch_id, lease_seconds, written)).rowcount != 1:
                raise StreamAbandoned(batch_id, lease_seconds)

        self.rows.enqueuer.enqueue_with(
            jobs, waiting, count_and_renew, "the batch's children were not enqueued"
        )

    def renew_lease(self, batch_id: str, lease_seconds: float) -> None:
        """The producer is alive but its chunk is not full yet: hold the batch longer."""
        stmt = self._renewal(batch_id, lease_seconds)
        if self.rows.run(lambda c: c.execute(stmt).rowcount, "the lease was not renewed") != 1:
            raise StreamAbandoned(batch_id, lease_seconds)

    def _renewal(self, batch_id: str, lease_seconds: float, written: int | None = None) -> Any:
        values: dict[str, Any] = {"lease_until": db_now_minus(-lease_seconds)}
        if written is not None:
            # The highest count wins: a chunk written again after a lost reply counts once.
            values["written"] = case((batch.c.written < written, written), else_=batch.c.written)
        return (
            update(batch)
            .where(
                batch.c.batch_id == batch_id,
                batch.c.state == BatchState.OPEN.value,
                batch.c.total.is_(None),
            )
            .values(**values)
        )

    def end_stream(self, batch_id: str, total: int) -> BatchRecord:
        """The stream ended with ``total`` children: from now on the batch completes when
        they all have; its lease is released. :class:`StreamAbandoned` when it was failed
        meanwhile."""
        stmt = (
            update(batch)
            .where(
                batch.c.batch_id == batch_id,
                batch.c.state == BatchState.OPEN.value,
                batch.c.total.is_(None),
            )
            .values(total=total, written=total, lease_until=None)
        )

        def work(conn: Connection) -> BatchRecord | None:
            if conn.execute(stmt).rowcount != 1:
                return None
            return self.rows.get_record(conn, batch_id)

        record: BatchRecord | None = self.rows.run(work, "the end of the stream was not stored")
        if record is None:
            raise StreamAbandoned(batch_id)
        return record

    def abandoned_streams(self, limit: int = 100) -> list[str]:
        """Open streaming batches whose producer's lease ran out (database clock)."""
        stmt = (
            select(batch.c.batch_id)
            .where(
                batch.c.state == BatchState.OPEN.value,
                batch.c.kind == BatchKind.STREAM.value,
                batch.c.total.is_(None),
                batch.c.lease_until < db_now(),
            )
            .order_by(batch.c.created_at)
            .limit(limit)
        )
        rows = self.rows.run(lambda conn: conn.execute(stmt).all(), "batches were not read")
        return [r.batch_id for r in rows]
