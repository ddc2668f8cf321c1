"""Streaming batches: ``celery_ratchet.batch("Import").stream(rows, import_row.s)``.

The children come from an iterator too large to hold in memory. They are written a chunk at
a time (one multi-row INSERT per chunk, in the transaction that also counts them and renews
the producer's lease), so the producer holds one chunk, whatever the stream's length. The
batch's size is stored when the iterator ends; until then it cannot complete, however many
of its children have finished. A producer that dies mid-stream stops renewing its lease
(database clock): the housekeeping of any worker then fails the batch, and ``on_failure``
says how many children were written.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.canvas import Signature, maybe_signature
from kombu.utils.uuid import uuid

from celery_ratchet.celery.canvas.batches import (
    BATCH_MARKER_TASK,
    batch_progress,
    fail_stream,
    finish,
    finish_stalled,
    progress_owed,
    report_lagging_progress,
    report_progress,
)
from celery_ratchet.celery.compat import is_composite_signature
from celery_ratchet.celery.send.sender import JobBatch
from celery_ratchet.celery.send.transactions import current_transaction
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.batch import (
    BatchKind,
    BatchState,
    BatchSummary,
    NewBatch,
    abandoned_stream_error,
)
from celery_ratchet.errors import InvalidJob, StreamAbandoned

logger = logging.getLogger(__name__)

#: Children (or chunks of items) written per INSERT unless the caller says otherwise.
DEFAULT_CHUNK_SIZE = 1000
#: The largest chunk: one transaction and one chunk of items in memory.
MAX_CHUNK_SIZE = 100_000


@dataclass(frozen=True)
class StreamedBatch:
    """A streaming batch whose stream has ended: its id, its size, and its progress."""

    app: Celery
    id: str
    name: str
    #: Children written: items, or chunks of items with ``chunked=True``.
    total: int
    #: Items the iterator yielded.
    items: int

    def progress(self) -> BatchSummary:
        return batch_progress(self.app, self.id)

    @property
    def percent_done(self) -> float:
        return self.progress().percent_done


@dataclass(frozen=True)
class StreamPlan:
    """What the builder hands over: the batch's name and encoded callbacks."""

    app: Celery
    name: str
    on_success: str | None
    on_failure: str | None
    on_progress: str | None


def check_stream_arguments(chunk_size: int, lease_seconds: float) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise InvalidJob("chunk_size", f"stream(): chunk_size must be an int, got {chunk_size!r}")
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise InvalidJob(
            "chunk_size",
            f"stream(): chunk_size must be within 1-{MAX_CHUNK_SIZE}, got {chunk_size}; a "
            "chunk is one transaction and is held in memory while it is written",
        )
    if not lease_seconds > 0:
        raise InvalidJob(
            "lease_seconds", f"stream(): lease_seconds must be positive, got {lease_seconds!r}"
        )
    if current_transaction() is not None:
        raise InvalidJob(
            "transaction",
            "stream() commits its children chunk by chunk, so it cannot run inside "
            "celery_ratchet.transaction(); open the stream outside it (its rows would only "
            "appear at your commit, after the lease that guards the stream ran out)",
        )


def stream(
    plan: StreamPlan,
    items: Iterable[Any],
    make: Callable[[Any], Any],
    *,
    chunk_size: int,
    chunked: bool,
    lease_seconds: float | None,
) -> StreamedBatch:
    """Write the children of a streaming batch as ``items`` yields them; see the module."""
    app = plan.app
    state = ratchet_state(app)
    lease = state.settings.batch_stream_lease_seconds if lease_seconds is None else lease_seconds
    check_stream_arguments(chunk_size, lease)
    batches = state.batches
    batch_id = uuid()
    batches.open(
        NewBatch(
            batch_id,
            BatchKind.STREAM,
            None,
            name=plan.name,
            on_success=plan.on_success,
            on_failure=plan.on_failure,
            on_progress=plan.on_progress,
        ),
        lease_seconds=lease,
    )
    writer = _ChunkWriter(app, batch_id, make, lease)
    try:
        for chunk in _chunks(items, chunk_size, writer.keep_alive):
            writer.item_count += len(chunk)
            writer.write([chunk] if chunked else chunk)
        record = batches.end_stream(batch_id, writer.written)
    except StreamAbandoned:
        raise  # failed already, by the housekeeping that found the lease run out
    except BaseException as exc:
        _fail_quietly(app, batch_id, exc)
        raise
    logger.info("ratchet: batch %s (%s) streamed %d children", batch_id, plan.name, record.total)
    if progress_owed(record):  # children that finished before the total was known
        report_progress(app, batch_id)
    if record.all_children_ended:  # every child finished before the stream ended
        finish(app.backend, record)
    return StreamedBatch(app, batch_id, plan.name, writer.written, writer.item_count)


