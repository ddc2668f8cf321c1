"""Idle workers with a wake-up channel look at the store rarely, yet miss nothing.

With ``ratchet_wakeup_poll_interval`` an hour, an idle worker only acts on what it is told
(LISTEN/NOTIFY on PostgreSQL, Redis pub/sub on MariaDB) and on due times it read in advance:
an enqueue, a countdown, a schedule changed to fire every second, and a revoke of a running
job must all still be acted on. With the channel silent (a lost notification), the safety
poll still finds each of them. What idle workers cost the database is measured in
bench/idle.py, not asserted here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from celery.exceptions import TaskRevokedError

from celery_ratchet.celery.schedules.recurring import cancel_recurring, schedule_recurring
from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.conftest import Cluster, side_effects, wait_until

pytestmark = pytest.mark.slow

REDIS_URL = "redis://127.0.0.1:6379/14"
CHANNELS = [("postgresql", "listen"), ("mysql", "redis")]


def channel_env(channel: str) -> dict[str, str]:
    """The worker's side of the channel."""
    if channel == "listen":
        return {"RATCHET_LISTEN_NOTIFY": "true"}
    return {"RATCHET_LISTEN_NOTIFY": "false", "RATCHET_EVENTS_URL": REDIS_URL}


@pytest.fixture
def client(ratchet_app: Celery, request: pytest.FixtureRequest) -> Iterator[Celery]:
    """The sending side: announcing on the channel, or (``silent``) not at all."""
    channel, silent = request.param
    conf = ratchet_app.conf
    saved = conf.get("ratchet_listen_notify"), conf.get("ratchet_events_url")
    conf.ratchet_listen_notify = channel == "listen" and not silent
    conf.ratchet_events_url = REDIS_URL if channel == "redis" and not silent else None
    ratchet_state(ratchet_app).reset()
    yield ratchet_app
    conf.ratchet_listen_notify, conf.ratchet_events_url = saved
    ratchet_state(ratchet_app).reset()


def ticks(app: Celery, key: str) -> int:
    return sum(1 for run_key, _ in side_effects(ratchet_state(app).store) if run_key == key)


def runs_starting(app: Celery, prefix: str) -> int:
    store = ratchet_state(app).store
    return sum(1 for run_key, _ in side_effects(store) if run_key.startswith(prefix))


def acted_on_everything(app: Celery, cluster: Cluster, **env: str) -> None:
    """An enqueue, a countdown, a schedule turned per-second, a revoke of a running job."""
    worker = cluster.start("idle", concurrency=2, **env)
    store = ratchet_state(app).store
    wait_until(lambda: len(store.list_nodes()) == 1, 90, "the worker to register")
    double = app.tasks["acc.double"]
    assert double.delay(21).get(timeout=90) == 42, cluster.logs()
    # Idle now, the queue dry: what comes next is announced, or found by the safety poll.
    assert double.delay(1).get(timeout=90) == 2, cluster.logs()
    assert double.apply_async((2,), countdown=1).get(timeout=90) == 4, cluster.logs()

    key = f"idle-{uuid.uuid4().hex[:8]}"
    tick = app.tasks["acc.tick"]
    # Registered far from due (the worker reads that time and sleeps past it), then changed
    # in place to fire every second.
    schedule_recurring(app, "0 0 0 1 1 ? 2099", "UTC", tick.si(), business_key=key)
    schedule_recurring(app, "* * * * * ?", "UTC", tick.si(), business_key=key)
    wait_until(lambda: runs_starting(app, "tick@") >= 3, 90, "three ticks of the schedule")
    cancel_recurring(app, key)

    running = app.tasks["acc.sleep"].delay("long-idle", 120)
    wait_until(lambda: ticks(app, "long-idle") == 1, 90, "the long job to start")
    app.control.revoke(running.id, terminate=True, signal="SIGKILL")
    with pytest.raises(TaskRevokedError):
        running.get(timeout=90)
    assert double.delay(5).get(timeout=90) == 10, "the worker stopped serving after a revoke"
    assert worker.process.poll() is None


@pytest.mark.parametrize(
    ("dialect", "client"),
    [(d, (c, False)) for d, c in CHANNELS],
    ids=[c for _, c in CHANNELS],
    indirect=["client"],
)
def test_an_idle_worker_acts_on_what_it_is_told(
    dialect: str, client: Celery, cluster: Cluster
) -> None:
    channel = "listen" if dialect == "postgresql" else "redis"
    # The safety poll an hour away: only the announcements and known due times can act.
    acted_on_everything(
        client, cluster, RATCHET_WAKEUP_POLL_INTERVAL="3600", **channel_env(channel)
    )


@pytest.mark.parametrize(
    ("dialect", "client"),
    [(d, (c, True)) for d, c in CHANNELS],
    ids=[c for _, c in CHANNELS],
    indirect=["client"],
)
def test_a_lost_notification_is_picked_up_by_the_safety_poll(
    dialect: str, client: Celery, cluster: Cluster
) -> None:
    channel = "listen" if dialect == "postgresql" else "redis"
    # The worker listens, but nothing is ever sent on the channel.
    acted_on_everything(client, cluster, RATCHET_WAKEUP_POLL_INTERVAL="1", **channel_env(channel))
