"""Statements on connections left half-open (tests/proxy.py's freeze: nothing relayed, both
ends open) are cut at their deadline and the work done on a new connection, on PostgreSQL and
MariaDB."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from celery_ratchet.store.engine import EngineOptions
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job
from tests.proxy import LossyProxy

CUT = "got no reply from the job store"


@pytest.fixture
def proxied_store(server_store: JobStore) -> Iterator[tuple[LossyProxy, JobStore]]:
    proxy, url = LossyProxy.in_front_of(server_store.url)
    options = EngineOptions(statement_deadline_seconds=1.0, liveness_deadline_seconds=0.5)
    store = JobStore(url, engine_options=options)
    try:
        yield proxy, store
    finally:
        proxy.close()
        store.engine.dispose()


def test_a_heartbeat_and_a_send_on_half_open_connections_go_through_on_new_ones(
    server_store: JobStore,
    proxied_store: tuple[LossyProxy, JobStore],
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy, store = proxied_store
    caplog.set_level(logging.WARNING, logger="celery_ratchet.store.deadline")
    store.register_node("n", "h", 1, ["celery"], 1)
    store.enqueue(new_job("before"))
    assert proxy.freeze_open() > 0
    assert store.heartbeat("n")
    cuts = [r.message for r in caplog.records if CUT in r.message]
    assert len(cuts) == 1 and "within 0.5s (a heartbeat's deadline" in cuts[0], caplog.text
    # The single-row send goes through the driver directly: its deadline is kept there too.
    assert proxy.freeze_open() > 0
    store.enqueue(new_job("after"))
    cuts = [r.message for r in caplog.records if CUT in r.message]
    assert len(cuts) == 2 and "within 1s (ratchet_statement_deadline_seconds)" in cuts[1]
    assert server_store.count_by_status() == {"PENDING": 2}
