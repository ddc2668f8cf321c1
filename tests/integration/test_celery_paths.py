"""Every way Celery sends a task lands in the store and runs through Celery's own path."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery, chain, group, signals
from celery.exceptions import TaskRevokedError

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from tests.helpers import wait_until
from tests.integration.tasks import RUNS, record

TIMEOUT = 30


def row(app: Celery, task_id: str) -> Any:
    record_ = ratchet_state(app).store.result(task_id)
    assert record_ is not None
    return record_


@pytest.fixture
def signal_log() -> Iterator[list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    handlers = {}
    for name in (
        "task_prerun",
        "task_postrun",
        "task_success",
        "task_failure",
        "task_retry",
        "task_received",
        "task_revoked",
    ):

        def handler(sender: Any = None, _name: str = name, **kw: Any) -> None:
            request = kw.get("request") or getattr(sender, "request", None)
            task_id = kw.get("task_id") or getattr(request, "id", None)
            seen.append((_name, str(task_id)))

        getattr(signals, name).connect(handler, weak=False)
        handlers[name] = handler
    yield seen
    for name, handler in handlers.items():
        getattr(signals, name).disconnect(handler)


def test_delay_runs_and_the_result_comes_back(worker_app: Celery) -> None:
    result = worker_app.tasks["t.add"].delay(2, 3)
    assert result.get(timeout=TIMEOUT) == 5
    stored = row(worker_app, result.id)
    assert (stored.status, stored.job_result, stored.result_type) == (
        JobStatus.SUCCEEDED,
        "5",
        "builtins.int",
    )


def test_apply_async_options_reach_the_request(worker_app: Celery) -> None:
    task_id = f"custom-{uuid.uuid4()}"
    eta = datetime.now(timezone.utc) + timedelta(seconds=0.3)
    result = worker_app.tasks["t.echo_request"].apply_async(
        (1, "a"),
        {"k": "v"},
        task_id=task_id,
        eta=eta,
        priority=7,
        queue="celery",
        headers={"custom": "header"},
    )
    seen = result.get(timeout=TIMEOUT)
    assert result.id == task_id == seen["id"]
    assert (seen["args"], seen["kwargs"], seen["retries"]) == ([1, "a"], {"k": "v"}, 0)
    assert seen["eta"] and datetime.fromisoformat(seen["eta"]) == eta
    assert (seen["routing_key"], seen["priority"], seen["redelivered"]) == ("celery", 7, False)
    assert seen["custom"] == "header"
    assert row(worker_app, task_id).attempts == 0


def test_countdown_delays_the_run(worker_app: Celery) -> None:
    # A countdown counts from the database's time (SQLite: this host's).
    sent = ratchet_state(worker_app).store.database_time() or datetime.now(timezone.utc)
    result = worker_app.tasks["t.echo_request"].apply_async(countdown=1)
    seen = result.get(timeout=TIMEOUT)
    assert datetime.fromisoformat(seen["eta"]) >= sent + timedelta(seconds=1)
    assert row(worker_app, result.id).finished_at >= sent + timedelta(seconds=1)


def test_send_task_by_name(worker_app: Celery) -> None:
    assert worker_app.send_task("t.add", (20, 22)).get(timeout=TIMEOUT) == 42


def test_signals_fire_for_success_and_failure(
    worker_app: Celery, signal_log: list[tuple[str, str]]
) -> None:
    ok = worker_app.tasks["t.add"].delay(1, 1)
    bad = worker_app.tasks["t.fail"].delay("nope")
    ok.get(timeout=TIMEOUT)
    with pytest.raises(ValueError, match="nope"):
        bad.get(timeout=TIMEOUT)

    def names(task_id: str) -> set[str]:
        return {name for name, logged_id in signal_log if logged_id == task_id}

    # Celery sends task_postrun after the outcome is stored, so get() may return first.
    expected_ok = {"task_received", "task_prerun", "task_postrun", "task_success"}
    expected_bad = {"task_received", "task_prerun", "task_postrun", "task_failure"}
    wait_until(lambda: expected_ok <= names(ok.id), TIMEOUT, "the signals of the success")
    wait_until(lambda: expected_bad <= names(bad.id), TIMEOUT, "the signals of the failure")
    assert "Traceback" in (bad.traceback or "")
    stored = row(worker_app, bad.id)
    assert stored.status is JobStatus.FAILED and "ValueError" in stored.last_error


def test_retry_reschedules_the_same_row(
    worker_app: Celery, signal_log: list[tuple[str, str]]
) -> None:
    key = f"flaky-{uuid.uuid4()}"
    result = worker_app.tasks["t.flaky"].delay(key, 2)
    assert result.get(timeout=TIMEOUT) == "done after 2"
    assert RUNS[key] == [0, 1, 2]
    stored = row(worker_app, result.id)
    assert (stored.status, stored.attempts) == (JobStatus.SUCCEEDED, 2)
    assert [n for n, i in signal_log if i == result.id].count("task_retry") == 2
    assert ratchet_state(worker_app).store.list_jobs(task_name="t.flaky").__len__() >= 1


def test_retries_exhausted_fail_the_job(worker_app: Celery) -> None:
    key = f"flaky-{uuid.uuid4()}"
    result = worker_app.tasks["t.flaky"].apply_async((key, 99), retries=4)
    with pytest.raises(RuntimeError, match="attempt 5"):
        result.get(timeout=TIMEOUT)
    assert (row(worker_app, result.id).status, RUNS[key]) == (JobStatus.FAILED, [4, 5])


def test_expired_job_is_revoked_not_run(
    worker_app: Celery, signal_log: list[tuple[str, str]]
) -> None:
    key = f"expired-{uuid.uuid4()}"
    result = worker_app.tasks["t.mark"].apply_async(
        (key,), expires=datetime.now(timezone.utc) - timedelta(seconds=5)
    )
    with pytest.raises(TaskRevokedError):
        result.get(timeout=TIMEOUT)
    assert key not in RUNS
    assert row(worker_app, result.id).status is JobStatus.REVOKED
    # The worker sends the signal after it wrote the outcome that get() has just read.
    wait_until(
        lambda: ("task_revoked", result.id) in signal_log, TIMEOUT, "the task_revoked signal"
    )


def test_revoke_cancels_a_pending_job(worker_app: Celery) -> None:
    key = f"revoked-{uuid.uuid4()}"
    result = worker_app.tasks["t.mark"].apply_async((key,), countdown=2)
    result.revoke()
    with pytest.raises(TaskRevokedError):
        result.get(timeout=TIMEOUT)
    assert row(worker_app, result.id).status is JobStatus.REVOKED
    assert key not in RUNS


def test_unserialisable_result_is_logged_and_the_job_succeeds(worker_app: Celery) -> None:
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda rec: messages.append(rec.getMessage())  # type: ignore[method-assign]
    backend_logger = logging.getLogger("celery_ratchet.celery.results.backend")
    backend_logger.addHandler(handler)
    level = backend_logger.level
    backend_logger.setLevel(logging.WARNING)  # the test worker logs errors only
    try:
        result = worker_app.tasks["t.unserialisable"].delay()
        assert result.get(timeout=TIMEOUT) is None
    finally:
        backend_logger.removeHandler(handler)
        backend_logger.setLevel(level)
    stored = row(worker_app, result.id)
    assert stored.status is JobStatus.SUCCEEDED
    assert stored.result_type == "tests.integration.tasks.Unserialisable"
    assert any("cannot be serialised" in m for m in messages)


def test_custom_states_are_visible_while_running(worker_app: Celery) -> None:
    key = f"progress-{uuid.uuid4()}"
    result = worker_app.tasks["t.progress"].delay(key)
    deadline = time.time() + TIMEOUT
    while result.state != "PROGRESS" and time.time() < deadline:
        time.sleep(0.05)
    assert (result.state, result.info) == ("PROGRESS", {"step": 1})
    record(key, "go")
    assert result.get(timeout=TIMEOUT) == "finished"


def test_ignore_leaves_the_job_ignored(worker_app: Celery) -> None:
    result = worker_app.tasks["t.ignored"].delay()
    deadline = time.time() + TIMEOUT
    while row(worker_app, result.id).status is not JobStatus.IGNORED:
        assert time.time() < deadline
        time.sleep(0.05)
    assert result.state == "IGNORED"


def test_forget_drops_the_result(worker_app: Celery) -> None:
    result = worker_app.tasks["t.add"].delay(1, 2)
    assert result.get(timeout=TIMEOUT) == 3
    result.forget()
    assert result.state == "PENDING"


def test_group_results_come_back_in_order(worker_app: Celery) -> None:
    add = worker_app.tasks["t.add"]
    result = group(add.s(i, i) for i in range(100)).apply_async()
    assert result.get(timeout=TIMEOUT) == [2 * i for i in range(100)]


def test_chain_passes_results_along(worker_app: Celery) -> None:
    add = worker_app.tasks["t.add"]
    assert chain(add.s(1, 2), add.s(10), add.s(100)).apply_async().get(timeout=TIMEOUT) == 113


def test_link_and_link_error_run(worker_app: Celery) -> None:
    ok_key, err_key = f"link-{uuid.uuid4()}", f"errback-{uuid.uuid4()}"
    mark = worker_app.tasks["t.mark"]
    worker_app.tasks["t.add"].apply_async((1, 1), link=mark.si(ok_key)).get(timeout=TIMEOUT)
    failing = worker_app.tasks["t.fail"].apply_async(("x",), link_error=mark.si(err_key))
    with pytest.raises(ValueError):
        failing.get(timeout=TIMEOUT)
    deadline = time.time() + TIMEOUT
    while not (RUNS.get(ok_key) and RUNS.get(err_key)):
        assert time.time() < deadline, "callbacks did not run"
        time.sleep(0.05)
