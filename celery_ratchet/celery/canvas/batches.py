"""Chords and batches completed by the database, and ``celery_ratchet.batch()``.

Each finished child of a chord or batch is written as a part in the transaction of its own
outcome. The child that finds every part in swaps the batch's state (OPEN → SUCCEEDED or
FAILED); only the winner of that compare-and-swap sends what follows, on the same
transaction (PostgreSQL, MySQL), so the body of a chord is sent exactly once: never twice
when two children finish at the same instant, never lost when a node dies in between (the
swap rolls back, and the orphan scan of any node finishes the batch). No polling task.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from celery import Celery, signature, states
from celery.canvas import Signature
from celery.exceptions import ChordError
from celery.result import GroupResult, allow_join_result
from kombu.utils import json as kjson

from celery_ratchet.celery.send.current_job import claim_of_current_job
from celery_ratchet.celery.send.job_types import sending_as
from celery_ratchet.celery.send.sender import JobBatch
from celery_ratchet.celery.send.transactions import joined, transaction
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.batch import (
    FAILED_STATES,
    BatchKind,
    BatchPart,
    BatchState,
    BatchSummary,
    NewBatch,
    percent_done,
    percent_reached,
    progress_report_id,
)
from celery_ratchet.domain.job import JobType, NewJob
from celery_ratchet.store.celery_ports import BatchRecord, Progress
from celery_ratchet.store.db_errors import (
    is_retryable_conflict,
)
from celery_ratchet.store.units import Unit

logger = logging.getLogger(__name__)

#: The chord body of a ``celery_ratchet.batch()``: never run, it marks the children so that
#: each reports its end to the batch.
BATCH_MARKER_TASK = "celery_ratchet.batch_done"
#: A progress report's link and errback: the batch releases its next report.
PROGRESS_ENDED_TASK = "celery_ratchet.batch_progress_ended"
#: An open batch all of whose children finished this long ago is finished by the orphan scan.
STALLED_AFTER_SECONDS = 10.0


def encode_signature(sig: Any) -> str:
    return str(kjson.dumps(dict(sig)))


def decode_signature(app: Celery, text: str | None) -> Signature | None:
    if not text:
        return None
    return signature(kjson.loads(text), app=app)


# -- chords: the result backend's side ------------------------------------------------------


def open_chord(app: Celery, group_id: str, body: Any) -> bool:
    """A chord is being applied: its batch, waiting for the header's size. True when this
    created the row (no run of the chord had one): see :func:`note_chord_opened`."""
    batches = ratchet_state(app).batches
    with joined(app) as unit:
        # Read where the row is written: a frozen chord applied twice in one transaction.
        existing = batches.get(group_id, unit)
        if existing is not None and existing.kind is BatchKind.BATCH:
            return False  # celery_ratchet.batch() opened it with its own callbacks
        # A frozen chord applied again reuses its id for a new run: start afresh.
        batches.open(
            NewBatch(group_id, BatchKind.CHORD, None, on_success=encode_signature(body)),
            restart=existing is not None,
            unit=unit,
        )
        _hand_replaced_job_to_body(app, body, unit)
    return existing is None


def _hand_replaced_job_to_body(app: Celery, body: Any, unit: Unit | None) -> None:
    """A task replaced by a group: Celery makes the group a chord whose body takes the
    task's id. The task's row, still RUNNING here, waits for that body instead; else the
    body, sent when the last member ends, could find it not yet finished (DuplicateJob)."""
    current = app.current_worker_task
    job_id = getattr(current.request, "id", None) if current is not None else None
    if job_id is None or job_id not in _signature_ids(app, body):
        return
    token = claim_of_current_job(app, job_id)
    if token is not None:
        ratchet_state(app).store.wait_in_place(job_id, token, unit)


def _signature_ids(app: Celery, sig: Any) -> set[str]:
    """The task ids a signature was frozen with: its own, and its tasks' (a chain's)."""
    sig = signature(sig, app=app)
    ids = {sig.options.get("task_id")}
    for inner in getattr(sig, "tasks", None) or ():
        ids |= _signature_ids(app, inner)
    return {i for i in ids if i}


def part_of(backend: Any, request: Any, state: str, result: Any) -> BatchPart | None:
    """The part a finished child of a chord or batch writes, or ``None`` if it is none."""
    group_id = getattr(request, "group", None)
    task_id = getattr(request, "id", None)
    if not group_id or not task_id or not getattr(request, "chord", None):
        return None
    try:
        encoded = backend.encode(backend.encode_result(result, state))
    except Exception as exc:  # the failure to encode must not lose the part
        encoded = backend.encode(backend.encode_result(repr(result), state))
        logger.warning("ratchet: result of %s stored as its repr in its batch: %s", task_id, exc)
    text = encoded.decode() if isinstance(encoded, bytes) else encoded
    return BatchPart(group_id, task_id, getattr(request, "group_index", None), state, text)


def on_part_return(backend: Any, request: Any, state: str, result: Any, token: str | None) -> None:
    """Celery's ``on_chord_part_return``: count the child (once), finish the batch if it
    was the last one. ``token``: the claim the reporting execution ran under."""
    part = part_of(backend, request, state, result)
    if part is None:
        return
    app = backend.app
    state_ = ratchet_state(app)
    batches = state_.batches
    if token is None or state_.store.holds(part.job_id, token):
        # Not written with an outcome: an eager run, a chain step failed by the step before
        # it, a task that ignores its result. An execution that lost its claim writes none.
        record = batches.record_part(part)
    else:
        record = batches.get(part.batch_id)
    if record is None:
        logger.warning(
            "ratchet: job %s belongs to chord %s, which the job store does not know (applied "
            "with another result backend?); its body cannot be sent",
            part.job_id,
            part.batch_id,
        )
        return
    if progress_owed(record):
        report_progress(app, record.batch_id)
    expected = record.expected
    if (
        record.state is BatchState.OPEN
        and expected is not None
        and record.progress.done >= expected
    ):
        finish(backend, record)


def finish(backend: Any, record: BatchRecord) -> None:
    """Complete a batch whose children all finished: exactly once, whoever calls it."""
    app = backend.app
    batches = ratchet_state(app).batches
    if record.kind is BatchKind.STREAM:  # its children may be millions: counters only
        _finish_stream(app, record)
        return
    parts = batches.parts(record.batch_id)
    if record.kind is BatchKind.BATCH:
        _finish_batch(app, record, parts)
        return
    callback = decode_signature(app, record.on_success)
    if callback is None:
        return
    try:
        results = _header_results(backend, record.batch_id, parts)
    except ChordError as exc:
        with batches.finishing(record.batch_id, BatchState.FAILED) as unit:
            won = unit is not None
        if won:
            logger.error("ratchet: chord %s failed: %s", record.batch_id, exc)
            backend.chord_error_from_stack(callback, exc)
        return

    def send_body() -> None:
        with batches.finishing(record.batch_id, BatchState.SUCCEEDED) as unit:
            if unit is not None:
                send_within(unit, lambda: callback.delay(results), JobType.WORKFLOW_JOIN)

    try:
        retrying_conflicts(send_body, f"body of chord {record.batch_id}")
    except Exception as exc:
        logger.exception("ratchet: body of chord %s not sent: %r", record.batch_id, exc)
        with batches.finishing(record.batch_id, BatchState.FAILED) as unit:
            won = unit is not None
        if won:
            backend.chord_error_from_stack(callback, ChordError(f"Callback error: {exc!r}"))


#: Batches built with ``celery_ratchet.batch()``: callbacks of their own, and progress.
_BUILT = (BatchKind.BATCH, BatchKind.STREAM)
#: A streaming batch's failure summary names at most this many failed children.
FAILED_IDS_SHOWN = 1000


def stream_summary(
    record: BatchRecord, progress: Progress, error: str | None = None
) -> dict[str, Any]:
    """What a streaming batch's callbacks get: its counts (never its children's results,
    which may be millions)."""
    total = record.expected
    summary = {
        "batch_id": record.batch_id,
        "name": record.name,
        "total": total,
        "written": record.written,
        "done": progress.done,
        "succeeded": progress.done - progress.failed,
        "failed": progress.failed,
        "percent_done": percent_done(progress.done, total) if total else 100.0,
    }
    if total is None:  # the stream never ended
        summary["percent_done"] = percent_done(progress.done, record.written)
    if error is not None:
        summary["error"] = error
    return summary


def fail_stream(
    app: Celery,
    record: BatchRecord,
    describe: Callable[[int], str],
    *,
    abandoned: bool = False,
) -> bool:
    """Fail a streaming batch that will get no more children and send ``on_failure`` with
    how many were written (``describe(written)`` is its error); False when it was complete
    already (or, ``abandoned``, when its producer renewed or ended it meanwhile)."""
    batches = ratchet_state(app).batches
    won = False

    def attempt() -> None:
        nonlocal won
        with batches.finishing(record.batch_id, BatchState.FAILED, abandoned=abandoned) as unit:
            won = unit is not None
            if unit is None:
                return
            # Read after the swap: no chunk can be added any more, the count is final.
            current = batches.get(record.batch_id) or record
            error = describe(current.written)
            summary = stream_summary(current, current.progress, error)
            summary["failed_ids"] = batches.failed_children(record.batch_id, FAILED_IDS_SHOWN)
            then = decode_signature(app, record.on_failure)
            if then is not None:
                send_within(unit, lambda: then.delay(summary), JobType.WORKFLOW_BRANCH)

    retrying_conflicts(attempt, f"failure of batch {record.batch_id}")
    if won:
        logger.error("ratchet: streaming batch %s (%s) FAILED", record.batch_id, record.name)
    return won


def _finish_stream(app: Celery, record: BatchRecord) -> None:
    batches = ratchet_state(app).batches
    summary = stream_summary(record, record.progress)
    if record.failed:
        state, then = BatchState.FAILED, decode_signature(app, record.on_failure)
        summary["failed_ids"] = batches.failed_children(record.batch_id, FAILED_IDS_SHOWN)
    else:
        state, then = BatchState.SUCCEEDED, decode_signature(app, record.on_success)

    def attempt() -> None:
        with batches.finishing(record.batch_id, state) as unit:
            if unit is not None and then is not None:
                send_within(unit, lambda: then.delay(summary), JobType.WORKFLOW_BRANCH)

    try:
        retrying_conflicts(attempt, f"outcome of batch {record.batch_id}")
    except Exception as exc:
        logger.exception("ratchet: outcome of batch %s not sent: %r", record.batch_id, exc)
        error = f"the batch's {state.value.lower()} callback was not sent: {exc!r}"
        fail_stream(app, record, lambda _written: error)
        return
    logger.info("ratchet: batch %s (%s) %s", record.batch_id, record.name or "", state.value)


#: Tries of a completion that lost a lock conflict: a deadlock, or a certification conflict
#: on Galera (error 1213 at COMMIT, whose transaction is rolled back whole).
CONFLICT_TRIES = 6


def retrying_conflicts(attempt: Callable[[], None], what: str) -> None:
    """Run ``attempt`` (a whole transaction: decide and send) again when the database rolled
    it back for a lock conflict. Once a concurrent finisher won, the decision finds the batch
    complete and sends nothing; any other conflict must not fail a healthy batch."""
    for tries in itertools.count(1):
        try:
            attempt()
            return
        except Exception as exc:
            if tries >= CONFLICT_TRIES or not is_retryable_conflict(exc):
                raise
            logger.info("ratchet: %s lost a lock conflict; trying again (%d)", what, tries)
            time.sleep(0.01 * tries)


def send_within(unit: Unit, send: Callable[[], Any], job_type: JobType) -> None:
    """Send what follows a decision of the store in the unit of work that wrote it: jobs
    of ``job_type`` (a chord's body joins its header; a batch's callbacks are branches)."""
    with sending_as(job_type):
        if not unit.sends_join:
            send()
            return
        with transaction(unit):
            send()


def _header_results(backend: Any, batch_id: str, parts: Sequence[BatchPart]) -> list[Any]:
    """The body's argument: the header's results in order; nested where the header holds
    groups (its shape was saved when the chord was applied)."""
    header = GroupResult.restore(batch_id, app=backend.app, backend=backend)
    if header is None:
        return [_unpack(backend, p) for p in parts]
    try:
        with allow_join_result():
            return list(header.join(timeout=backend.app.conf.result_chord_join_timeout))
    except Exception as exc:
        raise ChordError(f"Dependency of {batch_id} raised {exc!r}") from exc


def _unpack(backend: Any, part: BatchPart) -> Any:
    value = backend.decode(part.result) if part.result is not None else None
    if part.state in states.EXCEPTION_STATES:
        value = backend.exception_to_python(value)
    if part.state in states.PROPAGATE_STATES:
        error = ChordError(f"Dependency {part.job_id} raised {value!r}")
        if isinstance(value, BaseException):
            error.__cause__ = value
        raise error
    return value


def finish_stalled(app: Celery, older_than: float = STALLED_AFTER_SECONDS) -> int:
    """Finish batches all of whose children ended but that nobody finished: the node of the
    last child died in between, or the last children were revoked or never ran."""
    return finish_ready(app, ratchet_state(app).batches.unfinished_complete(older_than))


def finish_ready(app: Celery, batch_ids: Iterable[str]) -> int:
    batches = ratchet_state(app).batches
    finished = 0
    for batch_id in batch_ids:
        try:
            record = batches.get(batch_id)
            if record is None or record.state is not BatchState.OPEN:
                continue
            if not record.all_children_ended:
                continue
            logger.info("ratchet: finishing batch %s", batch_id)
            finish(app.backend, record)
            finished += 1
        except Exception:  # one batch must not keep the others from finishing
            logger.exception("ratchet: batch %s could not be finished", batch_id)
    return finished


# -- celery_ratchet.batch() ------------------------------------------------------------------


def _summary_payload(record: BatchRecord, progress: Progress, total: int) -> dict[str, Any]:
    return {
        "batch_id": record.batch_id,
        "name": record.name,
        "total": total,
        "done": progress.done,
        "succeeded": progress.done - progress.failed,
        "failed": progress.failed,
        "percent_done": percent_done(progress.done, total) if total else 100.0,
    }


def progress_owed(record: BatchRecord) -> bool:
    """Whether the batch's count reached a whole percent its progress reports lack."""
    return (
        record.kind in _BUILT
        and bool(record.on_progress)
        and bool(record.expected)
        and percent_reached(record.done, record.expected or 0) > record.progress_written
    )


