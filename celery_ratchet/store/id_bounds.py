"""A range of creation times as a range of ids, so that a listing filtered by when its jobs
were created reads only the rows of that range: ``created_at`` has no index, and a filter
on it alone would read every newer row (and, when few match, every row).

Ids are handed out in the order rows are inserted, and a row's ``created_at`` is at most
that moment (PostgreSQL's clock is its transaction's start). So ids grow with
``created_at`` but for rows whose sending transaction was open a while before its insert:
the bounds are looked for :data:`SLACK_SECONDS` wider than asked, and the exact times are
still compared row by row. A job whose sending transaction stayed open longer than that
before its insert may be missed at the edge of a range.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, false, func, select
from sqlalchemy.engine import Connection

from celery_ratchet.store.job_rows import listed_column
from celery_ratchet.store.schema import scheduler_job

job = scheduler_job
SLACK_SECONDS = 300.0


def created_id_bounds(
    conn: Connection, since: datetime | None, until: datetime | None
) -> list[Any]:
    """Conditions on ``id`` that hold for every row created in [since, until)."""
    if since is None and until is None:
        return []
    slack = timedelta(seconds=SLACK_SECONDS)
    span = conn.execute(select(func.min(job.c.id), func.max(job.c.id))).one()
    if span[0] is None:
        return []
    conditions: list[Any] = []
    if since is not None:
        first = _first_id_from(conn, since - slack, span[0], span[1])
        conditions.append(false() if first is None else job.c.id >= first)
    if until is not None:
        after = _first_id_from(conn, until + slack, span[0], span[1])
        if after is not None:
            conditions.append(job.c.id < after)
    return conditions


def _first_id_from(conn: Connection, moment: datetime, low: int, high: int) -> int | None:
    """The smallest id whose row was created at ``moment`` or later, were ids in the order
    of ``created_at``: a bisection of primary-key lookups (about 20 at a million rows)."""
    probe = (
        select(job.c.id, listed_column(job.c.created_at))
        .where(job.c.id >= bindparam("from_id"))
        .order_by(job.c.id)
        .limit(1)
    )
    found: int | None = None
    while low <= high:
        middle = (low + high) // 2
        row = conn.execute(probe, {"from_id": middle}).first()
        if row is None:
            high = middle - 1
        elif isinstance(row.created_at, datetime) and row.created_at >= moment:
            found, high = int(row.id), middle - 1
        else:
            low = int(row.id) + 1
    return found
