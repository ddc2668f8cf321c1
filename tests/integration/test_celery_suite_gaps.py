"""Behaviours Celery's own integration suite (t/integration) expects of a worker, found
missing when that suite ran against ratchet: each test here failed before its fix."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from celery import Celery, chord, group
from celery.canvas import StampingVisitor
from celery.exceptions import TaskRevokedError
from celery.worker import state as worker_state

import celery_ratchet
from celery_ratchet.celery.compat import message_ignore_result_overrides_task
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.errors import PayloadTooLarge
from tests.helpers import wait_until
from tests.integration.conftest import BrokerTrap, make_app
from tests.integration.tasks import RUNS

TIMEOUT = 30


class _Stamp(StampingVisitor):
    def __init__(self, value: str) -> None:
        self.value = value

    def on_signature(self, sig: Any, **headers: Any) -> dict[str, Any]:
        return {"monitoring_id": self.value}


@pytest.mark.parametrize("through", ["control", "result"])
def test_a_job_sent_right_after_a_revoke_by_stamped_headers_is_revoked(
    worker_app: Celery, through: str
) -> None:
    # The worker reads broadcasts between claims: the revoke must have reached it before
    # the call returns, or the job sent next runs. AsyncResult's form passes timeout=None.
    add = worker_app.tasks["t.add"]
    stamps = [uuid4().hex for _ in range(3)]
    try:
        for stamp in stamps:
            signature = add.si(1, 1)
            signature.stamp(visitor=_Stamp(stamp))
            if through == "control":
                worker_app.control.revoke_by_stamped_headers({"monitoring_id": [stamp]})
            else:
                signature.freeze().revoke_by_stamped_headers({"monitoring_id": [stamp]})
            result = signature.apply_async()
            with pytest.raises(TaskRevokedError):
                result.get(timeout=TIMEOUT)
            assert result.state == "REVOKED"
    finally:
        kept = [s for s in worker_state.revoked_stamps.get("monitoring_id", []) if s not in stamps]
        worker_state.revoked_stamps["monitoring_id"] = kept


def test_a_task_replaced_by_a_chain_gets_its_result_when_the_chain_outruns_it(
    worker_app: Celery,
) -> None:
    # The chain's first step ends, and sends the step that takes the replaced task's id,
    # while the replaced task still runs: that id was taken by a RUNNING row (DuplicateJob).
    result = worker_app.tasks["t.replace_with_chain_and_linger"].delay(20)
    assert result.get(timeout=TIMEOUT) == 42


def test_a_group_chained_after_a_failure_fails_with_it(worker_app: Celery) -> None:
    add, fail = worker_app.tasks["t.add"], worker_app.tasks["t.fail"]
    result = (add.s(1, 1) | fail.s() | group(add.s(1), add.s(1))).delay()
    with pytest.raises(ValueError, match="2"):
        result.get(timeout=TIMEOUT)
    # get() raises at the first failed member; the worker stores the others one by one.
    wait_until(
        lambda: [member.state for member in result.results] == ["FAILURE", "FAILURE"],
        TIMEOUT,
        "both members of the group to fail",
    )


def test_a_result_sent_with_ignore_result_reads_pending_as_stock(worker_app: Celery) -> None:
    add = worker_app.tasks["t.add"]
    sent = add.apply_async((1, 2), ignore_result=True)
    store = ratchet_state(worker_app).store

    def finished() -> bool:
        record = store.result(sent.id)
        return record is not None and record.status is JobStatus.SUCCEEDED

    wait_until(finished, TIMEOUT, "the job to succeed")
    fresh = worker_app.AsyncResult(sent.id)
    assert (fresh.state, fresh.result) == ("PENDING", None)
    stored = add.delay(1, 2)
    assert stored.get(timeout=TIMEOUT) == 3
    assert worker_app.AsyncResult(stored.id).state == "SUCCESS"


def test_a_task_that_ignores_its_result_reads_pending_when_sent_by_name(
    worker_app: Celery,
) -> None:
    if not message_ignore_result_overrides_task():
        # Celery before 5.6 reads the task's ignore_result once, when its worker builds the
        # task's tracer: switched on afterwards, as here, stock stores the result too.
        pytest.skip("Celery < 5.6 fixes a task's ignore_result when its worker starts")
    add = worker_app.tasks["t.add"]
    store = ratchet_state(worker_app).store
    add.ignore_result = True
    try:
        sent = worker_app.send_task("t.add", args=(1, 2))

        def finished() -> bool:
            record = store.result(sent.id)
            return record is not None and record.status is JobStatus.SUCCEEDED

        wait_until(finished, TIMEOUT, "the job to succeed")
        assert worker_app.AsyncResult(sent.id).state == "PENDING"
    finally:
        add.ignore_result = False


@pytest.mark.parametrize("state", ["STARTED", "PROGRESS"])
def test_a_state_stored_for_a_task_another_process_runs_is_read_and_kept_by_a_revoke(
    worker_app: Celery, state: str
) -> None:
    # Another worker (not ratchet's) runs `started` and reports through this backend: the
    # revoke reaches the ratchet worker, which must leave that state to its owner.
    backend = worker_app.backend
    started, not_started = str(uuid4()), str(uuid4())
    backend.store_result(started, {"hostname": "other@host"}, state)
    assert worker_app.AsyncResult(started).state == state
    assert worker_app.AsyncResult(started).result == {"hostname": "other@host"}

    assert worker_app.control.revoke([started, not_started], reply=True, timeout=10, limit=1)

    assert backend.get_state(started) == state
    if _revoke_marks_unknown_tasks():  # Celery 5.7's handler; older ones leave them PENDING
        assert backend.get_state(not_started) == "REVOKED"
    backend.store_result(started, 5, "SUCCESS")
    assert worker_app.AsyncResult(started).get(timeout=TIMEOUT) == 5


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_a_retry_stored_for_a_task_another_process_runs_is_read_back(
    worker_app: Celery, serializer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another worker reports a retry through this backend, as it would to Redis: the state
    # and its exception are read back, and the result it reaches later replaces them. With
    # pickled results Celery hands the exception itself over, which JSON cannot hold.
    backend = worker_app.backend
    monkeypatch.setattr(backend, "serializer", serializer)
    elsewhere = str(uuid4())
    backend.store_result(elsewhere, KeyError("try again"), "RETRY", traceback="tb")
    fresh = worker_app.AsyncResult(elsewhere)
    assert fresh.state == "RETRY"
    assert isinstance(fresh.result, KeyError) and fresh.result.args == ("try again",)
    assert fresh.traceback == "tb"
    monkeypatch.undo()  # the result comes from a process that sends JSON, as this one
    backend.store_result(elsewhere, 7, "SUCCESS")
    assert worker_app.AsyncResult(elsewhere).get(timeout=TIMEOUT) == 7


def _revoke_marks_unknown_tasks() -> bool:
    """Whether Celery's revoke handler marks a task it does not hold REVOKED in the backend."""
    import inspect

    from celery.worker import control

    return "mark_as_revoked" in inspect.getsource(control)