def report_progress(app: Celery, batch_id: str) -> None:
    """Write the batch's progress reports owed, each whole percent once, and release the
    next one due (see :mod:`celery_ratchet.store.batch_progress`). Advisory: a failure is
    logged, never raised to the child that ended; the housekeeping writes them later."""
    state = ratchet_state(app)
    stored: list[Callable[[], None]] = []

    def make(record: BatchRecord, due: Sequence[tuple[int, int]]) -> list[NewJob]:
        stored.clear()  # a try the database rolled back (a lock conflict) made them too
        callback = decode_signature(app, record.on_progress)
        if callback is None:
            return []
        total = record.expected or 0
        reports = []
        for percent, done in due:
            progress = Progress(done, min(record.failed, done))
            jobs, on_stored = _built(
                app, _progress_report(app, callback, record, percent, progress, total)
            )
            reports += jobs
            stored.extend(on_stored)
        return reports

    try:
        writes = state.batches.write_progress(batch_id, make, _report_id)
    except Exception as exc:  # progress is advisory: never fail the child for it
        logger.warning("ratchet: progress of batch %s not reported now: %s", batch_id, exc)
        return
    for published in stored:  # after the commit: after_task_publish, task-sent
        published()
    if writes.released:
        state.published(sorted(set(writes.released)))


