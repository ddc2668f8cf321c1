"""Building a batch: ``celery_ratchet.batch(name).for_each(...).on_success(...).submit()``,
or ``.stream(...)``; the store completes it (:mod:`celery_ratchet.celery.canvas.batches`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from celery import Celery, group
from celery.canvas import Signature, maybe_signature
from celery.result import GroupResult
from kombu.utils.uuid import uuid

from celery_ratchet.celery.canvas import streams
from celery_ratchet.celery.canvas.batches import BATCH_MARKER_TASK, batch_progress, encode_signature
from celery_ratchet.celery.compat import (
    current_app_object,
    is_composite_signature,
    signature_app,
)
from celery_ratchet.celery.send.transactions import joined
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.batch import BatchKind, BatchSummary, NewBatch


@dataclass(frozen=True)
class SubmittedBatch:
    """A submitted batch: its id, its children's results, and its progress."""

    app: Celery
    id: str
    name: str
    results: GroupResult

    def progress(self) -> BatchSummary:
        return batch_progress(self.app, self.id)

    @property
    def percent_done(self) -> float:
        return self.progress().percent_done


class BatchBuilder:
    """``celery_ratchet.batch("Import users").for_each(users, import_user.s)
    .on_progress(report.s()).on_success(done.s()).on_failure(alert.s()).submit()``.

    Children run in parallel; they are inserted in bulk (multi-row INSERTs, in one
    transaction). When the last one finishes, exactly one of ``on_success`` (with the
    children's results, in order) or ``on_failure`` (with a summary naming the failed
    children) is sent. ``on_progress`` gets a summary each time another whole percent of
    the children is done (at most 100 calls), one at a time and in order, the last at 100 %.
    ``celery -A app ratchet batches`` lists them.
    """

    def __init__(self, name: str, app: Celery | None = None) -> None:
        if not name:
            raise ValueError("a batch needs a name (it is how `ratchet batches` shows it)")
        self.name = name
        self.app = app
        self._children: list[Signature] = []
        self._on_success: Signature | None = None
        self._on_failure: Signature | None = None
        self._on_progress: Signature | None = None

    def for_each(self, items: Iterable[Any], make: Callable[[Any], Any]) -> BatchBuilder:
        """One child per item: ``make(item)`` returns its signature (``task.s``)."""
        for item in items:
            sig = maybe_signature(make(item), app=self.app)
            if not isinstance(sig, Signature):
                raise TypeError(
                    f"for_each: {make!r} returned {sig!r}; it must return a task signature "
                    "(pass `task.s`, not `task`)"
                )
            self._children.append(sig)
        return self

    def add(self, *signatures: Any) -> BatchBuilder:
        self._children.extend(_signature(s, "add") for s in signatures)
        return self

    def on_success(self, sig: Any) -> BatchBuilder:
        self._on_success = _signature(sig, "on_success")
        return self

    def on_failure(self, sig: Any) -> BatchBuilder:
        self._on_failure = _signature(sig, "on_failure")
        return self

    def on_progress(self, sig: Any) -> BatchBuilder:
        """One task's signature, sent a summary at each whole percent of the children done:
        one report per percent reached, the last at 100 %, run one at a time, in order."""
        found = _signature(sig, "on_progress")
        if is_composite_signature(found):
            raise TypeError(
                f"on_progress: expected one task's signature (task.s()), got {sig!r}; each "
                "report is one job, run after the one before it ended"
            )
        self._on_progress = found
        return self

    def stream(
        self,
        items: Iterable[Any],
        make: Callable[[Any], Any],
        *,
        chunk_size: int = 1000,
        chunked: bool = False,
        lease_seconds: float | None = None,
    ) -> streams.StreamedBatch:
        """A streaming batch: one child per item (``make(item)``), or with ``chunked=True``
        one child per chunk of ``chunk_size`` items (``make(list_of_items)``), written a
        chunk at a time as ``items`` yields, in bounded memory. Returns once the iterator
        is exhausted (a :class:`~celery_ratchet.celery.canvas.streams.StreamedBatch`).

        ``on_success`` and ``on_failure`` get a summary (total, written, done, succeeded,
        failed; ``failed_ids``, ``error`` on failure), never the children's results. If the
        producer dies mid-stream, the batch FAILS once its lease (``lease_seconds``, default
        ``ratchet_batch_stream_lease_seconds``) runs out; ``on_failure`` says how many
        children were written."""
        if self._children:
            raise ValueError(f"batch {self.name!r}: for_each()/add() and stream() do not mix")
        app = self.app or _current_app()
        on_success, on_failure, on_progress = self._frozen_callbacks()
        plan = streams.StreamPlan(
            app, self.name, _encoded(on_success), _encoded(on_failure), _encoded(on_progress)
        )
        return streams.stream(
            plan, items, make, chunk_size=chunk_size, chunked=chunked, lease_seconds=lease_seconds
        )

    def _frozen_callbacks(self) -> tuple[Signature | None, Signature | None, Signature | None]:
        # Copies, frozen now: the ids stored are the ids sent, and submitting again is a
        # new batch with new ids.
        on_success, on_failure, on_progress = (
            None if sig is None else sig.clone()
            for sig in (self._on_success, self._on_failure, self._on_progress)
        )
        for sig in (on_success, on_failure, on_progress):
            if sig is not None:
                sig.freeze()
        return on_success, on_failure, on_progress

    def submit(self) -> SubmittedBatch:
        if not self._children:
            raise ValueError(f"batch {self.name!r} has no children: call for_each() first")
        app = self.app or signature_app(self._children[0]) or _current_app()
        batch_id = uuid()
        on_success, on_failure, on_progress = self._frozen_callbacks()
        with joined(app) as unit:
            ratchet_state(app).batches.open(
                NewBatch(
                    batch_id,
                    BatchKind.BATCH,
                    len(self._children),
                    name=self.name,
                    on_success=_encoded(on_success),
                    on_failure=_encoded(on_failure),
                    on_progress=_encoded(on_progress),
                ),
                unit=unit,
            )
        marker = app.signature(BATCH_MARKER_TASK, args=(batch_id,))
        children = [child.clone() for child in self._children]
        result = group(children, app=app).apply_async(task_id=batch_id, chord=marker)
        return SubmittedBatch(app, batch_id, self.name, result)


def batch(name: str, app: Celery | None = None) -> BatchBuilder:
    """Start building a batch; see :class:`BatchBuilder`."""
    return BatchBuilder(name, app)


def _signature(sig: Any, what: str) -> Signature:
    found = maybe_signature(sig)
    if not isinstance(found, Signature):
        raise TypeError(f"{what}: expected a task signature (task.s(...)), got {sig!r}")
    return found


def _encoded(sig: Signature | None) -> str | None:
    return None if sig is None else encode_signature(sig)


def _current_app() -> Celery:
    return current_app_object()
