"""Claiming a batch of due jobs: one statement or one short transaction per batch, per dialect.

Each strategy moves up to ``limit`` due PENDING rows of the given queues to RUNNING, owned by
``node_id`` under a fresh claim token, in (priority desc, due time, id) order, and returns them.
Rows another claimer holds are skipped, never waited for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Dialect, Row
from sqlalchemy.sql.selectable import TextualSelect

from celery_ratchet.domain.job import ClaimedJob, Message
from celery_ratchet.store.engine import db_now, family, transaction
from celery_ratchet.store.schema import UTCDateTime

RETURNED = (
    "id, job_id, task_name, queue, priority, attempts, claims, scheduled_time, "
    "payload, content_type, content_encoding, headers, properties"
)
_ORDER = "ORDER BY priority DESC, scheduled_time, id"
_DUE = "status = 'PENDING' AND queue IN :queues AND scheduled_time <= {now}"
_CLAIMED = (
    "status = 'RUNNING', picked_by = :node, claim_token = :token, claimed_at = {now}, "
    "started_at = NULL, claims = claims + 1"
)


def _prepare(sql: str) -> TextualSelect:
    return (
        text(sql)
        .bindparams(bindparam("queues", expanding=True))
        .columns(scheduled_time=UTCDateTime())
    )


def to_claimed(row: Row[Any], token: str, claims_offset: int = 0) -> ClaimedJob:
    payload = row.payload
    return ClaimedJob(
        id=row.id,
        job_id=row.job_id,
        task_name=row.task_name,
        queue=row.queue,
        priority=row.priority,
        attempts=row.attempts,
        claims=row.claims + claims_offset,
        token=token,
        scheduled_time=row.scheduled_time,
        message=Message(
            payload=bytes(payload) if not isinstance(payload, bytes) else payload,
            content_type=row.content_type,
            content_encoding=row.content_encoding,
            headers=row.headers,
            properties=row.properties,
        ),
    )


class ClaimStrategy(Protocol):
    def claim(
        self, conn: Connection, node_id: str, token: str, queues: Sequence[str], limit: int
    ) -> list[ClaimedJob]: ...


class PostgresClaim:
    # ANY(ARRAY(...)) runs the locking subquery once, ahead of the update, which then finds
    # its rows by primary key. The rows are locked while PENDING (the lock re-checks the
    # condition), so the update needs no status test, which would tempt the planner onto
    # the status index and its dead entries.
    def __init__(self, now: str) -> None:
        self.statement = _prepare(
            f"UPDATE scheduler_job SET {_CLAIMED.format(now=now)} "
            "WHERE id = ANY(ARRAY("
            f"SELECT id FROM scheduler_job WHERE {_DUE.format(now=now)} "
            f"{_ORDER} LIMIT :limit FOR UPDATE SKIP LOCKED)) "
            f"RETURNING {RETURNED}"
        )

    def claim(
        self, conn: Connection, node_id: str, token: str, queues: Sequence[str], limit: int
    ) -> list[ClaimedJob]:
        params = {"node": node_id, "token": token, "queues": list(queues), "limit": limit}
        rows = conn.execute(self.statement, params).all()
        return [to_claimed(row, token) for row in rows]


class MySQLClaim:
    # No UPDATE ... RETURNING: lock and read the rows, then flip them, in one transaction.
    def __init__(self, now: str) -> None:
        self.select_locked = _prepare(
            f"SELECT {RETURNED} FROM scheduler_job WHERE {_DUE.format(now=now)} "
            f"{_ORDER} LIMIT :limit FOR UPDATE SKIP LOCKED"
        )
        self.mark_running = text(
            f"UPDATE scheduler_job SET {_CLAIMED.format(now=now)} "
            "WHERE id IN :ids AND status = 'PENDING'"
        ).bindparams(bindparam("ids", expanding=True))

    def claim(
        self, conn: Connection, node_id: str, token: str, queues: Sequence[str], limit: int
    ) -> list[ClaimedJob]:
        with transaction(conn):
            rows = conn.execute(self.select_locked, {"queues": list(queues), "limit": limit}).all()
            if not rows:
                return []
            ids = [r.id for r in rows]
            conn.execute(self.mark_running, {"node": node_id, "token": token, "ids": ids})
        return [to_claimed(row, token, claims_offset=1) for row in rows]


class SQLiteClaim:
    # The write lock is taken up front (BEGIN IMMEDIATE), so claimers queue instead of failing.
    def __init__(self, now: str) -> None:
        self.statement = _prepare(
            f"UPDATE scheduler_job SET {_CLAIMED.format(now=now)} "
            "WHERE status = 'PENDING' AND id IN ("
            f"SELECT id FROM scheduler_job WHERE {_DUE.format(now=now)} {_ORDER} LIMIT :limit) "
            f"RETURNING {RETURNED}"
        )

    def claim(
        self, conn: Connection, node_id: str, token: str, queues: Sequence[str], limit: int
    ) -> list[ClaimedJob]:
        params = {"node": node_id, "token": token, "queues": list(queues), "limit": limit}
        with transaction(conn):
            rows = conn.execute(self.statement, params).all()
        return [to_claimed(row, token) for row in rows]


def strategy_for(dialect: Dialect) -> ClaimStrategy:
    strategies: dict[str, Callable[[str], ClaimStrategy]] = {
        "postgresql": PostgresClaim,
        "mysql": MySQLClaim,
        "sqlite": SQLiteClaim,
    }
    now = str(db_now().compile(dialect=dialect))
    try:
        return strategies[family(dialect.name)](now)
    except KeyError:
        raise NotImplementedError(
            f"no claim strategy for {dialect.name!r}; celery_ratchet supports "
            "PostgreSQL, MySQL 8 / MariaDB 10.6+ and SQLite"
        ) from None
