"""Claiming a batch of due jobs: one statement or one short transaction per batch, per dialect.

Each strategy moves up to ``limit`` due PENDING rows of the given queues to RUNNING, owned by
``node_id`` under a fresh claim token, in (priority desc, due time, id) order, and returns them.
Rows another claimer holds are skipped, never waited for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Dialect, Row
from sqlalchemy.sql.selectable import TextualSelect

from celery_ratchet.domain.job import ClaimedJob, JobType, Message
from celery_ratchet.store.engine import db_now, family, transaction
from celery_ratchet.store.schema import UTCDateTime

RETURNED = (
    "id, job_id, task_name, queue, priority, attempts, claims, scheduled_time, "
    "payload, content_type, content_encoding, headers, properties, job_type, schedule_spec"
)
_ORDER = "ORDER BY priority DESC, scheduled_time, id"
_DUE = "status = 'PENDING' AND queue IN ({queues}) AND scheduled_time <= {now}"
_CLAIMED = (
    "status = 'RUNNING', picked_by = :node, claim_token = :token, claimed_at = {now}, "
    "started_at = NULL, claims = claims + 1"
)


def _due(now: str, queues: int) -> str:
    # One bind parameter per queue, not an expanding IN: a worker's queues never change, so
    # the statement compiles once instead of on every claim.
    return _DUE.format(now=now, queues=", ".join(f":q{i}" for i in range(queues)))


def _queue_params(queues: Sequence[str]) -> dict[str, str]:
    return {f"q{i}": q for i, q in enumerate(queues)}


def _prepare(sql: str) -> TextualSelect:
    return text(sql).columns(scheduled_time=UTCDateTime(), claimed_now=UTCDateTime())


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
        job_type=JobType(row.job_type),
        schedule_spec=row.schedule_spec,
        claimed_now=getattr(row, "claimed_now", None),
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
        self.now = now

    @functools.lru_cache(maxsize=8)  # noqa: B019 - one strategy per store, a few queue counts
    def statement(self, queues: int) -> TextualSelect:
        return _prepare(
            f"UPDATE scheduler_job SET {_CLAIMED.format(now=self.now)} "
            "WHERE id = ANY(ARRAY("
            f"SELECT id FROM scheduler_job WHERE {_due(self.now, queues)} "
            f"{_ORDER} LIMIT :limit FOR UPDATE SKIP LOCKED)) "
            f"RETURNING {RETURNED}, {self.now} AS claimed_now"
        )

    def claim(
        self, conn: Connection, node_id: str, token: str, queues: Sequence[str], limit: int
    ) -> list[ClaimedJob]:
        params = {"node": node_id, "token": token, "limit": limit, **_queue_params(queues)}
        rows = conn.execute(self.statement(len(queues)), params).all()
        return [to_claimed(row, token) for row in rows]


class MySQLClaim:
    # No UPDATE ... RETURNING: lock and read the rows, then flip them, in one transaction.
    def __init__(self, now: str) -> None:
        self.now = now
        self.mark_running = text(
            f"UPDATE scheduler_job SET {_CLAIMED.format(now=now)} "
            "WHERE id IN :ids AND status = 'PENDING'"
        ).bindparams(bindparam("ids", expanding=True))

    @functools.lru_cache(maxsize=8)  # noqa: B019 - one strategy per store, a few queue counts
    def select_locked(self, queues: int) -> TextualSelect:
        return _prepare(
            f"SELECT {RETURNED}, {self.now} AS claimed_now FROM scheduler_job "
            f"WHERE {_due(self.now, queues)} "
            f"{_ORDER} LIMIT :limit FOR UPDATE SKIP LOCKED"
        )

    def claim(
        self, conn: Connection, node_id: str, token: str, queues: Sequence[str], limit: int
    ) -> list[ClaimedJob]:
        select = self.select_locked(len(queues))
        with transaction(conn):
            rows = conn.execute(select, {"limit": limit, **_queue_params(queues)}).all()
            if not rows:
                return []
            ids = [r.id for r in rows]
            conn.execute(self.mark_running, {"node": node_id, "token": token, "ids": ids})
        return [to_claimed(row, token, claims_offset=1) for row in rows]


class SQLiteClaim:
    # The write lock is taken up front (BEGIN IMMEDIATE), so claimers queue instead of failing.
    def __init__(self, now: str) -> None:
        self.now = now

    @functools.lru_cache(maxsize=8)  # noqa: B019 - one strategy per store, a few queue counts
    def statement(self, queues: int) -> TextualSelect:
        return _prepare(
            f"UPDATE scheduler_job SET {_CLAIMED.format(now=self.now)} "
            "WHERE status = 'PENDING' AND id IN ("
            f"SELECT id FROM scheduler_job WHERE {_due(self.now, queues)} {_ORDER} "
            f"LIMIT :limit) RETURNING {RETURNED}, {self.now} AS claimed_now"
        )

    def claim(
        self, conn: Connection, node_id: str, token: str, queues: Sequence[str], limit: int
    ) -> list[ClaimedJob]:
        params = {"node": node_id, "token": token, "limit": limit, **_queue_params(queues)}
        with transaction(conn):
            rows = conn.execute(self.statement(len(queues)), params).all()
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
