"""A ratchet Celery app with an in-process worker (thread pool), per database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.worker import state as worker_state

from celery_ratchet.celery.worker.transport import wake
from tests.conftest import Servers, empty_store
from tests.helpers import Tripwire
from tests.integration import tasks

#: The broker nobody may contact: a listening socket that counts every connection.
BrokerTrap = Tripwire


@pytest.fixture(scope="session")
def broker_trap() -> Iterator[BrokerTrap]:
    trap = BrokerTrap()
    yield trap
    trap.close()


def make_app(url: str, broker_url: str, **conf: Any) -> Celery:
    app = Celery("tests", task_cls="celery_ratchet:RatchetTask", set_as_current=False)
    app.conf.update(
        {
            "ratchet_url": url,
            "broker_url": broker_url,
            "ratchet_poll_interval": 0.2,
            # Where nothing tells the worker of a command (SQLite, MariaDB), it looks every
            # 0.5 s by default; each inspect or control call of a test waited for that.
            "ratchet_control_poll_interval": 0.1,
            "task_default_queue": "celery",
            **conf,
        }
    )
    tasks.register(app)
    return app


@contextmanager
def worker_running(app: Celery, concurrency: int = 4, **options: Any) -> Iterator[Any]:
    """An in-process worker (thread pool, 4 threads unless told) on ``app``, as a context
    manager."""
    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        shutdown_timeout=30,
        **options,
    ) as worker:
        try:
            yield worker
        finally:
            # start_worker stops its worker by this flag alone, which the worker's main loop
            # sees at its next poll (up to a second); the wake-up ends the wait at once.
            worker_state.should_terminate = 0
            wake()


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def worker_app(
    request: pytest.FixtureRequest, servers: Servers, broker_trap: BrokerTrap
) -> Iterator[Celery]:
    app = make_app(empty_store(servers.url(request.param)).url, broker_trap.url)
    with worker_running(app):
        yield app
    assert broker_trap.connections == 0, "a ratchet worker or client contacted the broker"
