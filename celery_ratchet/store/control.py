"""Broadcasts and their replies in the job store: the mailbox of ``celery inspect`` and
``celery control`` when there is no broker."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Connection

from celery_ratchet.domain.control import CONTROL_WAKEUP, ControlCommand, ControlReply
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import (
    db_now,
    db_now_minus,
)
from celery_ratchet.store.engine import (
    transaction,
)
from celery_ratchet.store.schema import scheduler_control, scheduler_control_reply

T = TypeVar("T")

command_table = scheduler_control
reply_table = scheduler_control_reply


class ControlStore:
    """Remote control rows of a :class:`~celery_ratchet.store.jobstore.JobStore`'s database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _run(self, work: Callable[[Connection], T], what: str) -> T:
        return self.db.run(work, what)

    def broadcast(
        self,
        command: str,
        arguments: str,
        *,
        destination: str | None = None,
        pattern: str | None = None,
        matcher: str | None = None,
        ticket: str | None = None,
        ttl_seconds: float,
    ) -> None:
        """Write one command for the workers, alive ``ttl_seconds`` by the database clock;
        on PostgreSQL with wake-ups, listening workers are told at commit. Commands and
        replies past their expiry are deleted on the way."""
        values = {
            "command": command,
            "arguments": arguments,
            "destination": destination,
            "pattern": pattern,
            "matcher": matcher,
            "ticket": ticket,
            "created_at": db_now(),
            "expires_at": db_now_minus(-ttl_seconds),
        }

        def work(conn: Connection) -> None:
            with transaction(conn):
                _delete_expired(conn)
                conn.execute(insert(command_table).values(**values))
                self.db.announce_in(conn, CONTROL_WAKEUP)

        self._run(work, "the control command was not sent")

    def clock(self) -> datetime:
        """The database's current time."""
        now: datetime = self._run(
            lambda conn: conn.execute(select(db_now())).scalar_one(), "the clock was not read"
        )
        return now

    def commands_since(self, since: datetime) -> list[ControlCommand]:
        """Commands broadcast at or after ``since`` that have not expired, oldest first."""
        c = command_table
        stmt = select(c).where(c.c.created_at >= since, c.c.expires_at > db_now()).order_by(c.c.id)
        rows = self._run(lambda conn: conn.execute(stmt).all(), "control commands were not read")
        return [
            ControlCommand(
                id=r.id,
                command=r.command,
                arguments=r.arguments,
                destination=r.destination,
                pattern=r.pattern,
                matcher=r.matcher,
                ticket=r.ticket,
                created_at=r.created_at,
                expires_at=r.expires_at,
            )
            for r in rows
        ]

    def reply(self, command: ControlCommand, hostname: str, reply: str) -> None:
        """Answer ``command`` (which has a ticket); kept until the command expires, unless
        its sender reads it first."""
        assert command.ticket is not None
        stmt = insert(reply_table).values(
            ticket=command.ticket,
            hostname=hostname,
            reply=reply,
            expires_at=command.expires_at,
        )
        self._run(lambda conn: conn.execute(stmt), "the control reply was not written")

    def replies(self, ticket: str, after: int = 0) -> list[ControlReply]:
        """Replies to ``ticket`` with an id above ``after``, in the order they were written."""
        r = reply_table
        stmt = select(r.c.id, r.c.hostname, r.c.reply).where(r.c.ticket == ticket, r.c.id > after)
        rows = self._run(
            lambda conn: conn.execute(stmt.order_by(r.c.id)).all(), "control replies were not read"
        )
        return [ControlReply(row.id, row.hostname, row.reply) for row in rows]

    def drop_replies(self, ticket: str) -> int:
        """The sender has gathered: delete the replies to ``ticket``."""
        stmt = delete(reply_table).where(reply_table.c.ticket == ticket)
        deleted: int = self._run(
            lambda conn: conn.execute(stmt).rowcount, "control replies were not deleted"
        )
        return deleted

    def count(self) -> tuple[int, int]:
        """(commands, replies) stored now, expired or not."""

        def work(conn: Connection) -> tuple[int, int]:
            commands = conn.execute(select(func.count()).select_from(command_table)).scalar_one()
            replies = conn.execute(select(func.count()).select_from(reply_table)).scalar_one()
            return int(commands), int(replies)

        result: tuple[int, int] = self._run(work, "control rows were not counted")
        return result


def _delete_expired(conn: Connection) -> None:
    # A little after expiry: a worker may be writing its last reply to an expiring command.
    grace = db_now_minus(60)
    conn.execute(delete(command_table).where(command_table.c.expires_at < grace))
    conn.execute(delete(reply_table).where(reply_table.c.expires_at < grace))


def control_store(store: Any) -> ControlStore:
    """The remote control rows of ``store``'s database (one per store). ``store``: a
    :class:`~celery_ratchet.store.jobstore.JobStore` (the runtime hands it over as its
    ports, which do not name the control rows)."""
    found: ControlStore | None = getattr(store, "_control", None)
    if found is None:
        found = store._control = ControlStore(store.db)
    return found