@pytest.mark.parametrize("final", ["SUCCESS", "FAILURE"])
def test_a_state_stored_from_outside_after_the_job_finished_changes_nothing(
    worker_app: Celery, final: str
) -> None:
    # As stock: a state that comes after the result (a redelivery elsewhere) is ignored.
    add = worker_app.tasks["t.add"]
    sent = add.delay(2, 3) if final == "SUCCESS" else add.delay("x", 1)
    with contextlib.suppress(TypeError):
        sent.get(timeout=TIMEOUT)
    worker_app.backend.store_result(sent.id, {"hostname": "other@host"}, "STARTED")
    fresh = worker_app.AsyncResult(sent.id)
    assert fresh.state == final
    if final == "SUCCESS":
        assert fresh.result == 5


def test_an_eager_run_stores_no_interim_state_and_needs_no_store(
    broker_trap: BrokerTrap,
) -> None:
    app = make_app(
        "postgresql+psycopg://postgres@127.0.0.1:1/nowhere",
        broker_trap.url,
        task_always_eager=True,
    )
    RUNS["eager-progress"] = ["go"]
    assert app.tasks["t.progress"].delay("eager-progress").get(timeout=TIMEOUT) == "finished"


def test_a_state_stored_from_outside_leaves_a_job_of_the_store_as_it_is(
    worker_app: Celery,
) -> None:
    add = worker_app.tasks["t.add"]
    sent = add.apply_async((1, 2), countdown=3600)
    worker_app.backend.store_result(sent.id, {"hostname": "other@host"}, "STARTED")
    assert worker_app.AsyncResult(sent.id).state == "PENDING"
    record = ratchet_state(worker_app).store.result(sent.id)
    assert record is not None and record.status is JobStatus.PENDING
    sent.revoke()
    assert worker_app.AsyncResult(sent.id).state == "REVOKED"


