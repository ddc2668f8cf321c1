"""PostgreSQL restarted under two running workers: they reconnect by themselves, every job
succeeds with its result readable, and an enqueue made while the server is down raises
StoreUnavailable and writes nothing.

The server restarted is a private cluster this test creates (initdb into a temporary
directory, on a free port), never the shared one other test runs use.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from celery import Celery, group
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.conftest import Cluster, wait_until
from tests.private_postgres import PrivatePostgres

pytestmark = [pytest.mark.slow, pytest.mark.infra]

JOBS = 500
REFUSED_GROUP = 50
#: Heartbeats fail (and are logged) within a second of the outage; the grace period is long
#: enough that the outage never makes a node look dead.
SETTINGS = {
    "RATCHET_NODE_HEARTBEAT_INTERVAL_SECONDS": "1",
    "RATCHET_NODE_ORPHAN_GRACE_SECONDS": "30",
    "RATCHET_ORPHAN_SCAN_INTERVAL_SECONDS": "1",
}
#: Seconds the server stays down (at least).
OUTAGE_SECONDS = 2.0
#: What a worker logs when it finds the store down (once per outage).
HEARTBEAT_FAILED = "ratchet: the job store is unreachable"


def unfinished(store: JobStore) -> int:
    counts = store.count_by_status()
    return counts.get("PENDING", 0) + counts.get("RUNNING", 0)


def rows_with_ids(private_app: Celery, ids: list[str]) -> int:
    with ratchet_state(private_app).store.engine.connect() as conn:
        statement = text("SELECT COUNT(*) FROM scheduler_job WHERE job_id = ANY(:ids)")
        return int(conn.execute(statement, {"ids": ids}).scalar_one())


def test_workers_ride_out_a_postgresql_restart_and_enqueues_fail_loudly_meanwhile(
    private_postgres: PrivatePostgres,
    private_app: Celery,
    private_cluster: Cluster,
    tmp_path: Path,
) -> None:
    store = ratchet_state(private_app).store
    noted = private_app.tasks["acc.noted_sleep"]
    keys = [f"r{i}" for i in range(JOBS)]
    result = group(noted.s(key, 0.05) for key in keys).apply_async()
    run_log = tmp_path / "runs.log"
    workers = [
        private_cluster.start(
            name, concurrency=4, RATCHET_ACCEPTANCE_RUN_LOG=str(run_log), **SETTINGS
        )
        for name in ("w1", "w2")
    ]
    started = time.monotonic()
    try:
        wait_until(
            lambda: store.count_by_status().get("SUCCEEDED", 0) >= JOBS // 5,
            60,
            "a fifth of the jobs done",
        )
        logged_before = [len(w.log.read_bytes()) for w in workers]
        stopped_at = time.monotonic()
        private_postgres.stop("fast")

        # Down: an enqueue raises at once, for a single task as for a group.
        private_app.conf.task_publish_retry_policy = {"max_retries": 0}
        with pytest.raises(StoreUnavailable):
            noted.delay("refused-single", 0)
        refused = [uuid.uuid4().hex for _ in range(REFUSED_GROUP)]
        with pytest.raises(StoreUnavailable):
            group(
                noted.s(f"refused-{i}", 0).set(task_id=task_id) for i, task_id in enumerate(refused)
            ).apply_async()
        # The server comes back once both workers have met the outage.
        wait_until(
            lambda: all(
                HEARTBEAT_FAILED in w.log.read_bytes()[n:].decode(errors="replace")
                for w, n in zip(workers, logged_before, strict=True)
            ),
            30,
            "both workers to notice the outage",
        )
        # Not synchronisation: how long the outage lasts, so that it spans several claims.
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped_at)))
        private_postgres.start()
        down = time.monotonic() - stopped_at
        wait_until(lambda: not unfinished(store), 90, "every job to finish")
    except Exception:
        print(private_cluster.logs())
        print(private_postgres.server_log())
        raise
    elapsed = time.monotonic() - started

    runs = Counter(line.split()[0] for line in run_log.read_text().splitlines())
    again = {key: n for key, n in runs.items() if n > 1}
    counts = store.count_by_status()
    print(
        f"\n[postgresql restart] {JOBS} jobs in {elapsed:.1f}s, server down {down:.1f}s; "
        f"statuses {counts}; {len(again)} jobs ran more than once: {sorted(again.items())[:20]}"
    )
    assert set(runs) == set(keys), "a job never ran, or a refused enqueue ran"
    assert rows_with_ids(private_app, refused) == 0, "part of the refused group was written"
    assert [w.process.poll() for w in workers] == [None, None], "a worker exited"
    nodes = {n["node_id"].split("@")[0] for n in store.list_nodes()}
    assert nodes == {"w1", "w2"}, f"both workers should still be registered: {nodes}"
    failed = [(j.job_id, j.last_error) for j in store.list_jobs(status=JobStatus.FAILED)]
    assert counts == {"SUCCEEDED": JOBS}, f"{counts}; failed jobs: {failed[:3]}"
    assert result.get(timeout=30) == keys
