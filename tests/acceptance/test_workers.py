"""Two real ``-P ratchet`` workers: every task runs exactly once, with no broker."""

from __future__ import annotations

from collections import Counter

import pytest
from celery import Celery, group
from celery.exceptions import TimeLimitExceeded

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from tests.acceptance.conftest import Cluster, side_effects, wait_until

pytestmark = pytest.mark.slow

TASKS = 1000


def test_two_workers_run_each_of_1000_tasks_exactly_once(
    ratchet_app: Celery, cluster: Cluster
) -> None:
    double = ratchet_app.tasks["acc.double"]
    store = ratchet_state(ratchet_app).store
    cluster.start("w1")
    cluster.start("w2")
    try:
        # Both registered before anything is sent: else one worker booting late on a loaded
        # machine finds the other has run everything.
        wait_until(lambda: len(store.list_nodes()) == 2, 60, "both workers registered")
        singles = [double.delay(n) for n in range(TASKS // 2)]
        batch = group(double.s(n) for n in range(TASKS // 2, TASKS)).apply_async()
        results = [r.get(timeout=120) for r in singles] + batch.get(timeout=120)
    except Exception:
        print(cluster.logs())
        raise
    assert results == [2 * n for n in range(TASKS)]
    runs = side_effects(store)
    counts = Counter(key for key, _ in runs)
    assert len(counts) == TASKS and set(counts.values()) == {1}, "a task ran twice or never"
    assert store.count_by_status() == {"SUCCEEDED": TASKS}
    workers = {job.picked_by.split("/")[0] for job in store.list_jobs(limit=TASKS)}
    assert len(workers) == 2, f"both workers should have taken jobs: {workers}"


def test_time_limits_apply_in_the_worker(ratchet_app: Celery, cluster: Cluster) -> None:
    soft = ratchet_app.tasks["acc.soft_limited"].delay()
    hard = ratchet_app.tasks["acc.hard_limited"].delay()
    cluster.start("w1")
    assert soft.get(timeout=60) == "caught soft limit"
    with pytest.raises(TimeLimitExceeded):
        hard.get(timeout=60)
    store = ratchet_state(ratchet_app).store
    wait_until(lambda: store.result(hard.id).status is JobStatus.FAILED, 30, "hard limit")


def test_warm_shutdown_finishes_running_jobs_and_hands_back_the_rest(
    ratchet_app: Celery, cluster: Cluster
) -> None:
    sleep = ratchet_app.tasks["acc.sleep"]
    results = [sleep.delay(f"s{i}", 1.5) for i in range(24)]
    store = ratchet_state(ratchet_app).store
    worker = cluster.start("w1")
    # A job has started (not only been claimed): a warm stop lets it finish.
    wait_until(lambda: len(side_effects(store)) > 0, 60, "a job to start")
    assert worker.stop() == 0
    counts = store.count_by_status()
    assert counts.get("RUNNING", 0) == 0, f"claims left behind: {counts}"
    finished = counts.get("SUCCEEDED", 0)
    assert 0 < finished < 24
    assert store.list_nodes() == []
    cluster.start("w2")
    assert [r.get(timeout=120) for r in results] == [f"s{i}" for i in range(24)]
    runs = Counter(key for key, _ in side_effects(store))
    assert set(runs.values()) == {1}
