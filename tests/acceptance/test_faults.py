"""Faults under real workers: the database killed for longer than the grace period, a worker
frozen past it, a job that kills every worker that runs it. No job runs twice because a node
was merely cut off or paused, and no job runs forever.

The database is a private PostgreSQL cluster each test creates, killed with ``kill -9`` of
its postmaster; grace periods are a few seconds.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from celery import Celery, group

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.errors import RecoveryLimitExceeded
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.conftest import (
    Cluster,
    assert_each_ran_once,
    noted_runs,
    side_effects,
    wait_until,
)
from tests.acceptance.test_chaos import held_by
from tests.private_postgres import PrivatePostgres

pytestmark = [pytest.mark.slow, pytest.mark.infra]

HEARTBEAT, GRACE, SCAN = 1, 5, 1
SHORT_GRACE = {
    "RATCHET_NODE_HEARTBEAT_INTERVAL_SECONDS": str(HEARTBEAT),
    "RATCHET_NODE_ORPHAN_GRACE_SECONDS": str(GRACE),
    "RATCHET_ORPHAN_SCAN_INTERVAL_SECONDS": str(SCAN),
}
#: The store's two lines of an outage, each logged once per worker.
OUTAGE_STARTS = "ratchet: the job store is unreachable"
OUTAGE_ENDS = "is reachable again after"


def _unfinished(store: JobStore) -> int:
    counts = store.count_by_status()
    return counts.get("PENDING", 0) + counts.get("RUNNING", 0)


def test_a_database_outage_longer_than_the_grace_period_runs_no_job_twice_and_logs_twice(
    private_postgres: PrivatePostgres,
    private_app: Celery,
    private_cluster: Cluster,
    tmp_path: Path,
) -> None:
    store = ratchet_state(private_app).store
    noted = private_app.tasks["acc.noted_sleep"]
    run_log = tmp_path / "runs.log"
    workers = [
        private_cluster.start(
            name, concurrency=6, RATCHET_ACCEPTANCE_RUN_LOG=str(run_log), **SHORT_GRACE
        )
        for name in ("w1", "w2")
    ]
    try:
        wait_until(lambda: len(store.list_nodes()) == 2, 60, "both workers registered")
        # Long jobs, still running well after the database is back; short ones that end,
        # and write their results, while it is away.
        long_keys = [f"long{i}" for i in range(4)]
        short_keys = [f"short{i}" for i in range(4)]
        group(noted.s(key, 30) for key in long_keys).apply_async()
        wait_until(lambda: len(noted_runs(run_log)) == 4, 60, "the long jobs running")
        group(noted.s(key, 2) for key in short_keys).apply_async()
        wait_until(lambda: len(noted_runs(run_log)) == 8, 60, "the short jobs running")
        logged_before = [len(w.log.read_bytes()) for w in workers]
        killed_at = time.monotonic()
        private_postgres.kill()
        # Not synchronisation: how long the outage lasts, twice the grace period.
        time.sleep(max(0.0, 2 * GRACE - (time.monotonic() - killed_at)))
        private_postgres.restart_after_crash()
        down = time.monotonic() - killed_at
        wait_until(lambda: not _unfinished(store), 120, "every job to finish")
    except Exception:
        print(private_cluster.logs())
        print(private_postgres.server_log())
        raise

    runs = noted_runs(run_log)
    print(f"\n[outage of {down:.1f}s, grace {GRACE}s] runs: {dict(runs)}")
    assert_each_ran_once(runs, long_keys + short_keys, " after the outage")
    assert store.count_by_status() == {"SUCCEEDED": 8}
    assert {n["node_id"].split("@")[0] for n in store.list_nodes()} == {"w1", "w2"}
    for worker, offset in zip(workers, logged_before, strict=True):
        log = worker.log.read_bytes()[offset:].decode(errors="replace")
        assert "declared dead" not in log, f"{worker.name}:\n{log[-3000:]}"
        lines = Counter(
            "starts" if OUTAGE_STARTS in line else "ends" if OUTAGE_ENDS in line else "other"
            for line in log.splitlines()
        )
        assert (lines["starts"], lines["ends"]) == (1, 1), f"{worker.name}:\n{log[-3000:]}"
        assert "Failed operation" not in log, f"{worker.name}:\n{log[-3000:]}"


def test_a_frozen_worker_starts_none_of_the_jobs_it_lost_when_it_resumes(
    private_app: Celery, private_cluster: Cluster
) -> None:
    store = ratchet_state(private_app).store
    sleep = private_app.tasks["acc.sleep"]
    # Longer grace than the other cases: the frozen worker's children go on running what its
    # pool already gave them, and all of that must end before the grace does.
    settings = {**SHORT_GRACE, "RATCHET_NODE_ORPHAN_GRACE_SECONDS": "10"}
    keys = [f"f{i}" for i in range(8)]
    # Stored before the worker starts, as one batch: its first claim takes all eight (two
    # executing, two waiting in its pool, four in its buffer), whatever the machine's load.
    group([sleep.s(key, 3) for key in keys]).apply_async()
    frozen = private_cluster.start("frozen", concurrency=2, **settings)
    try:
        wait_until(
            lambda: held_by(store, frozen.pid) == len(keys) and len(side_effects(store)) >= 1,
            60,
            "the first worker holding every job, and running some",
        )
        frozen.process.send_signal(signal.SIGSTOP)
        assert len(side_effects(store)) < len(keys), "every job started before the freeze"
        other = private_cluster.start("other", concurrency=2, **settings)
        # Resumed only once the other declared it dead: its jobs' having ended is not enough.
        wait_until(
            lambda: "declared dead" in other.log.read_text(), 90, "the frozen one declared dead"
        )
        wait_until(lambda: held_by(store, frozen.pid) == 0, 90, "the other worker to take the jobs")
        frozen.process.send_signal(signal.SIGCONT)
        wait_until(lambda: "declared dead" in frozen.log.read_text(), 60, "the frozen one told")
        wait_until(lambda: not _unfinished(store), 90, "every job to finish")
        # A warm shutdown waits for its pool: whatever it would still start, it starts now.
        assert frozen.stop() == 0
    except Exception:
        if frozen.process.poll() is None:
            frozen.process.send_signal(signal.SIGCONT)
        print(private_cluster.logs())
        raise

    runs = Counter(key for key, _ in side_effects(store))
    print(f"\n[frozen past the grace] runs: {dict(runs)}")
    assert set(runs) == set(keys)
    assert {k: n for k, n in runs.items() if n > 1} == {}, "the resumed worker ran lost jobs"
    assert store.count_by_status() == {"SUCCEEDED": 8}
    assert held_by(store, other.pid, "SUCCEEDED") > 0


def test_a_job_that_kills_every_worker_running_it_goes_to_the_dead_letter_queue(
    private_app: Celery, private_cluster: Cluster
) -> None:
    store = ratchet_state(private_app).store
    crash = private_app.tasks["acc.crash_worker"]
    settings = {**SHORT_GRACE, "RATCHET_MAX_RECOVERIES": "1"}
    workers = [private_cluster.start(f"w{i}", concurrency=1, **settings) for i in (1, 2, 3)]
    try:
        wait_until(lambda: len(store.list_nodes()) == 3, 60, "three workers registered")
        result = crash.delay("poison")
        wait_until(lambda: store.count_by_status().get("FAILED") == 1, 120, "the job dead-lettered")
    except Exception:
        print(private_cluster.logs())
        raise

    runs = [key for key, _ in side_effects(store)]
    dead = [w.name for w in workers if w.process.poll() is not None]
    print(f"\n[recovery cap 1] runs {runs}, dead workers {dead}")
    # Run once, recovered once and run again: its second recovery is refused.
    assert runs == ["poison", "poison"] and len(dead) == 2
    [failed] = store.list_jobs(status=JobStatus.FAILED)
    assert failed.job_id == result.id
    assert result.state == "FAILURE"
    error = result.result
    assert isinstance(error, RecoveryLimitExceeded), repr(error)
    assert "after 2 claims" in str(error) and "ratchet_max_recoveries = 1" in str(error)
    assert store.count_by_status() == {"FAILED": 1}
