"""Wake-ups: with polling all but off (an hour between claims), a new job still starts at
once, woken by PostgreSQL LISTEN/NOTIFY or by Redis pub/sub."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from tests.conftest import IN_CI, Servers, empty_store
from tests.helpers import wait_until
from tests.integration.conftest import BrokerTrap, make_app, worker_running

REDIS = os.environ.get("RATCHET_TEST_REDIS", "redis://127.0.0.1:6379/14")
AN_HOUR = {"ratchet_poll_interval": 3600, "ratchet_poll_interval_min": 3600}


def _redis_reachable() -> None:
    host, port = REDIS.split("//")[1].split("/")[0].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        if IN_CI:
            pytest.fail(f"Redis is not reachable at {REDIS}: CI requires it")
        pytest.skip(f"Redis is not reachable at {REDIS}")


def _idle_worker_runs_a_new_job(app: Celery) -> None:
    with worker_running(app):
        runtime = ratchet_state(app).runtime
        deadline = time.monotonic() + 30
        while runtime is None or not all(
            w.thread is not None and w.thread.is_alive() for w in runtime.wakeups
        ):
            assert time.monotonic() < deadline, "wake-up listeners did not start"
            time.sleep(0.05)
            runtime = ratchet_state(app).runtime
        time.sleep(0.5)  # past its first claims: the worker now waits an hour between polls
        assert app.tasks["t.add"].delay(20, 22).get(timeout=30) == 42


@pytest.fixture
def pg_url(servers: Servers) -> Iterator[str]:
    yield empty_store(servers.url("postgresql")).url


def test_listen_notify_wakes_an_idle_worker_on_postgresql(
    pg_url: str, broker_trap: BrokerTrap
) -> None:
    _idle_worker_runs_a_new_job(make_app(pg_url, broker_trap.url, **AN_HOUR))


def test_redis_wakes_an_idle_worker_on_any_database(
    servers: Servers, broker_trap: BrokerTrap
) -> None:
    _redis_reachable()
    url = empty_store(servers.url("sqlite")).url
    _idle_worker_runs_a_new_job(make_app(url, broker_trap.url, ratchet_events_url=REDIS, **AN_HOUR))


def _idle_worker_answers_ping_when_told(app: Celery) -> None:
    """Looks for control commands once an hour: only the wake-up can bring a ping in time."""
    app.conf.ratchet_control_poll_interval = 3600
    app.conf.ratchet_wakeup_poll_interval = 3600
    with worker_running(app):
        wait_until(lambda: app.control.ping(timeout=1, limit=1), 60, "a first reply to ping")
        for _ in range(3):
            replies = app.control.ping(timeout=2, limit=1)
            assert len(replies) == 1 and next(iter(replies[0].values())) == {"ok": "pong"}


def test_listen_notify_brings_control_commands_on_postgresql(
    pg_url: str, broker_trap: BrokerTrap
) -> None:
    _idle_worker_answers_ping_when_told(make_app(pg_url, broker_trap.url, **AN_HOUR))


def test_redis_brings_control_commands_on_any_database(
    servers: Servers, broker_trap: BrokerTrap
) -> None:
    _redis_reachable()
    url = empty_store(servers.url("sqlite")).url
    _idle_worker_answers_ping_when_told(
        make_app(url, broker_trap.url, ratchet_events_url=REDIS, **AN_HOUR)
    )