class _ChunkWriter:
    """Turns chunks of items into children and writes each chunk in one transaction."""

    def __init__(self, app: Celery, batch_id: str, make: Callable[[Any], Any], lease: float):
        self.app = app
        self.batch_id = batch_id
        self.make = make
        self.lease = lease
        self.marker = app.signature(BATCH_MARKER_TASK, args=(batch_id,))
        self.written = 0
        self.item_count = 0
        self._renewed = time.monotonic()

    def write(self, arguments: list[Any]) -> None:
        state = ratchet_state(self.app)
        producer = JobBatch(self.app)
        for position, argument in enumerate(arguments, start=self.written):
            child = _child_signature(self.make, argument, self.app)
            child.apply_async(
                producer=producer,
                add_to_parent=False,
                chord=self.marker,
                group_id=self.batch_id,
                group_index=position,
            )
        jobs, waiting, stored = producer.take()
        written = self.written + len(jobs)
        state.batches.write_chunk(self.batch_id, jobs, waiting, written, self.lease)
        self.written = written
        self._renewed = time.monotonic()
        state.published(sorted({j.queue for j in jobs}))
        for done in stored:
            done()

    def keep_alive(self) -> None:
        """Called as items arrive: a chunk slow to fill still renews the lease."""
        if time.monotonic() - self._renewed > self.lease / 3:
            ratchet_state(self.app).batches.renew_lease(self.batch_id, self.lease)
            self._renewed = time.monotonic()


def _chunks(items: Iterable[Any], size: int, tick: Callable[[], None]) -> Iterator[list[Any]]:
    iterator = iter(items)
    while True:
        chunk = []
        for item in itertools.islice(iterator, size):
            chunk.append(item)
            tick()
        if not chunk:
            return
        yield chunk


def _child_signature(make: Callable[[Any], Any], argument: Any, app: Celery) -> Signature:
    sig = maybe_signature(make(argument), app=app)
    if not isinstance(sig, Signature) or is_composite_signature(sig):
        raise TypeError(
            f"stream: {make!r} returned {sig!r}; it must return one task's signature (pass "
            "`task.s`, not `task`; groups, chains and chords cannot be streamed)"
        )
    return sig


def _fail_quietly(app: Celery, batch_id: str, exc: BaseException) -> None:
    """The producer stopped with an error: fail the batch now (else its lease would)."""
    record = ratchet_state(app).batches.get(batch_id)
    if record is None or record.state is not BatchState.OPEN:
        return
    try:
        fail_stream(app, record, lambda n: f"the stream stopped after {n} children: {exc!r}")
    except Exception as failure:  # the lease runs out and housekeeping fails it then
        logger.warning("ratchet: batch %s not failed now (%s); its lease will", batch_id, failure)


def fail_abandoned(app: Celery) -> int:
    """Fail the streaming batches whose producer's lease ran out; returns how many."""
    batches = ratchet_state(app).batches
    failed = 0
    for batch_id in batches.abandoned_streams():
        try:
            record = batches.get(batch_id)
            if record is None or record.state is not BatchState.OPEN:
                continue
            if fail_stream(app, record, abandoned_stream_error, abandoned=True):
                failed += 1
        except Exception:  # one batch must not keep the others from being failed
            logger.exception("ratchet: abandoned batch %s could not be failed", batch_id)
    return failed


def housekeeping(app: Celery) -> None:
    """A worker's batch housekeeping: finish stalled batches, fail abandoned streams, and
    write or release the progress reports that lag."""
    try:
        finish_stalled(app)
        fail_abandoned(app)
    finally:
        report_lagging_progress(app)


__all__ = ["StreamPlan", "StreamedBatch", "fail_abandoned", "housekeeping", "stream"]
