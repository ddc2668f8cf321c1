"""A worker restarted with a changed beat_schedule, on PostgreSQL and MariaDB: the entry gone
from it stops firing, a schedule of the API stays, and an overdue entry runs once."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.conftest import Cluster, fire_times, wait_until

pytestmark = pytest.mark.slow

#: How long the workers stay stopped: several ticks of the 2-s entries go by.
DOWNTIME = timedelta(seconds=9)


def test_a_restart_without_an_entry_removes_it_and_an_overdue_entry_runs_once(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    celery_ratchet.schedule_recurring(
        server_app, None, "UTC", server_app.tasks["acc.double"].si(1),
        business_key="api-hourly", every=3600,
    )  # fmt: skip
    first = server_cluster.start(
        "b1", pool="threads", concurrency=2, RATCHET_ACCEPTANCE_BEAT="beat-a,beat-b"
    )
    wait_until(
        lambda: all(len(fire_times(store, e)) >= 2 for e in ("beat-a", "beat-b")),
        90,
        "two ticks of each beat entry",
    )
    assert first.stop(signal.SIGTERM) == 0
    stopped = datetime.now(timezone.utc)
    due = {m["business_key"]: m["scheduled_time"] for m in store.list_masters()}
    wait_until(lambda: datetime.now(timezone.utc) > due["beat-a"] + DOWNTIME, 60, "the downtime")
    restarted = datetime.now(timezone.utc)
    second = server_cluster.start(
        "b2", pool="threads", concurrency=2, RATCHET_ACCEPTANCE_BEAT="beat-a"
    )
    wait_until(
        lambda: any(t > restarted for t in fire_times(store, "beat-a")),
        90,
        f"a tick of beat-a after the restart\n{server_cluster.logs()}",
    )
    statuses = {m["business_key"]: m["status"] for m in store.list_masters(include_cancelled=True)}
    assert statuses["beat-b"] == "REVOKED"
    assert statuses["api-hourly"] == "PENDING"
    assert statuses["beat-a"] in ("PENDING", "RUNNING")  # RUNNING: claimed to fire just now
    assert max(fire_times(store, "beat-b")) <= stopped, "beat-b fired after it was removed"
    log = second.log.read_text()
    assert "recurring job beat-b removed: it was registered from beat_schedule" in log
    assert "WARNING" in next(line for line in log.splitlines() if "beat-b removed" in line)
    # As beat: the overdue entry ran once (its oldest missed tick), then went on from now.
    after = [t for t in fire_times(store, "beat-a") if t >= due["beat-a"]]
    assert after[0] == due["beat-a"]
    assert after[1] > restarted - timedelta(seconds=2), f"overdue ticks fired back to back: {after}"


def test_during_a_rolling_deploy_no_release_removes_the_entries_of_another_that_runs(
    server_app: Celery, server_cluster: Cluster
) -> None:
    """A new release adds beat-b; a worker of the release before (without it) starts while
    the new one runs (a rolling deploy, a restart of an old pod): it removed beat-b at its
    start. Now an entry is removed only once no running worker's beat_schedule has it: beat-b
    goes on firing, and is removed, without any start, once the new worker stops."""
    store = ratchet_state(server_app).store
    new = server_cluster.start("new", pool="threads", concurrency=2,
                               RATCHET_ACCEPTANCE_BEAT="beat-a,beat-b")  # fmt: skip
    wait_until(lambda: len(fire_times(store, "beat-b")) >= 1, 90, "a tick of beat-b")
    old = server_cluster.start("old", pool="threads", concurrency=2,
                               RATCHET_ACCEPTANCE_BEAT="beat-a")  # fmt: skip
    wait_until(
        lambda: "recurring jobs registered" in old.log.read_text(),
        90,
        f"the old release's worker to start\n{server_cluster.logs()}",
    )
    started = datetime.now(timezone.utc)
    wait_until(
        lambda: any(t > started for t in fire_times(store, "beat-b")),
        90,
        f"a tick of beat-b after the old worker started\n{server_cluster.logs()}",
    )
    statuses = {m["business_key"]: m["status"] for m in store.list_masters(include_cancelled=True)}
    assert statuses["beat-b"] in ("PENDING", "RUNNING"), server_cluster.logs()
    assert "beat-b removed" not in server_cluster.whole_logs()

    assert new.stop(signal.SIGTERM) == 0  # the deploy is rolled back: only the old one runs
    wait_until(
        lambda: "recurring job beat-b removed" in old.log.read_text(),
        90,
        f"the old worker to remove beat-b\n{server_cluster.logs()}",
    )
    removed = datetime.now(timezone.utc)
    statuses = {m["business_key"]: m["status"] for m in store.list_masters(include_cancelled=True)}
    assert statuses["beat-b"] == "REVOKED" and statuses["beat-a"] in ("PENDING", "RUNNING")
    wait_until(lambda: any(t > removed for t in fire_times(store, "beat-a")), 90, "beat-a goes on")
    assert not any(t > removed for t in fire_times(store, "beat-b")), "beat-b fired after"
