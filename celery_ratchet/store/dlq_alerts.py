"""Dead-letter alert windows in ``scheduler_dlq_alert``: counted in the transaction that fails
each job, closed once cluster-wide by a conditional UPDATE (see domain/dlq_alert.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select, tuple_, update
from sqlalchemy.engine import Connection

from celery_ratchet.domain.dlq_alert import MAX_LISTED_JOBS, AlertWindow
from celery_ratchet.domain.dlq_alert import AlertState as AlertState  # kept importable here
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.db_clock import (
    db_now,
    db_now_minus,
)
from celery_ratchet.store.engine import (
    insert_ignoring_conflicts,
)
from celery_ratchet.store.schema import UTCDateTime, scheduler_dlq_alert, scheduler_job

alert = scheduler_dlq_alert
job = scheduler_job


@dataclass(frozen=True)
class DeadLetter:
    """A job that has just failed for good, as its row now holds it."""

    task_name: str
    job_id: str
    error: str | None
    finished_at: datetime


_COUNT = (
    update(alert)
    .where(alert.c.task_name == bindparam("p_task"))
    .values(
        failed=alert.c.failed + bindparam("p_count"),
        opened_at=func.coalesce(alert.c.opened_at, bindparam("p_first", type_=UTCDateTime())),
        first_opened_at=func.coalesce(
            alert.c.first_opened_at, bindparam("p_first", type_=UTCDateTime())
        ),
        newest_job_id=bindparam("p_job_id"),
        newest_error=bindparam("p_error"),
        newest_at=bindparam("p_newest", type_=UTCDateTime()),
    )
)


def dead_letters(conn: Connection, claims: Sequence[tuple[str, str]]) -> list[DeadLetter]:
    """The FAILED rows these (job id, claim token) pairs hold: read in the transaction that
    failed them, so they are exactly the rows it changed."""
    if not claims:
        return []
    stmt = select(job.c.task_name, job.c.job_id, job.c.last_error, job.c.finished_at).where(
        job.c.status == JobStatus.FAILED.value,
        tuple_(job.c.job_id, job.c.claim_token).in_(list(claims)),
    )
    return [
        DeadLetter(r.task_name, r.job_id, r.last_error, r.finished_at) for r in conn.execute(stmt)
    ]


def dead_letters_by_id(conn: Connection, job_ids: Sequence[str]) -> list[DeadLetter]:
    if not job_ids:
        return []
    stmt = select(job.c.task_name, job.c.job_id, job.c.last_error, job.c.finished_at).where(
        job.c.status == JobStatus.FAILED.value, job.c.job_id.in_(list(job_ids))
    )
    return [
        DeadLetter(r.task_name, r.job_id, r.last_error, r.finished_at) for r in conn.execute(stmt)
    ]


def count_dead_letters(
    conn: Connection, letters: Sequence[DeadLetter], *, excluded: str | None = None
) -> None:
    """Count failed jobs into the open window of their task name (opening one at the first
    job's finish time if none is open). Call inside the transaction that failed them.

    Task names in sorted order: two transactions counting the same names lock their rows in
    one order, so they cannot deadlock each other."""
    by_task: dict[str, list[DeadLetter]] = defaultdict(list)
    for letter in letters:
        if letter.task_name != excluded:  # the alert task's own failures do not alert again
            by_task[letter.task_name].append(letter)
    for task_name in sorted(by_task):
        group = sorted(by_task[task_name], key=lambda d: (d.finished_at, d.job_id))
        newest = group[-1]
        params = {
            "p_task": task_name,
            "p_count": len(group),
            "p_first": group[0].finished_at,
            "p_job_id": newest.job_id,
            "p_error": newest.error,
            "p_newest": newest.finished_at,
        }
        if conn.execute(_COUNT, params).rowcount == 1:
            continue
        new_row = {"task_name": task_name, "failed": 0, "alerts_sent": 0}
        conn.execute(insert_ignoring_conflicts(conn.dialect, alert), new_row)
        conn.execute(_COUNT, params)


def due_windows(conn: Connection, interval_seconds: float) -> list[str]:
    """Task names whose window closed by the database clock: their alert is due."""
    stmt = (
        select(alert.c.task_name)
        .where(alert.c.opened_at.is_not(None), alert.c.opened_at <= db_now_minus(interval_seconds))
        .order_by(alert.c.task_name)
    )
    return [r.task_name for r in conn.execute(stmt)]


def close_window(
    conn: Connection,
    task_name: str,
    interval_seconds: float,
    send: Callable[[AlertWindow, list[str], datetime], str],
) -> str | None:
    """Close this task name's window if it is due and nobody closed it yet, and ``send`` its
    alert (``send`` writes the alert job on ``conn`` and returns its id). Call inside a
    transaction: the close and the alert job commit together, or neither does. Returns the
    alert job's id, or None when there was nothing to close (another node closed it)."""
    claim = (
        update(alert)
        .where(
            alert.c.task_name == task_name,
            alert.c.opened_at.is_not(None),
            alert.c.opened_at <= db_now_minus(interval_seconds),
        )
        .values(alerts_sent=alert.c.alerts_sent + 1, last_sent_at=db_now())
    )
    # The compare-and-swap: of the nodes closing at once, one changes the row; the others
    # wait for its commit and then find the window closed (opened_at NULL).
    if conn.execute(claim).rowcount != 1:
        return None
    row = conn.execute(select(alert).where(alert.c.task_name == task_name)).one()
    window = AlertWindow(
        task_name=task_name,
        opened_at=row.opened_at,
        failed=row.failed,
        newest_job_id=row.newest_job_id,
        newest_error=row.newest_error,
        newest_at=row.newest_at,
        sequence=row.alerts_sent,
    )
    listed = (
        select(job.c.job_id)
        .where(
            job.c.task_name == task_name,
            job.c.status == JobStatus.FAILED.value,
            job.c.finished_at >= row.opened_at,
            job.c.finished_at <= row.last_sent_at,
        )
        .order_by(job.c.finished_at.desc(), job.c.job_id.desc())
        .limit(MAX_LISTED_JOBS)
    )
    job_ids = [r.job_id for r in conn.execute(listed)]
    alert_job_id = send(window, job_ids, row.last_sent_at)
    conn.execute(
        update(alert)
        .where(alert.c.task_name == task_name)
        .values(
            opened_at=None,
            failed=0,
            newest_job_id=None,
            newest_error=None,
            newest_at=None,
            last_alert_id=alert_job_id,
            last_count=row.failed,
        )
    )
    return alert_job_id


def alert_states(conn: Connection, task_names: Sequence[str]) -> dict[str, AlertState]:
    if not task_names:
        return {}
    stmt = select(alert).where(alert.c.task_name.in_(sorted(set(task_names))))
    return {r.task_name: _state(r) for r in conn.execute(stmt)}


def _state(row: Any) -> AlertState:
    return AlertState(
        task_name=row.task_name,
        opened_at=row.opened_at,
        failed=row.failed,
        first_opened_at=row.first_opened_at,
        last_sent_at=row.last_sent_at,
        last_alert_id=row.last_alert_id,
        last_count=row.last_count,
    )