def progress_ended(app: Celery, batch_id: str, percent: int) -> None:
    """The batch's report at ``percent`` ended (its link, or its errback): release the next."""
    state = ratchet_state(app)
    try:
        released = state.batches.progress_ended(batch_id, percent, _report_id)
    except Exception as exc:  # the housekeeping releases it later
        logger.warning(
            "ratchet: the progress report after %d%% of batch %s not released now: %s",
            percent, batch_id, exc,
        )  # fmt: skip
        return
    if released:
        state.published(sorted(set(released)))


def report_lagging_progress(app: Celery) -> None:
    """Housekeeping: reports that ended without saying so, and reports never written."""
    for batch_id in ratchet_state(app).batches.progress_behind():
        report_progress(app, batch_id)


def _report_id(record: BatchRecord, percent: int) -> str:
    """The report's id, from the id the progress callback was frozen with at submit."""
    stored = kjson.loads(record.on_progress or "{}")
    return progress_report_id(str((stored.get("options") or {}).get("task_id")), percent)


def _progress_report(
    app: Celery,
    callback: Signature,
    record: BatchRecord,
    percent: int,
    progress: Progress,
    total: int,
) -> Signature:
    """The report at ``percent``: the callback with the summary, under the report's own id,
    telling the batch when it ends, whichever way."""
    report = callback.clone(args=(_summary_payload(record, progress, total),))
    report.set(task_id=progress_report_id(str(callback.id), percent))
    ended = app.signature(
        PROGRESS_ENDED_TASK, kwargs={"batch_id": record.batch_id, "percent": percent}
    )
    report.link(ended)
    report.link_error(ended)
    return report


