"""Workers killed with SIGKILL while thousands of jobs drain, on PostgreSQL and MariaDB.

A killed node takes nothing with it: the orphan scan of the survivors hands its RUNNING jobs
back within scan interval + heartbeat interval + grace (a survivor must see the dead node's
heartbeat stand still for the grace period), every job succeeds, and the only jobs that run
twice are jobs the dead node had started.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest
from celery import Celery, group
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.app import SIDE_EFFECTS
from tests.acceptance.conftest import Cluster, Worker, wait_until

pytestmark = pytest.mark.slow

JOBS = 3000
WORKERS = 3
KILLS = 3
HEARTBEAT, GRACE, SCAN = 1, 3, 1
SETTINGS = {
    "RATCHET_NODE_HEARTBEAT_INTERVAL_SECONDS": str(HEARTBEAT),
    "RATCHET_NODE_ORPHAN_GRACE_SECONDS": str(GRACE),
    "RATCHET_ORPHAN_SCAN_INTERVAL_SECONDS": str(SCAN),
}


def held_by(store: JobStore, pid: int, status: str = "RUNNING") -> int:
    """Rows in ``status`` last claimed by the worker whose main process is ``pid`` (node ids
    are ``hostname/pid/suffix``)."""
    with store.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT COUNT(*) FROM scheduler_job "
                    "WHERE status = :status AND picked_by LIKE :node"
                ),
                {"status": status, "node": f"%/{pid}/%"},
            ).scalar_one()
        )


def succeeded(store: JobStore) -> int:
    return store.count_by_status().get("SUCCEEDED", 0)


def finished(store: JobStore) -> int:
    counts = store.count_by_status()
    return sum(n for status, n in counts.items() if status not in ("PENDING", "RUNNING"))


def runs_by_worker(store: JobStore) -> dict[str, list[int]]:
    """Each task's executions: the main process (ppid) of the worker that ran each one."""
    runs: dict[str, list[int]] = defaultdict(list)
    with store.engine.connect() as conn:
        for key, ppid in conn.execute(text(f"SELECT run_key, ppid FROM {SIDE_EFFECTS}")):
            runs[key].append(ppid)
    return runs


def kill_and_time_recovery(
    store: JobStore, victim: Worker, start: Callable[[], Worker]
) -> tuple[Worker, int, float]:
    """SIGKILL ``victim`` (and its pool), start a replacement, and wait until none of the
    victim's jobs is RUNNING any more: all handed back, or finished elsewhere. Returns the
    replacement, how many jobs the victim held just before the kill, and the seconds from
    the kill to that moment."""
    held = held_by(store, victim.pid)
    killed_at = time.monotonic()
    victim.kill()
    replacement = start()
    wait_until(lambda: held_by(store, victim.pid) == 0, 60, f"recovery of {victim.name}'s jobs")
    return replacement, held, time.monotonic() - killed_at


def test_workers_killed_mid_run_lose_no_job_and_rerun_only_their_own(
    server_app: Celery, server_cluster: Cluster, server_dialect: str
) -> None:
    store = ratchet_state(server_app).store
    sleep = server_app.tasks["acc.sleep"]
    keys = [f"c{i}" for i in range(JOBS)]
    # Short jobs, so that every worker has some in flight when it is killed, yet long enough
    # (50 to 110 ms) that the run outlasts the three kills and recoveries on a fast machine.
    batch = group(sleep.s(key, 0.05 + (i % 16) * 0.004) for i, key in enumerate(keys))
    result = batch.apply_async()
    started = time.monotonic()
    names = (f"w{n}" for n in range(1, WORKERS + KILLS + 1))

    def start() -> Worker:
        return server_cluster.start(next(names), concurrency=4, **SETTINGS)

    live = [start() for _ in range(WORKERS)]
    killed: list[Worker] = []
    recoveries: list[tuple[str, int, float]] = []
    try:
        wait_until(lambda: succeeded(store) >= JOBS // 10, 60, "a tenth of the jobs done")
        for _ in range(KILLS):
            victim = live.pop(0)
            # Kill when the victim has jobs in flight and the last replacement has joined in.
            wait_until(
                lambda v=victim, n=live[-1]: (
                    held_by(store, v.pid) > 0 and held_by(store, n.pid, "SUCCEEDED") > 0
                ),
                60,
                f"{victim.name} running jobs and {live[-1].name} working",
            )
            replacement, held, seconds = kill_and_time_recovery(store, victim, start)
            live.append(replacement)
            killed.append(victim)
            recoveries.append((victim.name, held, seconds))
        wait_until(lambda: finished(store) == JOBS, 120, f"all {JOBS} jobs to finish")
    except Exception:
        print(server_cluster.logs())
        raise
    elapsed = time.monotonic() - started

    runs = runs_by_worker(store)
    dead = {w.pid for w in killed}
    reruns = {key: ppids for key, ppids in runs.items() if len(ppids) > 1}
    extra = sum(len(p) - 1 for p in reruns.values())
    on_dead = Counter(ppid for ppids in runs.values() for ppid in ppids if ppid in dead)
    by_name = {w.name: on_dead[w.pid] for w in killed}
    print(
        f"\n[{server_dialect}] {JOBS} jobs drained in {elapsed:.1f}s by {WORKERS} workers, "
        f"{len(killed)} SIGKILLed: {len(reruns)} jobs ran again ({extra} extra runs); "
        f"runs by the killed workers: {by_name}\n"
        + "\n".join(
            f"  kill of {name}: held {held} RUNNING, all back or done elsewhere after {s:.2f}s"
            for name, held, s in recoveries
        )
    )

    assert len(killed) == KILLS
    assert store.count_by_status() == {"SUCCEEDED": JOBS}, "a job was lost or left unfinished"
    assert result.get(timeout=60) == keys
    assert set(runs) == set(keys), f"side effects missing: {sorted(set(keys) - set(runs))[:20]}"
    # A live worker runs a job once; only a dead worker's execution may have been cut short.
    twice_alive = {key: p for key, p in runs.items() if sum(x not in dead for x in p) > 1}
    assert twice_alive == {}, f"jobs run twice by live workers: {list(twice_alive.items())[:10]}"
    not_killed = {key: p for key, p in reruns.items() if not dead & set(p)}
    assert not_killed == {}, f"re-runs of jobs no killed worker had started: {not_killed}"
    # How long each recovery took is printed above, not asserted: on a loaded machine the
    # survivors' scans run late, which says nothing about whether a job was lost or run twice.
