"""Batches and chains as data: what a batch is made of and when it is complete. No I/O."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class BatchKind(str, enum.Enum):
    #: A Celery group: its children are counted from their job rows.
    GROUP = "GROUP"
    #: A Celery chord: the body is sent once, with the ordered results of the header.
    CHORD = "CHORD"
    #: ``celery_ratchet.batch()``: on_success / on_failure / on_progress signatures.
    BATCH = "BATCH"
    #: ``celery_ratchet.batch().stream()``: children written chunk by chunk while an
    #: iterator yields; its size is known when the stream ends.
    STREAM = "STREAM"


class BatchState(str, enum.Enum):
    OPEN = "OPEN"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class NewBatch:
    batch_id: str
    kind: BatchKind
    #: Children expected (``None``: a group, counted from its job rows).
    total: int | None
    name: str | None = None
    #: JSON signatures.
    on_success: str | None = None
    on_failure: str | None = None
    on_progress: str | None = None


@dataclass(frozen=True)
class BatchPart:
    """One finished child of a batch, as its own outcome recorded it."""

    batch_id: str
    job_id: str
    #: The child's place in the batch (Celery's ``group_index``); ``None`` sorts last.
    position: int | None
    #: Celery state: SUCCESS, FAILURE, REVOKED, ...
    state: str
    #: The encoded result, or the exception record of a failure.
    result: str | None


FAILED_STATES = frozenset({"FAILURE", "REVOKED"})


@dataclass(frozen=True)
class BatchSummary:
    batch_id: str
    #: A kind or state this version does not know stays its text (see :func:`parse_known`).
    kind: BatchKind | str
    name: str | None
    state: BatchState | str
    total: int | None
    done: int
    failed: int
    created_at: datetime
    finished_at: datetime | None
    #: Children written so far (a streaming batch; the others write all at once).
    written: int = 0

    @property
    def percent_done(self) -> float:
        if not self.total and self.state is not BatchState.OPEN:
            return 100.0
        return percent_done(self.done, self.total)


def parse_known(kind: type[enum.Enum], text: str) -> Any:
    """A stored kind or state (``BatchKind``, ``BatchState``); one this version does not know
    (a row written by hand, by another tool or a newer version) stays its text."""
    try:
        return kind(text)
    except ValueError:
        return str(text)


def shown_value(value: enum.Enum | str) -> str:
    """A kind or state as listings print it; an unknown one says so."""
    return str(value.value) if isinstance(value, enum.Enum) else f"UNKNOWN({value})"


def abandoned_stream_error(written: int) -> str:
    """What ``on_failure`` is told of a streaming batch whose producer stopped renewing its
    lease (it died, or its iterator stalled) before the stream ended."""
    return (
        f"the producer stopped before its stream ended, after writing {written} children "
        "(its lease ran out); the children written run, no more will come"
    )


def expected_children(total: int | None, added: int) -> int | None:
    """Children a batch waits for: its size plus those added while it ran (replace())."""
    return None if total is None else total + added


def percent_done(done: int, total: int | None) -> float:
    """Share of a batch's children done, in percent with one decimal (``None``: unknown
    size, 0)."""
    if not total:
        return 0.0
    return round(100.0 * min(done, total) / total, 1)


#: Progress is reported at each whole percent a batch's count of finished children reaches.
PERCENT = 100


def percent_reached(done: int, total: int) -> int:
    """The whole percent of a batch's children done (0-100)."""
    if total <= 0 or done <= 0:
        return 0
    return min(done, total) * PERCENT // total


def progress_reports_due(reported: int, done: int, total: int) -> list[tuple[int, int]]:
    """The progress reports a batch owes once ``done`` of its ``total`` children finished,
    when its reports up to the whole percent ``reported`` were made: ``(percent, done at
    it)`` for each whole percent reached after ``reported``, in order. A percent is reached
    when a child's end crosses into it, so a batch of 10 reports at 10, 20, ... 100 and one
    of 1,000 every tenth child; never more than 100 reports."""
    due = []
    reached = percent_reached(done, total)
    percent = reported + 1
    while percent <= reached:
        first = -(-percent * total // PERCENT)  # the first count at this percent or past it
        actual = percent_reached(first, total)
        due.append((actual, first))
        percent = actual + 1
    return due


def next_progress_report(percent: int, total: int) -> int | None:
    """The percent of the report that follows the one at ``percent`` (None after 100)."""
    if total <= 0 or percent >= PERCENT:
        return None
    return percent_reached(-(-(percent + 1) * total // PERCENT), total)


def progress_report_id(callback_id: str, percent: int) -> str:
    """The task id of a batch's progress report at ``percent``, derived from the id its
    progress callback was frozen with: the same report is always the same job."""
    return f"{callback_id}-progress-{percent:03d}"
