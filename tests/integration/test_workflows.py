"""Chains, chords, batches and workflows stored in the database, run by a real worker."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.exceptions import ChordError, TaskRevokedError
from sqlalchemy import create_engine, text

import celery_ratchet
from celery_ratchet.celery.canvas.batches import encode_signature, finish_stalled
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.batch import BatchKind, BatchPart, BatchState, NewBatch
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.errors import PredicateNotAllowed, RatchetError
from celery_ratchet.store.engine import normalize_url
from tests.integration.tasks import FIXED, RUNS

TIMEOUT = 30


def _wait(predicate: Any, timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _status(app: Celery, job_id: str) -> JobStatus | None:
    job = ratchet_state(app).store.result(job_id)
    return None if job is None else job.status


def test_chain_steps_are_stored_at_submission_and_released_in_turn(worker_app: Celery) -> None:
    add, sleep = worker_app.tasks["t.add"], worker_app.tasks["t.sleep"]
    result = chain(sleep.si(0.5), add.si(1, 2), add.s(10), add.s(100)).apply_async()
    step_ids = [result.parent.parent.id, result.parent.id, result.id]
    # The later steps exist already, waiting for the step before them.
    assert [_status(worker_app, i) for i in step_ids] == [JobStatus.WAITING] * 3
    assert result.get(timeout=TIMEOUT) == 113
    assert all(_status(worker_app, i) is JobStatus.SUCCEEDED for i in step_ids)


def test_a_failed_step_revokes_the_steps_after_it(worker_app: Celery) -> None:
    add, fail = worker_app.tasks["t.add"], worker_app.tasks["t.fail"]
    result = chain(add.si(1, 1), fail.si("middle"), add.si(2, 2), add.si(3, 3)).apply_async()
    with pytest.raises(ValueError, match="middle"):
        result.get(timeout=TIMEOUT)  # the last step raises the failure that cancelled it
    assert result.state == "REVOKED"
    assert result.parent.state == "REVOKED"
    assert result.parent.parent.state == "FAILURE"
    assert _status(worker_app, result.id) is JobStatus.REVOKED


def test_chord_body_gets_ordered_results_once(worker_app: Celery) -> None:
    add, collect = worker_app.tasks["t.add"], worker_app.tasks["t.collect"]
    key = f"chord-{time.monotonic()}"
    result = chord(add.si(i, 0) for i in range(40))(collect.s(key))
    assert result.get(timeout=TIMEOUT) == list(range(40))
    time.sleep(0.5)
    assert RUNS[key] == [list(range(40))]
    summary = ratchet_state(worker_app).batches.summaries(batch_id=result.parent.id)[0]
    assert (summary.state, summary.done, summary.total) == (BatchState.SUCCEEDED, 40, 40)


def test_chord_with_a_failing_header_fails_its_body(worker_app: Celery) -> None:
    add, fail, tsum = (worker_app.tasks[n] for n in ("t.add", "t.fail", "t.tsum"))
    result = chord([add.si(1, 1), fail.si("header"), add.si(2, 2)])(tsum.s())
    # The body fails with a ChordError; get() may see the failed header first (as in Celery).
    with pytest.raises((ChordError, ValueError), match="header"):
        result.get(timeout=TIMEOUT)
    batches = ratchet_state(worker_app).batches
    _wait(lambda: batches.summaries(batch_id=result.parent.id)[0].state is BatchState.FAILED)


def test_nested_canvas(worker_app: Celery) -> None:
    add, tsum = worker_app.tasks["t.add"], worker_app.tasks["t.tsum"]
    collect_all = worker_app.tasks["t.identity"]
    # a chord inside a chain, a group inside a chain, a chain inside a group
    inner = chain(add.si(1, 1), chord([add.s(1), add.s(2)], tsum.s()), add.s(100))
    assert inner.apply_async().get(timeout=TIMEOUT) == 107
    grouped = group(chain(add.si(1, 1), add.s(1)), chain(add.si(2, 2), add.s(2)))
    assert grouped.apply_async().get(timeout=TIMEOUT) == [3, 6]
    # a chord whose header is a chain ending in a group: the body gets the nested shape
    nested = chord(group(chain(add.si(40, 2), group(add.s(0), add.s(0)))), tsum.si([]))
    header = chord(group(chain(add.si(40, 2), group(add.s(0), add.s(0)))), collect_all.s())
    assert header.delay().get(timeout=TIMEOUT) == [[42, 42]]
    assert nested.delay().get(timeout=TIMEOUT) == 0


def test_batch_builder_reports_progress_and_success(worker_app: Celery) -> None:
    times, collect = worker_app.tasks["t.times"], worker_app.tasks["t.collect"]
    key = f"batch-{time.monotonic()}"
    submitted = (
        celery_ratchet.batch("Multiply", app=worker_app)
        .for_each(range(50), lambda i: times.s(i, 2))
        .on_progress(collect.s(key + "-progress"))
        .on_success(collect.s(key))
        .on_failure(collect.s(key + "-failed"))
        .submit()
    )
    assert submitted.results.get(timeout=TIMEOUT) == [i * 2 for i in range(50)]
    _wait(lambda: RUNS[key])
    assert RUNS[key] == [[i * 2 for i in range(50)]]
    progress = submitted.progress()
    assert (progress.state, progress.percent_done, progress.name) == (
        BatchState.SUCCEEDED,
        100.0,
        "Multiply",
    )
    reports = _wait(lambda: RUNS[key + "-progress"])
    assert all(0 < r["percent_done"] <= 100 for r in reports)
    assert RUNS[key + "-failed"] == []


def test_batch_builder_failure_names_the_failed_children(worker_app: Celery) -> None:
    add, fail, collect = (worker_app.tasks[n] for n in ("t.add", "t.fail", "t.collect"))
    key = f"batch-fail-{time.monotonic()}"
    submitted = (
        celery_ratchet.batch("Mixed", app=worker_app)
        .add(add.si(1, 1), fail.si("child"), add.si(2, 2))
        .on_success(collect.s(key + "-ok"))
        .on_failure(collect.s(key))
        .submit()
    )
    report = _wait(lambda: RUNS[key])[0]
    assert (report["failed"], report["succeeded"], report["total"]) == (1, 2, 3)
    assert report["failed_ids"] == [submitted.results.results[1].id]
    assert RUNS[key + "-ok"] == []
    assert submitted.progress().state is BatchState.FAILED


def test_workflow_fires_matching_branches_and_joins(worker_app: Celery) -> None:
    add, collect, tsum = (worker_app.tasks[n] for n in ("t.add", "t.collect", "t.tsum"))
    key = f"wf-{time.monotonic()}"
    submitted = (
        celery_ratchet.workflow(add.si(100, 50), app=worker_app)
        .on_success(add.s(1), name="plus")
        .on_failure(collect.si("failed", key + "-failed"))
        .when_result("tests.integration.tasks:is_big", add.s(2), name="big")
        .when_result("tests.integration.tasks:is_big", add.s(-1000), name="never")
        .join(["plus", "big"], tsum.s())
        .submit()
    )
    assert submitted.parent.get(timeout=TIMEOUT) == 150
    assert submitted.branches["plus"].get(timeout=TIMEOUT) == 151
    assert submitted.branches["big"].get(timeout=TIMEOUT) == 152
    conditions = ratchet_state(worker_app).batches.conditions(submitted.id)
    assert [c.state for c in conditions] == ["FIRED", "SKIPPED", "FIRED", "FIRED", "FIRED"]
    assert RUNS[key + "-failed"] == []


#: The order in which the workflow's conditions below were evaluated.
EVALUATED: list[str] = []


@celery_ratchet.predicate
def noted_low(result: Any) -> bool:
    EVALUATED.append("low")
    return True


@celery_ratchet.predicate
def noted_high(result: Any) -> bool:
    EVALUATED.append("high")
    return True


def test_conditions_are_evaluated_in_the_order_they_were_declared(worker_app: Celery) -> None:
    """The seeds evaluate conditions "in priority order": here the order of declaration is
    their priority (docs/seed-semantics.md); every condition that holds fires its branch."""
    add = worker_app.tasks["t.add"]
    del EVALUATED[:]
    module = __name__
    submitted = (
        celery_ratchet.workflow(add.si(1, 1), app=worker_app)
        .when_result(f"{module}:noted_high", add.s(1), name="first")
        .when_result(f"{module}:noted_low", add.s(2), name="second")
        .when_result(f"{module}:noted_high", add.s(3), name="third")
        .submit()
    )
    results = [submitted.branches[n].get(timeout=TIMEOUT) for n in ("first", "second", "third")]
    assert results == [3, 4, 5]
    assert EVALUATED == ["high", "low", "high"]


def test_workflow_failure_branch(worker_app: Celery) -> None:
    fail, collect = worker_app.tasks["t.fail"], worker_app.tasks["t.collect"]
    key = f"wf-fail-{time.monotonic()}"
    submitted = (
        celery_ratchet.workflow(fail.si("parent"), app=worker_app)
        .on_success(collect.si("ok", key))
        .on_failure(collect.si("failed", key))
        .submit()
    )
    _wait(lambda: RUNS[key])
    time.sleep(0.3)
    assert RUNS[key] == ["failed"]
    states = [c.state for c in ratchet_state(worker_app).batches.conditions(submitted.id)]
    assert states == ["SKIPPED", "FIRED"]


def test_workflow_refuses_bad_predicates_and_joins(worker_app: Celery) -> None:
    add = worker_app.tasks["t.add"]
    builder = celery_ratchet.workflow(add.si(1, 1), app=worker_app)
    for path in (
        "os:system",
        "builtins:eval",
        "subprocess:getoutput",
        "tests.integration.tasks:is_small",  # importable, but never allowed
        "tests.integration.tasks:no_such_function",
    ):
        with pytest.raises(PredicateNotAllowed, match=r"@celery_ratchet\.predicate"):
            builder.when_result(path, add.s(1))
    with pytest.raises(ValueError, match=r"package\.module:function"):
        builder.when_result("is_big", add.s(1))
    with pytest.raises(ValueError, match="unknown"):
        builder.join(["nope"], add.s(1))


@pytest.mark.parametrize(
    "forged", ["os:system", "builtins:eval", "tests.integration.tasks:is_small", "os.system"]
)
def test_a_forged_predicate_in_a_stored_row_fails_its_branch_unrun(
    worker_app: Celery, tmp_path: Any, forged: str
) -> None:
    identity, add = worker_app.tasks["t.identity"], worker_app.tasks["t.add"]
    marker = tmp_path / "predicate-ran"
    command = f"touch {marker}"  # what os.system or eval would be handed: the parent's result
    parent = identity.si(command if forged == "os:system" else f"open({str(marker)!r}, 'w')")
    # Submitted in the caller's transaction: the rows are forged before any worker sees them.
    engine = create_engine(normalize_url(ratchet_state(worker_app).store.url))
    try:
        with engine.begin() as conn:
            with celery_ratchet.transaction(conn):
                submitted = (
                    celery_ratchet.workflow(parent, app=worker_app)
                    .when_result("tests.integration.tasks:is_big", add.s(1), name="checked")
                    .on_success(identity.s(), name="plain")
                    .submit()
                )
            conn.execute(
                text(
                    "UPDATE scheduler_workflow_condition SET predicate = :p "
                    "WHERE parent_id = :i AND kind = 'RESULT'"
                ),
                {"p": forged, "i": submitted.id},
            )
    finally:
        engine.dispose()
    checked = submitted.branches["checked"]
    with pytest.raises(RatchetError, match=re.escape(forged)):  # not allowed, or no path
        checked.get(timeout=TIMEOUT)
    assert isinstance(checked.result, RatchetError)
    assert not marker.exists(), f"the forged predicate {forged} ran"
    assert submitted.branches["plain"].get(timeout=TIMEOUT) == parent.args[0]
    states = [c.state for c in ratchet_state(worker_app).batches.conditions(submitted.id)]
    assert states == ["FAILED", "FIRED"]
    # The branch's own task was never sent: its row is the refusal, not a run.
    record = ratchet_state(worker_app).store.result(checked.id)
    assert record is not None and record.status is JobStatus.FAILED
    assert record.picked_by is None


def test_waiting_steps_read_as_pending_with_extended_results(worker_app: Celery) -> None:
    sleep, add = worker_app.tasks["t.sleep"], worker_app.tasks["t.add"]
    worker_app.conf.result_extended = True
    try:
        result = chain(sleep.si(0.3), add.si(1, 1)).apply_async()
        assert result.state == "PENDING"  # a WAITING row reads like any pending job
        assert result.get(timeout=TIMEOUT) == 2
        assert result.args == [1, 1]
    finally:
        worker_app.conf.result_extended = False


def test_revoking_a_pending_chord_child_fails_the_chord(worker_app: Celery) -> None:
    add, tsum = worker_app.tasks["t.add"], worker_app.tasks["t.tsum"]
    later = add.si(2, 2).set(countdown=60)
    result = chord([add.si(1, 1), later])(tsum.s())
    _wait(lambda: _status(worker_app, result.parent.results[0].id) is JobStatus.SUCCEEDED)
    worker_app.control.revoke(result.parent.results[1].id)
    # The body fails with a ChordError; get() raises the failed header's error first.
    with pytest.raises((ChordError, TaskRevokedError)):
        result.get(timeout=TIMEOUT)
    batches = ratchet_state(worker_app).batches
    _wait(lambda: batches.summaries(batch_id=result.parent.id)[0].state is BatchState.FAILED)
    summary = batches.summaries(batch_id=result.parent.id)[0]
    assert (summary.done, summary.failed) == (2, 1)


def test_revoking_a_running_step_without_terminate_lets_the_chain_go_on(
    worker_app: Celery,
) -> None:
    sleep, add = worker_app.tasks["t.sleep"], worker_app.tasks["t.add"]
    result = chain(sleep.si(1.0), add.si(1, 1), add.s(1)).apply_async()
    first = result.parent.parent.id
    _wait(lambda: _status(worker_app, first) is JobStatus.RUNNING)
    worker_app.control.revoke(first)  # no terminate: a running job runs to its end
    assert result.get(timeout=TIMEOUT) == 3


def test_a_failed_step_retried_from_the_dlq_resumes_its_chain(worker_app: Celery) -> None:
    repair, add = worker_app.tasks["t.fail_until_fixed"], worker_app.tasks["t.add"]
    key = f"step-{time.monotonic()}"
    result = chain(repair.si(key), add.si(1, 1), add.s(10)).apply_async()
    with pytest.raises(RuntimeError):
        result.get(timeout=TIMEOUT)
    assert result.state == "REVOKED"
    FIXED.add(key)
    assert celery_ratchet.dlq(worker_app).retry(result.parent.parent.id) == 1
    _wait(lambda: _status(worker_app, result.id) is JobStatus.SUCCEEDED)
    assert worker_app.AsyncResult(result.id).get(timeout=TIMEOUT) == 12


def test_a_chord_body_that_cannot_be_sent_fails_the_chord(worker_app: Celery) -> None:
    big, collect = worker_app.tasks["t.big"], worker_app.tasks["t.collect"]
    # Each result fits; the body's argument (all of them) is over ratchet_max_payload_kb.
    result = chord(big.si(60_000) for _ in range(3))(collect.s("never"))
    with pytest.raises(ChordError, match="Callback error"):
        result.get(timeout=TIMEOUT)
    summary = ratchet_state(worker_app).batches.summaries(batch_id=result.parent.id)[0]
    assert summary.state is BatchState.FAILED


def test_a_batch_whose_success_callback_cannot_be_sent_reports_failure(
    worker_app: Celery,
) -> None:
    big, collect = worker_app.tasks["t.big"], worker_app.tasks["t.collect"]
    key = f"batch-unsendable-{time.monotonic()}"
    submitted = (
        celery_ratchet.batch("Too big", app=worker_app)
        .for_each(range(3), lambda _: big.si(60_000))
        .on_success(collect.s(key + "-ok"))
        .on_failure(collect.s(key))
        .submit()
    )
    report = _wait(lambda: RUNS[key])[0]
    assert "callback was not sent" in report["error"] and report["failed"] == 0
    assert submitted.progress().state is BatchState.FAILED


def test_a_chord_sent_in_the_callers_transaction(worker_app: Celery) -> None:
    add, tsum = worker_app.tasks["t.add"], worker_app.tasks["t.tsum"]
    engine = ratchet_state(worker_app).store.engine
    with engine.connect() as conn:
        conn = conn.execution_options(
            isolation_level="SERIALIZABLE" if conn.dialect.name == "sqlite" else "READ COMMITTED"
        )
        with conn.begin(), celery_ratchet.transaction(conn):
            result = chord(add.si(i, i) for i in range(5))(tsum.s())
    assert result.get(timeout=TIMEOUT) == 20


def test_ping_is_answered_by_the_workers(worker_app: Celery) -> None:
    replies = worker_app.control.inspect(timeout=1).ping()
    assert replies and all(r == {"ok": "pong"} for r in replies.values())


def test_replace_inside_a_chain_and_a_chord(worker_app: Celery) -> None:
    replace, add, tsum = (worker_app.tasks[n] for n in ("t.replace_with_add", "t.add", "t.tsum"))
    assert chain(replace.s(1), add.s(10)).apply_async().get(timeout=TIMEOUT) == 12
    assert chord([replace.s(1), replace.s(2)])(tsum.s()).get(timeout=TIMEOUT) == 5


def test_link_and_link_error_callbacks(worker_app: Celery) -> None:
    add, fail, collect = (worker_app.tasks[n] for n in ("t.add", "t.fail", "t.collect"))
    key = f"links-{time.monotonic()}"
    add.apply_async((2, 2), link=collect.s(key + "-ok"))
    fail.apply_async(("linked",), link_error=collect.si("errback", key + "-err"))
    assert _wait(lambda: RUNS[key + "-ok"]) == [4]
    assert _wait(lambda: RUNS[key + "-err"]) == ["errback"]


def test_a_chord_cut_short_by_a_dead_node_is_finished_once(worker_app: Celery) -> None:
    """The node of the last child died between the child's outcome (with its part) and
    sending the body: the batch is OPEN with every part in; housekeeping finishes it."""
    collect = worker_app.tasks["t.collect"]
    key = f"stalled-{time.monotonic()}"
    body = collect.s(key)
    body.freeze()
    batches = ratchet_state(worker_app).batches
    batch_id = f"stalled-{uuid.uuid4().hex}"
    batches.open(NewBatch(batch_id, BatchKind.CHORD, 2, on_success=encode_signature(body)))
    for i in (0, 1):
        batches.record_part(BatchPart(batch_id, f"{batch_id}-{i}", i, "SUCCESS", str(i + 1)))
    assert finish_stalled(worker_app, older_than=-60) == 1
    assert finish_stalled(worker_app, older_than=-60) == 0  # finished: never twice
    assert _wait(lambda: RUNS[key]) == [[1, 2]]
    assert worker_app.AsyncResult(body.id).get(timeout=TIMEOUT) == [1, 2]
    time.sleep(0.5)
    assert RUNS[key] == [[1, 2]]