def _built(app: Celery, sig: Signature) -> tuple[list[NewJob], list[Callable[[], None]]]:
    """The jobs Celery's own send path makes of ``sig``, not written."""
    batch = JobBatch(app)
    sig.apply_async(producer=batch)
    jobs, waiting, on_stored = batch.take()
    return jobs + waiting, on_stored


def _finish_batch(app: Celery, record: BatchRecord, parts: Sequence[BatchPart]) -> None:
    failed = [p for p in parts if p.state in FAILED_STATES]
    state = BatchState.FAILED if failed else BatchState.SUCCEEDED
    progress = Progress(done=len(parts), failed=len(failed))
    summary = _summary_payload(record, progress, record.expected or len(parts))
    try:
        retrying_conflicts(
            lambda: _send_batch_outcome(app, record, parts, failed, summary, state),
            f"outcome of batch {record.batch_id}",
        )
    except Exception as exc:
        logger.exception("ratchet: outcome of batch %s not sent: %r", record.batch_id, exc)
        summary["failed_ids"] = [p.job_id for p in failed]
        summary["error"] = f"the batch's {state.value.lower()} callback was not sent: {exc!r}"
        with ratchet_state(app).batches.finishing(record.batch_id, BatchState.FAILED) as unit:
            then = decode_signature(app, record.on_failure)
            if unit is not None and then is not None:
                send_within(unit, lambda: then.delay(summary), JobType.WORKFLOW_BRANCH)
        return
    logger.info("ratchet: batch %s (%s) %s", record.batch_id, record.name or "", state.value)


