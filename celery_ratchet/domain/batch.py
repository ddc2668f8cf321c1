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


def progress_step(done: int, total: int, steps: int = 100) -> int | None:
    """The progress step (0..steps) reached exactly when the ``done``-th child finished, or
    ``None`` when that child did not cross into a new step: progress callbacks fire at most
    ``steps`` times, whatever the batch's size."""
    if total <= 0 or done <= 0 or done > total:
        return None
    step = done * steps // total
    return step if step != (done - 1) * steps // total else None
