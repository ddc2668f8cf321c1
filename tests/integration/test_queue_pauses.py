"""A paused queue, with a worker: its jobs wait, other queues' jobs run, and a resume lets
them run, whether the pause came before the worker started or while it ran."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from celery.result import AsyncResult

from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import wait_until
from tests.integration.conftest import BrokerTrap, make_app, worker_running

RESUMED = "ratchet: resumed, claiming again from: emails"
PAUSED = "ratchet: paused, not claiming from: emails"


class Said(logging.Handler):
    """What the node said of pauses: on the logger itself, as Celery's worker takes over
    the root logger's handlers."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def said() -> Iterator[Said]:
    logger = logging.getLogger("celery_ratchet.runtime.queue_pauses")
    handler, level = Said(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_paused_queue_waits_while_others_run_until_it_is_resumed(
    store: JobStore, broker_trap: BrokerTrap, said: Said
) -> None:
    # An idle worker reads the pauses when it next looks for work: on PostgreSQL, which
    # tells it of new jobs, that is every wakeup_poll_interval (10 s by default).
    app = make_app(
        store.url,
        broker_trap.url,
        ratchet_queue_pause_check_seconds=0.2,
        ratchet_wakeup_poll_interval=0.2,
    )
    add = app.tasks["t.add"]
    assert store.pause_queue("emails", "relay down")
    with worker_running(app, queues=["celery", "emails"]):
        # Paused before the worker started: sent before another queue's job, still waiting
        # once that job has run.
        waiting = [add.apply_async((i, 1), queue="emails") for i in range(3)]
        assert add.apply_async((1, 1), queue="celery").get(timeout=30) == 2
        assert {AsyncResult(r.id, app=app).state for r in waiting} == {"PENDING"}
        assert all(j.status == JobStatus.PENDING for j in store.list_jobs(queue="emails"))

        assert store.resume_queue("emails")
        assert [r.get(timeout=30) for r in waiting] == [1, 2, 3]
        wait_until(lambda: RESUMED in said.lines, 30, "the worker to say it resumed")

        # Paused while the worker runs: once it says so, the queue's jobs wait again.
        assert store.pause_queue("emails")
        wait_until(lambda: said.lines[-1:] == [PAUSED], 30, "the worker to see the pause")
        later = [add.apply_async((i, 10), queue="emails") for i in range(2)]
        assert add.apply_async((2, 2), queue="celery").get(timeout=30) == 4
        assert {AsyncResult(r.id, app=app).state for r in later} == {"PENDING"}
        assert store.resume_queue("emails")
        assert [r.get(timeout=30) for r in later] == [10, 11]
    assert broker_trap.connections == 0
