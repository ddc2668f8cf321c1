"""Paused queues: one row per queue an operator paused, read by workers before they claim."""

from __future__ import annotations

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from celery_ratchet.domain.queue_pause import PausedQueue, checked_name, checked_reason
from celery_ratchet.errors import SchemaMissing
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import db_now
from celery_ratchet.store.schema import scheduler_queue_pause as pause

_PAUSED = select(pause.c.queue, pause.c.paused_at, pause.c.reason).order_by(pause.c.queue)


class QueuePauses:
    """Pause, resume and list paused queues."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def pause(self, queue: str, reason: str | None = None) -> bool:
        """No worker claims from ``queue`` from its next look on (within
        ``ratchet_queue_pause_check_seconds``); jobs are still accepted into it. True if it
        was running, False if it was paused already (its first pause and reason are kept)."""
        row = {"queue": checked_name(queue), "reason": checked_reason(reason)}
        statement = insert(pause).values(paused_at=db_now())

        def work(conn: Connection) -> bool:
            try:
                conn.execute(statement, row)
            except IntegrityError:
                return False
            return True

        return self._db.run(work, "the queue was not paused")

    def resume(self, queue: str) -> bool:
        """Workers claim from ``queue`` again; those asleep are woken. True if it was paused."""
        statement = delete(pause).where(pause.c.queue == checked_name(queue))

        def work(conn: Connection) -> bool:
            resumed = conn.execute(statement).rowcount > 0
            if resumed:
                self._db.announce_in(conn, queue)
            return resumed

        return self._db.run(work, "the queue was not resumed")

    def paused(self) -> dict[str, PausedQueue]:
        """Every paused queue, by name; none on tables of a version before pauses (where
        :meth:`pause` says to bring them up to date)."""

        def work(conn: Connection) -> dict[str, PausedQueue]:
            rows = conn.execute(_PAUSED)
            return {r.queue: PausedQueue(r.queue, r.paused_at, r.reason) for r in rows}

        try:
            return self._db.run(work, "the paused queues were not read")
        except SchemaMissing:
            return {}
