"""The batch store's base: its connection handling and the batch row as read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import select
from sqlalchemy.engine import Connection

from celery_ratchet.domain.batch import (
    BatchKind,
    BatchState,
    expected_children,
)
from celery_ratchet.store.db_errors import in_callers_transaction
from celery_ratchet.store.schema import (
    scheduler_batch,
)
from celery_ratchet.store.units import Unit, connection_of, is_callers

if TYPE_CHECKING:
    from celery_ratchet.store.jobstore import JobStore

T = TypeVar("T")

batch = scheduler_batch


@dataclass(frozen=True)
class Progress:
    done: int
    failed: int


@dataclass(frozen=True)
class BatchRecord:
    """A batch row with its signatures and counters, for whoever completes it."""

    batch_id: str
    kind: BatchKind
    name: str | None
    state: BatchState
    total: int | None
    added: int
    on_success: str | None
    on_failure: str | None
    on_progress: str | None
    #: Children ended so far, and how many of them failed.
    done: int
    failed: int
    #: Children written so far (a streaming batch).
    written: int = 0
    #: The whole percent up to which progress reports are written, and up to which they ran.
    progress_written: int = 0
    progress_ended: int = 0

    @property
    def progress(self) -> Progress:
        return Progress(self.done, self.failed)

    @property
    def expected(self) -> int | None:
        return expected_children(self.total, self.added)

    @property
    def all_children_ended(self) -> bool:
        return self.expected is not None and self.done >= self.expected


class BatchRows:
    """What every part of the batch store runs on: the job store's database, its dialect,
    the job writes a batch makes (inserts of released steps, sends of a stream), and the
    batch row read and written in a unit of work."""

    def __init__(self, store: JobStore) -> None:
        self.db = store.db
        self.dialect = store.dialect
        self.rows = store.rows
        self.enqueuer = store.enqueuer

    def run(self, work: Callable[[Connection], T], what: str) -> T:
        return self.db.run(work, what)

    def write(self, unit: Unit | None, work: Any, what: str) -> Any:
        """Run ``work`` in the caller's unit of work (inside its transaction, in a
        savepoint) when given, else on a pooled connection."""
        if unit is None:
            return self.run(work, what)
        conn = connection_of(unit)
        with in_callers_transaction(conn, what, callers=is_callers(unit)), conn.begin_nested():
            return work(conn)

    def get_record(self, conn: Connection, batch_id: str) -> BatchRecord | None:
        row = conn.execute(select(batch).where(batch.c.batch_id == batch_id)).first()
        return None if row is None else _record(row)

    @contextmanager
    def unit_of_work(self) -> Iterator[Connection]:
        """A connection for a decision and what follows it, committed together: one READ
        COMMITTED transaction on PostgreSQL and MySQL. SQLite has one writer at a time: a
        transaction held open here would block the follow-up writes this process makes on
        its other connections, so each statement commits on its own there."""
        self.db.ensure_schema()
        with self.db.engine.connect() as conn:
            if self.dialect.single_writer:
                yield conn
                return
            conn = conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                yield conn


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
        done=row.done,
        failed=row.failed,
        written=row.written,
        progress_written=row.progress_written,
        progress_ended=row.progress_ended,
    )