def _members_that_wait_for_the_first(app: Celery, size: int, ran: list[bool]) -> Iterator[Any]:
    """Yields ``size`` adds; before the last, waits until the first has run: it cannot when
    the members are written only once the generator is exhausted."""
    add = app.tasks["t.add"]
    first = add.s(0, 0).freeze()
    yield add.s(0, 0).set(task_id=first.id)
    for i in range(1, size):
        if i == size - 1:
            ran.append(_finished_within(app, first.id, TIMEOUT))
        yield add.s(i, 0)


def _finished_within(app: Celery, job_id: str, timeout: float) -> bool:
    store = ratchet_state(app).store
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = store.result(job_id)
        if record is not None and record.status is JobStatus.SUCCEEDED:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("size", [3, 5])
def test_a_chord_of_a_generator_runs_its_first_members_while_the_rest_are_produced(
    worker_app: Celery, size: int
) -> None:
    ran: list[bool] = []
    header = _members_that_wait_for_the_first(worker_app, size, ran)
    result = chord(header, worker_app.tasks["t.tsum"].s()).delay()
    assert result.get(timeout=TIMEOUT) == size * (size - 1) // 2
    assert ran == [True], "the chord's header was written only once it was all produced"


def test_a_group_of_a_generator_runs_its_first_members_while_the_rest_are_produced(
    worker_app: Celery,
) -> None:
    ran: list[bool] = []
    result = group(_members_that_wait_for_the_first(worker_app, 4, ran)).delay()
    assert result.get(timeout=TIMEOUT) == [0, 1, 2, 3]
    assert ran == [True]


def test_a_chain_to_a_chord_of_a_thousand_runs_within_the_default_payload_limit(
    worker_app: Celery,
) -> None:
    # The chain's first message carries the chord's whole header (about 240 KB).
    add, tsum = worker_app.tasks["t.add"], worker_app.tasks["t.tsum"]
    workflow = add.si(1, 0) | group(add.s(0) for _ in range(1000)) | tsum.s()
    assert workflow.delay().get(timeout=120) == 1000


PARKED = "parked"  # no worker consumes it: the rows stay as written


def _written(app: Celery, ids: set[str]) -> set[str]:
    store = ratchet_state(app).store
    return {i for i in ids if store.result(i) is not None}


def test_a_group_of_a_generator_sent_through_a_bulk_is_written_with_it(
    worker_app: Celery,
) -> None:
    add = worker_app.tasks["t.add"]
    sent: set[str] = set()
    with (
        pytest.raises(RuntimeError, match="abandoned"),
        celery_ratchet.bulk(worker_app) as producer,
    ):
        sent.add(add.apply_async((1, 1), queue=PARKED, producer=producer).id)
        members = (add.s(i, i).set(queue=PARKED) for i in range(2))
        result = group(members).apply_async(producer=producer)
        sent.update(r.id for r in result.results)
        raise RuntimeError("abandoned")
    assert len(sent) == 3
    assert _written(worker_app, sent) == set()  # the bulk stored none of it


def test_a_bulk_inside_the_generator_of_a_group_is_stored_whole_or_not_at_all(
    worker_app: Celery,
) -> None:
    add = worker_app.tasks["t.add"]
    inner: set[str] = set()

    def members() -> Iterator[Any]:
        yield add.s(0, 0).set(queue=PARKED)
        with pytest.raises(PayloadTooLarge), celery_ratchet.bulk(worker_app) as producer:
            inner.add(add.apply_async((1, 1), queue=PARKED, producer=producer).id)
            add.apply_async(("x" * 200_000, 1), queue=PARKED, producer=producer)
        yield add.s(2, 2).set(queue=PARKED)

    result = group(members()).apply_async()
    assert _written(worker_app, inner) == set()
    assert _written(worker_app, {r.id for r in result.results}) == {r.id for r in result.results}
