"""Three worker nodes on one PostgreSQL database; one is killed with SIGKILL mid-run.

RATCHET_URL=postgresql://user@host/db python examples/multinode.py

Every job still runs (the survivors recover the dead node's jobs after the grace period),
and the recurring tick still fires once per second across all three nodes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from celery import Celery, group

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus

app = Celery("multinode", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_url = os.environ.get("RATCHET_URL", "postgresql://postgres@127.0.0.1/test")
# Short heartbeat and grace for a demo; production defaults are 10 s and 60 s.
app.conf.ratchet_node_heartbeat_interval_seconds = 1
app.conf.ratchet_node_orphan_grace_seconds = 3
app.conf.ratchet_orphan_scan_interval_seconds = 1


@app.task
def work(n: int) -> int:
    time.sleep(0.05)
    return n


@celery_ratchet.recurring(cron="* * * * * ?", id="multinode-tick", misfire_policy="skip")
@app.task(bind=True)
def tick(self) -> str:  # type: ignore[no-untyped-def]
    return str(self.request.eta)  # the fire time this run belongs to


def main() -> None:
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "celery", "-A", "multinode", "--quiet", "worker",
               "-P", "ratchet", "-c", "4", "-l", "error"]  # fmt: skip
    nodes = {
        name: subprocess.Popen([*command, "-n", f"{name}@%h"], env=env, start_new_session=True)
        for name in ("node1", "node2", "node3")
    }
    try:
        result = group(work.s(i) for i in range(600)).apply_async()
        time.sleep(4)
        os.killpg(nodes["node1"].pid, signal.SIGKILL)  # the node and its pool, mid-run
        print("node1 killed with SIGKILL")
        values = result.get(timeout=180)
        print(f"jobs: {len(values)} sent, {len(set(values))} distinct results, "
              f"lost: {600 - len(set(values))}")  # fmt: skip
        time.sleep(3)
    finally:
        for process in nodes.values():
            if process.poll() is None:
                process.terminate()
        for process in nodes.values():
            process.wait(60)
    runs = ratchet_state(app).store.list_jobs(task_name=tick.name, status=JobStatus.SUCCEEDED)
    fire_times = [app.AsyncResult(r.job_id).get(timeout=10) for r in runs]
    print(f"ticks run: {len(fire_times)}, distinct fire times: {len(set(fire_times))}")
    celery_ratchet.cancel_recurring(app, "multinode-tick")


if __name__ == "__main__":
    main()
