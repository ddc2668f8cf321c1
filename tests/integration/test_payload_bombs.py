"""A compressed payload bomb written into a row by hand (bzip2, zlib, lzma) fails its job
alone, within 64 times ``ratchet_max_payload_kb`` of output, in the worker's main process; the
jobs around it run, compressed ones included. A sender refuses what a worker would."""

from __future__ import annotations

import json

import pytest
from celery import Celery
from sqlalchemy import update

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import CompressedPayloadTooLarge, InvalidJob
from celery_ratchet.store.schema import scheduler_job
from tests.acceptance.conftest import wait_until
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app, worker_running
from tests.unit.test_inflate import BOMBS


def test_a_bomb_row_fails_alone_and_the_rest_runs(
    servers: Servers, dialect: str, broker_trap: BrokerTrap
) -> None:
    app = make_app(empty_store(servers.url(dialect)).url, broker_trap.url)
    store = ratchet_state(app).store
    add = app.tasks["t.add"]
    good = [add.apply_async((i, 1), queue="parked", compression="bzip2") for i in range(3)]
    bombs = {}
    with store.engine.connect() as conn:
        for compression, make in sorted(BOMBS.items()):
            sent = add.apply_async((0, 0), queue="parked")
            headers = {"id": sent.id, "task": "t.add", "compression": compression}
            conn.execute(
                update(scheduler_job)
                .where(scheduler_job.c.job_id == sent.id)
                .values(payload=make(), headers=json.dumps(headers))
            )
            bombs[compression] = sent
        conn.execute(update(scheduler_job).values(queue="celery"))
    with worker_running(app):
        wait_until(lambda: store.count_by_status().get("SUCCEEDED", 0) == 3, 60, "good jobs")
        wait_until(lambda: store.count_by_status() == {"SUCCEEDED": 3, "FAILED": 3}, 30,
                   "the bombs to fail")  # fmt: skip
    assert [r.get(timeout=10) for r in good] == [1, 2, 3]
    for compression, sent in bombs.items():
        record = store.result(sent.id)
        assert record is not None, compression
        error = json.loads(record.last_error or "{}")
        assert error["exc_type"] == "CompressedPayloadTooLarge", (compression, error)
        # Stored as Celery stores an exception (its args: the task, the bound, the setting).
        assert error["exc_message"] == ["t.add", 6400 * 1024, 100], error
        message = str(CompressedPayloadTooLarge(*error["exc_message"]))
        assert "decompresses to more than 6400 KB" in message, message
        assert "ratchet_max_payload_kb = 100" in message, message


def test_a_sender_refuses_what_a_worker_would(client_app: Celery) -> None:
    add = client_app.tasks["t.add"]
    with pytest.raises(CompressedPayloadTooLarge, match="ratchet_max_payload_kb"):
        add.apply_async(("0" * (7 << 20), ""), compression="zlib")
    with pytest.raises(InvalidJob, match="not one a ratchet worker decompresses"):
        add.apply_async((1, 2), compression="brotli")
    assert ratchet_state(client_app).store.count_by_status() == {}


@pytest.fixture
def client_app(servers: Servers, broker_trap: BrokerTrap) -> Celery:
    app = make_app(empty_store(servers.url("sqlite")).url, broker_trap.url)
    app.finalize()
    return app
