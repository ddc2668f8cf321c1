"""What Flower's Broker page and ``/api/queues/length`` show for a ratchet app: the job
store's queues, counted as RabbitMQ counts its messages (ready, unacknowledged, both)."""

from __future__ import annotations

import asyncio

import pytest

import celery_ratchet
from celery_ratchet.celery.control.flower import StoreQueues, queue_lengths
from celery_ratchet.celery.state import ratchet_state
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql", "mysql"])
def test_queue_lengths_come_from_the_store(
    servers: Servers, broker_trap: BrokerTrap, dialect: str
) -> None:
    app = make_app(empty_store(servers.url(dialect)).url, broker_trap.url)
    celery_ratchet.install(app)
    add = app.tasks["t.add"]
    for n in range(3):
        add.delay(n, n)
    add.apply_async((1, 1), queue="reports")
    claimed = ratchet_state(app).store.claim("node-a", ["celery"], 1)
    assert len(claimed) == 1

    lengths = queue_lengths(app, ["celery", "reports", "idle"])
    assert lengths == [
        {"name": "celery", "messages": 3, "messages_ready": 2, "messages_unacknowledged": 1},
        {"name": "reports", "messages": 1, "messages_ready": 1, "messages_unacknowledged": 0},
        {"name": "idle", "messages": 0, "messages_ready": 0, "messages_unacknowledged": 0},
    ]
    assert asyncio.run(StoreQueues(app).queues(["reports"])) == [lengths[1]]
    assert broker_trap.connections == 0
