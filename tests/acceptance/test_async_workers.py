"""``async def`` tasks on real ``celery worker -P ratchet-async`` processes: thousands in
flight on one event loop, time limits that cancel the coroutine, and jobs of a killed worker
recovered like any other."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from celery import Celery, group
from celery.exceptions import TaskRevokedError, TimeLimitExceeded
from celery.result import AsyncResult

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.conftest import Cluster, side_effects, wait_until
from tests.acceptance.test_chaos import held_by
from tests.acceptance.test_faults import SHORT_GRACE

pytestmark = pytest.mark.slow

POOL = "ratchet-async"
#: What the worker says when a job failed by its time limit ends at last.
LATE_END = "after its hard time limit, which failed it already"


def run_keys(store: JobStore) -> list[str]:
    return [key for key, _ in side_effects(store)]


SLEEPERS = 2000
GATHER = 1001


def test_2000_coroutines_wait_at_once_on_one_worker_process(
    server_app: Celery, server_cluster: Cluster, server_dialect: str
) -> None:
    store = ratchet_state(server_app).store
    sleep = server_app.tasks["acc.async_sleep"]
    # Each waits until more than the single-job limit (1000) have been running at once.
    singles = [sleep.delay(1, GATHER) for _ in range(SLEEPERS // 2)]
    batch = group(sleep.s(1, GATHER) for _ in range(SLEEPERS // 2)).apply_async()
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
    # 1000 single jobs at most at once (ratchet_async_limit_single), plus batch children.
    assert max(peaks) >= GATHER


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
    result = group(noted.s(key, 10) for key in keys).apply_async()
    victim = server_cluster.start("victim", pool=POOL, **SHORT_GRACE)
    try:
        wait_until(lambda: len(side_effects(store)) == len(keys), 60, "every job running")
        held = held_by(store, victim.pid)
        assert held > 0
        victim.kill()
        server_cluster.start("rescuer", pool=POOL, **SHORT_GRACE)
        assert sorted(result.get(timeout=120)) == sorted(keys)
    except Exception:
        print(server_cluster.logs())
        raise
    runs = Counter(key.partition(":")[0] for key in run_keys(store))
    assert set(runs) == set(keys)
    again = [key for key, count in runs.items() if count == 2]
    assert set(runs.values()) <= {1, 2}, "a job ran more than once after the kill"
    # Those the victim was running ran again on the rescuer; none of the others did.
    assert 0 < len(again) <= held
    assert store.count_by_status() == {"SUCCEEDED": len(keys)}
    assert held_by(store, victim.pid) == 0


def test_celery_features_work_for_coroutines_as_for_sync_tasks(
    ratchet_app: Celery, cluster: Cluster
) -> None:
    """Signals and self.retry inside a coroutine, the soft time limit, a revoke that
    terminates one coroutine (not the process), sends from async code, sync tasks."""
    store = ratchet_state(ratchet_app).store
    tasks = ratchet_app.tasks
    long = tasks["acc.async_cancellable"].delay("long", 30)
    other = tasks["acc.async_cancellable"].delay("other", 1)
    flaky = tasks["acc.async_flaky"].delay("f")
    soft = tasks["acc.async_soft_limited"].delay()
    fan_out = tasks["acc.async_fan_out"].delay(5)
    cluster.start("w1", pool=POOL, concurrency=2)
    try:
        wait_until(lambda: "long:start" in run_keys(store), 60, "the long coroutine to start")
        ratchet_app.control.revoke(long.id, terminate=True, signal="SIGKILL")
        with pytest.raises(TaskRevokedError):
            long.get(timeout=30)
        assert other.get(timeout=30) == "other", "the terminate reached another job"
        assert flaky.get(timeout=30) == 2
        assert soft.get(timeout=30) == "caught soft limit"
        children = [AsyncResult(job_id, app=ratchet_app) for job_id in fan_out.get(timeout=30)]
        assert [child.get(timeout=30) for child in children] == [0, 2, 4, 6, 8]
        # A sync task on this pool: in a thread.
        assert tasks["acc.double"].delay(21).get(timeout=30) == 42
    except Exception:
        print(cluster.logs())
        raise
    wait_until(lambda: "long:cancelled" in run_keys(store), 30, "the revoked one cancelled")
    runs = run_keys(store)
    flaky_signals = [key for key in runs if key.split(":")[0] in ("prerun", "postrun",
                     "retry", "success")]  # fmt: skip
    # Each try's signals in Celery's order. Tries may overlap: the retry is sent (0.1 s
    # countdown) before its try's retry signal, and on a busy database the next try has been
    # seen starting on the other slot before that signal's row was written.
    by_try: dict[str, list[str]] = {}
    for key in flaky_signals:
        name, attempt = key.split(":")
        by_try.setdefault(attempt, []).append(name)
    assert by_try == {
        "0": ["prerun", "retry", "postrun"],
        "1": ["prerun", "retry", "postrun"],
        "2": ["prerun", "success", "postrun"],
    }
    assert [k for k in flaky_signals if k.startswith("prerun")] == [
        "prerun:0", "prerun:1", "prerun:2"
    ]  # fmt: skip
    revoked = store.result(long.id)
    assert revoked is not None and revoked.status is JobStatus.REVOKED
    record = store.result(children[0].id)
    assert record is not None and json.loads(record.headers or "{}")["parent_id"] == fan_out.id
    assert store.count_by_status().get("RUNNING", 0) == 0


def test_a_warm_stop_lets_running_coroutines_finish_and_hands_back_the_rest(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    noted = server_app.tasks["acc.async_noted"]
    keys = [f"s{i}" for i in range(40)]
    results = [noted.delay(key, 2) for key in keys]
    worker = server_cluster.start(
        "w1", pool=POOL, RATCHET_ASYNC_LIMIT_SINGLE="10", RATCHET_CLAIM_BATCH_SIZE="10"
    )
    try:
        wait_until(lambda: len(run_keys(store)) >= 10, 60, "ten coroutines running")
        assert worker.stop() == 0
        counts = store.count_by_status()
        assert counts.get("RUNNING", 0) == 0, f"claims left behind: {counts}"
        assert 10 <= counts.get("SUCCEEDED", 0) < len(keys)
        assert store.list_nodes() == []
        server_cluster.start("w2", pool=POOL)
        assert [r.get(timeout=60) for r in results] == keys
    except Exception:
        print(server_cluster.logs())
        raise
    runs = Counter(key.partition(":")[0] for key in run_keys(store))
    assert set(runs.values()) == {1}, "a job ran twice across the stop"


#: Longer than the minute the pool used to wait at a warm stop before cutting jobs off.
LONG_RUN = 65


def test_a_warm_stop_waits_for_jobs_that_run_longer_than_a_minute(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    coroutine = server_app.tasks["acc.async_noted"].delay("long-async", LONG_RUN)
    in_thread = server_app.tasks["acc.sleep"].delay("long-sync", LONG_RUN)
    worker = server_cluster.start("w1", pool=POOL)
    try:
        wait_until(lambda: len(run_keys(store)) == 2, 60, "both jobs running")
        assert worker.stop(timeout=LONG_RUN + 60) == 0
        assert coroutine.get(timeout=10) == "long-async"
        assert in_thread.get(timeout=10) == "long-sync"
    except Exception:
        print(server_cluster.logs())
        raise
    assert store.count_by_status() == {"SUCCEEDED": 2}
    assert sorted(run_keys(store)) == ["long-async:0", "long-sync"]


def test_a_cold_stop_during_a_warm_one_cuts_the_waiting_jobs_off_and_hands_them_back(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    long = server_app.tasks["acc.async_noted"].delay("cut", LONG_RUN)
    worker = server_cluster.start("w1", pool=POOL)
    try:
        wait_until(lambda: run_keys(store) == ["cut:0"], 60, "the job running")
        worker.process.send_signal(signal.SIGTERM)
        wait_until(
            lambda: "warm shutdown" in server_cluster.whole_logs().lower(), 30, "the warm stop"
        )
        worker.stop(signal.SIGQUIT, timeout=30)
        assert store.count_by_status().get("RUNNING", 0) == 0
        record = store.result(long.id)
        assert record is not None and record.status is JobStatus.PENDING
    except Exception:
        print(server_cluster.logs())
        raise


def test_a_warm_stop_does_not_wait_for_a_coroutine_already_failed_by_its_time_limit(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    deaf = server_app.tasks["acc.async_deaf"].delay("deaf")
    worker = server_cluster.start("w1", pool=POOL)
    try:
        wait_until(lambda: "deaf:ignored the cancel" in run_keys(store), 60, "the ignored cancel")
        wait_until(lambda: store.count_by_status() == {"FAILED": 1}, 60, "the time limit failure")
        # Its outcome is written (the time limit): nothing is left for the stop to wait for.
        assert worker.stop(timeout=50) == 0
    except Exception:
        print(server_cluster.logs())
        raise
    record = store.result(deaf.id)
    assert record is not None and record.status is JobStatus.FAILED


def test_the_seeds_virtual_threads_setting_runs_the_async_pool(
    server_app: Celery, server_cluster: Cluster
) -> None:
    """RATCHET_WORKER_USE_VIRTUAL_THREADS=true on a worker started with -P ratchet: its
    ``async def`` jobs run as coroutines side by side, not one at a time per process."""
    sleep = server_app.tasks["acc.async_sleep"]
    # Each waits until all 20 have been running at once in its process.
    results = [sleep.delay(0.1, 20) for _ in range(20)]
    server_cluster.start("w1", concurrency=2, RATCHET_WORKER_USE_VIRTUAL_THREADS="true")
    try:
        peaks = [r.get(timeout=60) for r in results]
    except Exception:
        print(server_cluster.logs())
        raise
    assert max(peaks) == 20


def test_the_seeds_virtual_threads_setting_refuses_another_pool_named(
    server_app: Celery, server_cluster: Cluster
) -> None:
    worker = server_cluster.start("w1", pool="threads", RATCHET_WORKER_USE_VIRTUAL_THREADS="true")
    assert worker.process.wait(60) != 0
    log = server_cluster.whole_logs()
    assert "-P ratchet-async" in log and "-P threads" in log, log


@pytest.mark.parametrize("task", ["acc.async_blocking", "acc.sync_limited"])
def test_code_that_cannot_be_interrupted_fails_at_its_time_limit_and_its_late_end_is_dropped(
    server_app: Celery, server_cluster: Cluster, task: str, tmp_path: Path
) -> None:
    """A blocking call in a coroutine, or a plain task in the pool's threads, outlasts its
    hard time limit: nothing can interrupt it, so the job fails with TimeLimitExceeded at
    the limit, and what the code returns when it ends at last changes nothing."""
    store = ratchet_state(server_app).store
    gate = tmp_path / "open"
    result = server_app.tasks[task].delay("blocked", str(gate))
    worker = server_cluster.start("w1", pool=POOL)
    try:
        with pytest.raises(TimeLimitExceeded):
            result.get(timeout=60)
        assert run_keys(store) == ["blocked:start"]
        gate.touch()
        wait_until(lambda: "blocked:woke" in run_keys(store), 60, "the block to end")
        wait_until(lambda: LATE_END in worker.log.read_text(), 60, "its late end dropped")
    except Exception:
        print(server_cluster.logs())
        raise
    log = worker.log.read_text()
    assert store.count_by_status() == {"FAILED": 1}
    assert result.state == "FAILURE"
    assert log.count("Hard time limit (1s) exceeded") == 1, log[-3000:]