def _send_batch_outcome(
    app: Celery,
    record: BatchRecord,
    parts: Sequence[BatchPart],
    failed: Sequence[BatchPart],
    summary: dict[str, Any],
    state: BatchState,
) -> None:
    backend = app.backend
    with ratchet_state(app).batches.finishing(record.batch_id, state) as unit:
        if unit is None:
            return
        argument: Any
        if failed:
            summary["failed_ids"] = [p.job_id for p in failed]
            then, argument = decode_signature(app, record.on_failure), summary
        else:
            results = [backend.decode(p.result) if p.result else None for p in parts]
            then, argument = decode_signature(app, record.on_success), results
        if then is not None:
            send_within(unit, lambda: then.delay(argument), JobType.WORKFLOW_BRANCH)


def batch_progress(app: Celery, batch_id: str) -> BatchSummary:
    """The batch's progress as the job store counts it; LookupError when it is not there."""
    found = ratchet_state(app).batches.summaries(batch_id=batch_id, limit=1)
    if not found:
        raise LookupError(f"batch {batch_id} is not in the job store")
    return found[0]


def register_tasks(app: Celery) -> None:
    @app.task(name=BATCH_MARKER_TASK, shared=False)
    def batch_done(batch_id: str, *args: Any) -> None:
        """Never sent: a batch's completion is decided in the job store."""
        logger.warning("ratchet: batch marker for %s ran; nothing to do", batch_id)

    @app.task(name=PROGRESS_ENDED_TASK, shared=False, bind=True)
    def batch_progress_ended(self: Any, *args: Any, batch_id: str, percent: int) -> None:
        """A progress report's link and errback: Celery calls an errback of more than one
        argument in the process that ran the report, and the send of a link is taken by the
        sender (``amqp``) and done there too: never stored as a job."""
        progress_ended(self.app, batch_id, percent)
