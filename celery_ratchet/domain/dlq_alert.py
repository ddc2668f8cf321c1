"""Dead-letter alerts: one alert per task name per window, sent when the window closes.

A window opens at the first job of a task name that fails for good while no window of that
name is open; every job of that name failing while it is open is counted into it. The window
closes ``interval`` seconds after it opened, and its alert (a summary of what it counted) is
sent then. The next failure opens the next window, so alerts of one task name are at least
``interval`` apart and every failure is counted in exactly one of them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

#: Job ids an alert lists (newest first); its count covers all of them.
MAX_LISTED_JOBS = 20
#: The newest error is cut to this many characters: the alert must fit in a job.
MAX_ERROR_CHARS = 2000

_ALERT_IDS = uuid.UUID("6c1f0c7e-2a4b-4f8e-9d3a-5b7e1c2d4f60")

#: How ``ratchet dlq list`` shows a dead letter's alert.
SENT, DUE, NOT_ALERTED = "sent", "due", "-"


@dataclass(frozen=True)
class AlertState:
    """What ``ratchet dlq list`` shows of one task name's alerts."""

    task_name: str
    opened_at: datetime | None
    failed: int
    first_opened_at: datetime | None
    last_sent_at: datetime | None
    last_alert_id: str | None
    last_count: int | None


@dataclass(frozen=True)
class AlertWindow:
    """The open window of one task name, as the database holds it."""

    task_name: str
    opened_at: datetime
    failed: int
    newest_job_id: str | None
    newest_error: str | None
    newest_at: datetime | None
    #: This window's place among its task name's windows (1 for the first): two windows may
    #: open at one database instant (a transaction's clock is its start), never at one place.
    sequence: int


@dataclass(frozen=True)
class AlertSummary:
    """What the alert task is sent about one window."""

    task_name: str
    count: int
    newest_error: str | None
    newest_job_id: str | None
    job_ids: tuple[str, ...]
    since: datetime
    until: datetime
    interval_seconds: float

    def as_message(self) -> dict[str, Any]:
        """The alert task's one argument: JSON types only."""
        return {
            "task_name": self.task_name,
            "count": self.count,
            "newest_error": self.newest_error,
            "newest_job_id": self.newest_job_id,
            "job_ids": list(self.job_ids),
            "more_jobs": max(self.count - len(self.job_ids), 0),
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "interval_seconds": self.interval_seconds,
        }


def closes_at(opened_at: datetime, interval_seconds: float) -> datetime:
    return opened_at + timedelta(seconds=interval_seconds)


def window_due(opened_at: datetime | None, now: datetime, interval_seconds: float) -> bool:
    """Whether a window opened at ``opened_at`` has closed by ``now`` (its alert is due)."""
    return opened_at is not None and closes_at(opened_at, interval_seconds) <= now


def alert_id(window: AlertWindow) -> str:
    """The alert job's id: the same for the same window, whoever sends it, and different for
    each window of a task name even when two opened at the same instant."""
    key = f"{window.task_name}@{window.opened_at.isoformat()}#{window.sequence}"
    return str(uuid.uuid5(_ALERT_IDS, key))


def summarize(
    window: AlertWindow,
    job_ids: list[str],
    now: datetime,
    interval_seconds: float,
    *,
    newest_error: str | None = None,
    limit: int = MAX_LISTED_JOBS,
) -> AlertSummary:
    """The alert of a closed window. ``job_ids``: failed jobs of the window, newest first
    (the count comes from the window, not from them: jobs requeued or purged since still
    count). ``newest_error``: the window's newest error as people read it."""
    listed = list(dict.fromkeys(job_ids))[: max(limit, 0)]
    error = newest_error if newest_error is not None else window.newest_error
    if error is not None and len(error) > MAX_ERROR_CHARS:
        error = error[: MAX_ERROR_CHARS - 1] + "…"
    return AlertSummary(
        task_name=window.task_name,
        count=window.failed,
        newest_error=error,
        newest_job_id=window.newest_job_id,
        job_ids=tuple(listed),
        since=window.opened_at,
        until=now,
        interval_seconds=interval_seconds,
    )


def alert_shown(
    finished_at: datetime | None,
    *,
    opened_at: datetime | None,
    first_opened_at: datetime | None,
    last_sent_at: datetime | None,
) -> str:
    """How a dead letter's alert is shown: ``due`` if it is counted in the open window of its
    task name, ``sent`` if it failed between the first window and the last alert sent, ``-``
    otherwise (it failed before any window: no alert task was set then).

    Windows open at the finish time of their first job, so a job is in the open window
    exactly when it finished at or after the window opened."""
    if finished_at is None:
        return NOT_ALERTED
    if opened_at is not None and finished_at >= opened_at:
        return DUE
    if (
        first_opened_at is not None
        and last_sent_at is not None
        and first_opened_at <= finished_at <= last_sent_at
    ):
        return SENT
    return NOT_ALERTED
