"""``async def`` tasks on real ``celery worker -P ratchet-async`` processes: thousands in
flight on one event loop, time limits that cancel the coroutine, and jobs of a killed worker
recovered like any other."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from celery import Celery, group

from celery_ratchet.celery.app import ratchet_state
from tests.acceptance.conftest import Cluster, side_effects, wait_until
from tests.acceptance.test_chaos import held_by
from tests.acceptance.test_faults import SHORT_GRACE

pytestmark = pytest.mark.slow

POOL = "ratchet-async"
SLEEPERS = 2000


def test_2000_coroutines_wait_at_once_on_one_worker_process(
    server_app: Celery, server_cluster: Cluster, server_dialect: str
) -> None:
    store = ratchet_state(server_app).store
    sleep = server_app.tasks["acc.async_sleep"]
    singles = [sleep.delay(1) for _ in range(SLEEPERS // 2)]
    batch = group(sleep.s(1) for _ in range(SLEEPERS // 2)).apply_async()
    started = time.monotonic()
    server_cluster.start("w1", pool=POOL)
    try:
        peaks = [r.get(timeout=180) for r in singles] + batch.get(timeout=180)
    except Exception:
        print(server_cluster.logs())
        raise
    took = time.monotonic() - started
    print(f"\n[{server_dialect}] {SLEEPERS} x asyncio.sleep(1) on one process: {took:.1f}s "
          f"from the worker's start, at most {max(peaks)} at once")  # fmt: skip
    assert store.count_by_status() == {"SUCCEEDED": SLEEPERS}
    # 500 single jobs at most at once (ratchet_async_limit_single), plus batch children.
    assert max(peaks) > 500


def test_a_coroutine_over_its_time_limit_is_cancelled_and_retried(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    over = server_app.tasks["acc.async_over_limit"]
    result = over.delay("late")
    server_cluster.start("w1", pool=POOL)
    try:
        assert result.get(timeout=60) == "late done on attempt 1"
    except Exception:
        print(server_cluster.logs())
        raise
    runs = Counter(key for key, _ in side_effects(store))
    assert runs == {"late:start:0": 1, "late:cancelled:0": 1, "late:start:1": 1}
    assert store.count_by_status() == {"SUCCEEDED": 1}


def test_jobs_of_a_killed_async_worker_are_recovered_and_finish_elsewhere(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    noted = server_app.tasks["acc.async_noted"]
    keys = [f"k{i}" for i in range(300)]
    result = group(noted.s(key, 3) for key in keys).apply_async()
    victim = server_cluster.start("victim", pool=POOL, **SHORT_GRACE)
    try:
        wait_until(lambda: len(side_effects(store)) == len(keys), 60, "every job running")
        assert held_by(store, victim.pid) == len(keys)
        victim.kill()
        server_cluster.start("rescuer", pool=POOL, **SHORT_GRACE)
        assert sorted(result.get(timeout=120)) == sorted(keys)
    except Exception:
        print(server_cluster.logs())
        raise
    runs = Counter(key.partition(":")[0] for key, _ in side_effects(store))
    assert set(runs) == set(keys)
    assert set(runs.values()) == {2}, "each job ran once on each worker"
    assert store.count_by_status() == {"SUCCEEDED": len(keys)}
    assert held_by(store, victim.pid) == 0
