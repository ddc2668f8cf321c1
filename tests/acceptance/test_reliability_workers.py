"""Retries after a hard time limit, revoke and terminate, permits across worker processes."""

from __future__ import annotations

import itertools
import uuid

import pytest
from celery import Celery
from celery.exceptions import TaskRevokedError, TimeLimitExceeded

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from tests.acceptance.conftest import Cluster, side_effects, wait_until

pytestmark = pytest.mark.slow


def status(app: Celery, task_id: str) -> JobStatus | None:
    record = ratchet_state(app).store.result(task_id)
    return None if record is None else record.status


def runs_of(app: Celery, key: str) -> int:
    return sum(1 for run_key, _ in side_effects(ratchet_state(app).store) if run_key == key)


def test_a_hard_time_limit_goes_through_the_retry_decision(
    ratchet_app: Celery, cluster: Cluster
) -> None:
    key = f"hard-{uuid.uuid4().hex[:8]}"
    result = ratchet_app.tasks["acc.hard_retried"].delay(key)
    cluster.start("w1", concurrency=2)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=90)
    record = ratchet_state(ratchet_app).store.result(result.id)
    assert record is not None and (record.status, record.attempts) == (JobStatus.FAILED, 2)
    assert runs_of(ratchet_app, key) == 3  # the first run and two retries


def test_revoke_terminates_a_running_job_and_drops_a_queued_one(
    ratchet_app: Celery, cluster: Cluster
) -> None:
    sleep = ratchet_app.tasks["acc.sleep"]
    running = sleep.delay("long", 30)
    queued = sleep.delay("queued", 30)
    cluster.start("w1", concurrency=1)  # one process: "queued" waits behind "long"
    store = ratchet_state(ratchet_app).store
    wait_until(lambda: runs_of(ratchet_app, "long") == 1, 60, "the long job to start")
    wait_until(lambda: status(ratchet_app, queued.id) is JobStatus.RUNNING, 30, "queued claimed")
    ratchet_app.control.revoke(queued.id)
    ratchet_app.control.revoke(running.id, terminate=True, signal="SIGKILL")
    with pytest.raises(TaskRevokedError):
        running.get(timeout=30)
    # Queued in the pool already: terminated the moment a process takes it (it may just
    # have begun), never left to run its 30 seconds.
    with pytest.raises(TaskRevokedError):
        queued.get(timeout=30)
    assert status(ratchet_app, queued.id) is JobStatus.REVOKED
    after = ratchet_app.tasks["acc.double"].delay(21)
    assert after.get(timeout=30) == 42, "the worker stopped serving after a terminate"
    assert store.count_by_status().get("RUNNING", 0) == 0


def test_one_permit_is_shared_by_two_worker_processes(
    server_app: Celery, server_cluster: Cluster
) -> None:
    server_cluster.start("w1", concurrency=2)
    server_cluster.start("w2", concurrency=2)
    store = ratchet_state(server_app).store
    wait_until(lambda: len(store.list_nodes()) == 2, 60, "both workers to register")
    results = [server_app.tasks["acc.ledger"].delay(f"l{i}") for i in range(6)]
    for r in results:
        r.get(timeout=90)
    spans: dict[str, dict[str, float]] = {}
    for run_key, _ in side_effects(ratchet_state(server_app).store):
        job, edge, moment = run_key.split(":")
        spans.setdefault(job, {})[edge] = float(moment)
    ordered = sorted((s["start"], s["end"]) for s in spans.values())
    assert len(ordered) == 6
    overlaps = [(a, b) for a, b in itertools.pairwise(ordered) if b[0] < a[1]]
    assert overlaps == [], "two ledger jobs held the single permit at once"
