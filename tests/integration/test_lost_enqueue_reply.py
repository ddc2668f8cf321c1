"""A send whose committed INSERT lost its reply, then found the database refusing for a while.

The sender retries (``task_publish_retry``); the retry must know its earlier try may have
committed: finding its own row (same id, same message) is success, whatever that row's state,
and a finished row of its own is never run again.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.conftest import wait_until
from tests.conftest import Servers, empty_store
from tests.integration import tasks
from tests.integration.conftest import BrokerTrap, make_app, worker_running
from tests.proxy import LossyProxy

INSERT = b"INSERT INTO scheduler_job"
RETRY_POLICY = {
    "max_retries": None, "interval_start": 0, "interval_step": 0.05, "interval_max": 0.1,
}  # fmt: skip


@pytest.fixture
def direct_store(servers: Servers, server_dialect: str) -> JobStore:
    return empty_store(servers.url(server_dialect))


@pytest.fixture
def proxied(direct_store: JobStore) -> Iterator[tuple[LossyProxy, str]]:
    proxy, url = LossyProxy.in_front_of(direct_store.url)
    with proxy:
        yield proxy, url


def _client(url: str, broker_trap: BrokerTrap) -> Celery:
    app = make_app(url, broker_trap.url, task_publish_retry_policy=RETRY_POLICY)
    app.tasks["t.mark"].delay("warm-up")  # schema checked and a connection made: not lossy
    return app


def test_no_worker_the_callers_own_job_is_not_a_duplicate(
    proxied: tuple[LossyProxy, str], direct_store: JobStore, broker_trap: BrokerTrap
) -> None:
    proxy, url = proxied
    client = _client(url, broker_trap)
    for _ in range(3):
        task_id = uuid.uuid4().hex
        proxy.dropped.clear()
        proxy.lose_reply_to(INSERT, refuse=3)
        client.tasks["t.mark"].apply_async(("lost-reply",), task_id=task_id)
        assert proxy.dropped.is_set() and proxy.refused >= 1, "the reply was never lost"
        record = direct_store.result(task_id)
        assert record is not None and record.status is JobStatus.PENDING
    assert direct_store.count_by_status() == {"PENDING": 4}
    ratchet_state(client).store.engine.dispose()


def test_with_a_worker_the_job_runs_once(
    proxied: tuple[LossyProxy, str],
    direct_store: JobStore,
    broker_trap: BrokerTrap,
) -> None:
    proxy, url = proxied
    client = _client(url, broker_trap)
    worker_app = make_app(direct_store.url, broker_trap.url)
    key = f"once-{uuid.uuid4().hex}"
    task_id = uuid.uuid4().hex
    sent: list[BaseException | None] = []

    def send() -> None:
        try:
            client.tasks["t.mark"].apply_async((key,), task_id=task_id)
            sent.append(None)
        except BaseException as exc:  # handed to the test thread
            sent.append(exc)

    with worker_running(worker_app):
        proxy.lose_reply_to(INSERT, refuse=None)  # the sender is refused until we say
        sender = threading.Thread(target=send)
        sender.start()
        wait_until(proxy.dropped.is_set, 60, "the reply to the INSERT to be lost")

        def finished() -> Any:
            record = direct_store.result(task_id)
            return record is not None and record.status is JobStatus.SUCCEEDED

        # The INSERT committed: the worker (which talks to the database directly) runs it
        # while the sender keeps retrying against a refusing database.
        wait_until(finished, 60, "the job to run while the sender retries")
        before = direct_store.result(task_id)
        wait_until(lambda: proxy.refused >= 2, 60, "the sender to retry")
        proxy.accept_again()
        sender.join(60)
        assert not sender.is_alive()
        assert sent == [None]
        after = direct_store.result(task_id)
        assert after is not None and before is not None
        assert after.status is JobStatus.SUCCEEDED
        assert after.finished_at == before.finished_at, "the finished job was armed again"
        assert len(tasks.RUNS[key]) == 1
    ratchet_state(client).store.engine.dispose()


def test_a_bulk_send_whose_commit_reply_was_lost_is_stored_once(
    proxied: tuple[LossyProxy, str], direct_store: JobStore, broker_trap: BrokerTrap
) -> None:
    import celery_ratchet

    proxy, url = proxied
    client = _client(url, broker_trap)
    ids = [uuid.uuid4().hex for _ in range(5)]
    proxy.lose_reply_to(b"COMMIT", refuse=3)
    with celery_ratchet.bulk(client) as producer:
        for task_id in ids:
            client.tasks["t.mark"].apply_async(("bulk",), task_id=task_id, producer=producer)
    assert proxy.dropped.is_set(), "the reply to the COMMIT was never lost"
    for task_id in ids:
        record = direct_store.result(task_id)
        assert record is not None and record.status is JobStatus.PENDING
    assert direct_store.count_by_status() == {"PENDING": 6}
    ratchet_state(client).store.engine.dispose()
