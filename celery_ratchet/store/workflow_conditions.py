"""A workflow's conditional branches in the job store: stored with the workflow, decided once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Connection

from celery_ratchet.store.batch_rows import BatchRows
from celery_ratchet.store.db_clock import (
    db_now,
)
from celery_ratchet.store.engine import (
    insert_ignoring_conflicts,
)
from celery_ratchet.store.schema import (
    scheduler_workflow_condition,
)

condition = scheduler_workflow_condition


class ConditionOps(BatchRows):
    """A workflow's branches, taken for deciding one parent at a time."""

    def add_conditions(
        self, parent_id: str, rows: Sequence[dict[str, Any]], conn: Connection | None = None
    ) -> None:
        """Store a workflow's branches: dicts of kind, name, predicate, waits_for, branch."""
        values = [
            {"parent_id": parent_id, "position": i, "state": "WAITING", **r}
            for i, r in enumerate(rows)
        ]
        self._write(
            conn,
            lambda c: c.execute(insert_ignoring_conflicts(c.dialect, condition), values),
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
        lock = (
            select(condition.c.position)
            .where(condition.c.parent_id == parent_id, condition.c.state == "WAITING")
            .with_for_update()
        )
        with self._unit_of_work() as conn:
            yield conn if conn.execute(lock).first() is not None else None


def decide(
    conn: Connection, parent_id: str, position: int, fired: bool, *, refused: bool = False
) -> bool:
    """Mark one branch FIRED or SKIPPED (FAILED when ``refused``: it may not run); False when
    it was decided already."""
    stmt = (
        update(condition)
        .where(
            and_(
                condition.c.parent_id == parent_id,
                condition.c.position == position,
                condition.c.state == "WAITING",
            )
        )
        .values(state="FAILED" if refused else "FIRED" if fired else "SKIPPED", decided_at=db_now())
    )
    return bool(conn.execute(stmt).rowcount == 1)
