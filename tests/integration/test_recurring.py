"""Recurring jobs through an in-process worker: ticks run once each, as normal jobs."""

from __future__ import annotations

import itertools
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery import Celery

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.schedule import MisfirePolicy
from tests.conftest import Servers, empty_store
from tests.helpers import wait_until
from tests.integration.conftest import BrokerTrap, make_app, worker_running
from tests.integration.tasks import RUNS, record


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def recurring_app(
    request: pytest.FixtureRequest, servers: Servers, broker_trap: BrokerTrap
) -> Iterator[Celery]:
    app = make_app(
        empty_store(servers.url(request.param)).url,
        broker_trap.url,
        ratchet_poll_interval=0.1,
        beat_schedule={
            "beat-every-second": {
                "task": "t.mark",
                "schedule": timedelta(seconds=1),
                "args": (f"beat-{request.param}",),
            }
        },
    )
    key = f"decorated-{request.param}"

    @celery_ratchet.recurring(cron="* * * * * ?", id=key)
    @app.task(name="t.every_second", bind=True, shared=False)
    def every_second(self: Any) -> None:
        record(key, self.request.eta)

    app.conf.recurring_key = key
    with worker_running(app):
        yield app


def test_a_decorated_task_fires_every_second_once_per_tick(recurring_app: Celery) -> None:
    key = recurring_app.conf.recurring_key
    wait_until(lambda: len(RUNS.get(key, [])) >= 3, 30, "three ticks of the every-second task")
    ticks = [datetime.fromisoformat(eta) for eta in RUNS[key]]
    assert len(ticks) >= 2
    assert max(Counter(ticks).values()) == 1, "a tick ran twice"
    ordered = sorted(ticks)
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(ordered))
    assert all(t.microsecond == 0 for t in ticks)


def test_beat_schedule_entries_run_without_beat(recurring_app: Celery) -> None:
    beat_key = next(iter(recurring_app.conf.beat_schedule.values()))["args"][0]
    deadline = time.monotonic() + 10
    while len(RUNS.get(beat_key, [])) < 2:
        assert time.monotonic() < deadline, "the beat entry did not fire"
        time.sleep(0.1)
    names = {
        m["business_key"]
        for m in celery_ratchet.celery.schedules.recurring.masters.describe(
            ratchet_state(recurring_app).store
        )
    }
    assert {"beat-every-second", recurring_app.conf.recurring_key} <= names


def test_schedule_recurring_at_runtime_updates_in_place(recurring_app: Celery) -> None:
    key = f"tenant-{uuid.uuid4().hex[:6]}"
    mark = recurring_app.tasks["t.mark"]
    celery_ratchet.schedule_recurring(
        recurring_app, "0 0 0 1 1 ?", "UTC", mark.si(key), business_key=key
    )
    celery_ratchet.schedule_recurring(
        recurring_app,
        "* * * * * ?",
        "Europe/Paris",
        mark.si(key),
        business_key=key,
        misfire=MisfirePolicy.catch_up(3),
        tags=("tenant",),
    )
    deadline = time.monotonic() + 10
    while len(RUNS.get(key, [])) < 2:
        assert time.monotonic() < deadline, "the updated schedule did not fire"
        time.sleep(0.1)
    store = ratchet_state(recurring_app).store
    mine = [m for m in store.list_masters() if m["business_key"] == key]
    assert len(mine) == 1
    celery_ratchet.pause_recurring(recurring_app, key)
    time.sleep(0.5)
    fired = len(RUNS[key])
    time.sleep(1.5)
    assert len(RUNS[key]) == fired
    celery_ratchet.cancel_recurring(recurring_app, key)
    assert all(m["business_key"] != key for m in store.list_masters())


def test_a_decorated_task_is_named_after_its_function(recurring_app: Celery) -> None:
    """The seeds: a recurring job's name defaults to its method's name."""
    shown = {
        m["business_key"]: m
        for m in celery_ratchet.celery.schedules.recurring.masters.describe(
            ratchet_state(recurring_app).store
        )
    }
    assert shown[recurring_app.conf.recurring_key]["name"] == "every_second"
    assert shown["beat-every-second"]["name"] == "beat-every-second"
