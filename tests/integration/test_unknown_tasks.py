"""A job whose task the worker does not know: handed back for workers that know it (a
rolling deploy brings them) for ``ratchet_unknown_task_grace_seconds`` from the first
refusal, said once per task name; then failed as NotRegistered, and inspectable."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
from celery.exceptions import NotRegistered

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from tests.conftest import Servers, empty_store
from tests.helpers import wait_until
from tests.integration.conftest import BrokerTrap, make_app, worker_running

REFUSED = "is not registered on worker"


@contextlib.contextmanager
def logged() -> Iterator[list[logging.LogRecord]]:
    """The ratchet records of DEBUG and up (the test worker's logging set up by Celery
    reaches no capture of pytest's)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    ratchet = logging.getLogger("celery_ratchet")
    level = ratchet.level
    ratchet.addHandler(handler)
    ratchet.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        ratchet.removeHandler(handler)
        ratchet.setLevel(level)


def handed_back(records: list[logging.LogRecord]) -> int:
    return sum(
        int(r.args[0])  # type: ignore[index]
        for r in records
        if str(r.msg).startswith("ratchet: handed back")
    )


@pytest.fixture
def url(servers: Servers) -> Iterator[str]:
    yield empty_store(servers.url("sqlite")).url


def test_without_a_grace_period_an_unknown_task_fails_at_once(
    url: str, broker_trap: BrokerTrap
) -> None:
    app = make_app(url, broker_trap.url, ratchet_unknown_task_grace_seconds=0)
    with worker_running(app):
        result = app.send_task("t.does_not_exist", (1,))
        with pytest.raises(NotRegistered, match=r"t\.does_not_exist"):
            result.get(timeout=30)
    stored = ratchet_state(app).store.result(result.id)
    assert stored is not None and stored.status is JobStatus.FAILED
    assert "not registered" in (stored.last_error or "")


def test_an_unknown_task_is_handed_back_said_once_then_failed_after_the_grace(
    url: str, broker_trap: BrokerTrap
) -> None:
    app = make_app(url, broker_trap.url, ratchet_unknown_task_grace_seconds=1)
    store = ratchet_state(app).store
    with logged() as records, worker_running(app):
        results = [app.send_task("t.added_later", (n,)) for n in range(2)]
        # Refused once each and handed back: pending again, due a little later, no attempt
        # counted.
        wait_until(lambda: handed_back(records) >= 2, 30, "both handed back")
        for result in results:
            stored = store.result(result.id)
            assert stored is not None and stored.attempts == 0
            assert stored.status in (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.FAILED)
        # Found again after the grace period: failed, as Celery fails an unknown task.
        for result in results:
            with pytest.raises(NotRegistered, match=r"t\.added_later"):
                result.get(timeout=60)
    for result in results:
        stored = store.result(result.id)
        assert stored is not None and stored.status is JobStatus.FAILED
    refusals = [r for r in records if REFUSED in r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.WARNING, logging.ERROR, logging.ERROR]
    assert "'t.added_later'" in refusals[0].getMessage()
    assert "ratchet_unknown_task_grace_seconds" in refusals[0].getMessage()
    # The failure says the job waited for a worker that knows the task, and for how long.
    assert "no worker that knows it took it in the 1s" in str(store.result(results[0].id))
    handing_back = [r for r in records if str(r.msg).startswith("ratchet: handed back")]
    assert {r.levelno for r in handing_back} == {logging.DEBUG}  # the task named once


def test_a_store_error_reading_who_knows_the_task_hands_the_job_back(
    url: str, broker_trap: BrokerTrap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read of the workers that have the task fails with a store error other than busy
    or unavailable: the job is handed back for anyone, as without the hand-over, instead of
    failing as a job that could not start."""
    from celery_ratchet.errors import RatchetError

    app = make_app(url, broker_trap.url, ratchet_unknown_task_grace_seconds=600)
    store = ratchet_state(app).store

    def unreadable(*args: object, **kwargs: object) -> list[str]:
        raise RatchetError("the node table could not be read")

    monkeypatch.setattr(store, "nodes_knowing", unreadable)
    with logged() as records, worker_running(app):
        result = app.send_task("t.added_later", (1,))
        wait_until(lambda: handed_back(records) >= 1, 30, "the job handed back")
        stored = store.result(result.id)
        assert stored is not None and stored.status is not JobStatus.FAILED
    said = [r.getMessage() for r in records if "were not read" in r.getMessage()]
    assert said and "the node table could not be read" in said[0]
