"""A workflow's conditional branches in the job store: stored with the workflow, decided once."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import and_, select, update

from celery_ratchet.domain.workflow import WAITING, Branch
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
from celery_ratchet.store.units import Unit, connection_of

condition = scheduler_workflow_condition


class Conditions:
    """A workflow's branches, taken for deciding one parent at a time."""

    def __init__(self, rows: BatchRows) -> None:
        self.rows = rows

    def add_conditions(
        self, parent_id: str, rows: Sequence[dict[str, Any]], unit: Unit | None = None
    ) -> None:
        """Store a workflow's branches: dicts of kind, name, predicate, waits_for, branch."""
        values = [
            {"parent_id": parent_id, "position": i, "state": "WAITING", **r}
            for i, r in enumerate(rows)
        ]
        self.rows.write(
            unit,
            lambda c: c.execute(insert_ignoring_conflicts(c.dialect, condition), values),
            "the workflow was not stored",
        )

    def conditions(self, parent_id: str) -> list[Branch]:
        """A workflow's branches, in order."""
        stmt = (
            select(condition)
            .where(condition.c.parent_id == parent_id)
            .order_by(condition.c.position)
        )
        rows = self.rows.run(lambda conn: conn.execute(stmt).all(), "the workflow was not read")
        return [
            Branch(
                position=r.position,
                kind=r.kind,
                name=r.name,
                predicate=r.predicate,
                waits_for=tuple(r.waits_for.split(",")) if r.waits_for else (),
                encoded=r.branch,
                state=r.state,
            )
            for r in rows
        ]

    @contextmanager
    def deciding(self, parent_id: str) -> Iterator[Unit | None]:
        """Take a workflow's undecided branches for deciding: yields a unit of work (write
        the decisions with :meth:`decide` and send the fired branches in it) or ``None``
        when they were decided already."""
        lock = (
            select(condition.c.position)
            .where(condition.c.parent_id == parent_id, condition.c.state == WAITING)
            .with_for_update()
        )
        with self.rows.unit_of_work() as conn:
            found = conn.execute(lock).first() is not None
            yield Unit(conn, store_owned=True) if found else None

    def decide(self, unit: Unit, parent_id: str, states: Mapping[int, str]) -> set[int]:
        """Move each branch at a position of ``states`` from WAITING to its state (FIRED,
        SKIPPED, or FAILED: refused); returns the positions this moved, leaving out those
        decided already."""
        conn = connection_of(unit)
        moved = set()
        for position, state in states.items():
            stmt = (
                update(condition)
                .where(
                    and_(
                        condition.c.parent_id == parent_id,
                        condition.c.position == position,
                        condition.c.state == WAITING,
                    )
                )
                .values(state=state, decided_at=db_now())
            )
            if conn.execute(stmt).rowcount == 1:
                moved.add(position)
        return moved
