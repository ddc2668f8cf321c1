"""A recurring job from Quartz cron, fired exactly once per tick by whichever worker claims it.

python examples/recurring.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from celery import Celery

import celery_ratchet

app = Celery("recurring", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_url = "sqlite:///ratchet-recurring.db"
app.conf.ratchet_poll_interval = 0.2
TICKS = Path("ticks.txt")


@celery_ratchet.recurring(cron="*/2 * * * * ?", id="every-two-seconds", misfire_policy="skip")
@app.task(bind=True)
def tick(self) -> None:  # type: ignore[no-untyped-def]
    with TICKS.open("a") as out:
        out.write(f"{self.request.eta}\n")  # the fire time this run belongs to


def _fired() -> int:
    return len(TICKS.read_text().split()) if TICKS.exists() else 0


def main() -> None:
    here = Path(__file__).resolve().parent
    TICKS.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    # Two workers: each registers the schedule, yet every tick runs once.
    command = [sys.executable, "-m", "celery", "-A", "recurring", "--quiet", "worker",
               "-P", "threads", "-c", "2", "-l", "warning"]  # fmt: skip
    workers = [subprocess.Popen([*command, "-n", f"w{i}@%h"], env=env) for i in (1, 2)]
    try:
        # Until a few ticks have run (workers take a moment to start on a busy machine).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _fired() < 4:
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(60)
    fired = TICKS.read_text().split() if TICKS.exists() else []
    print(f"ticks fired: {len(fired)}, distinct fire times: {len(set(fired))}")
    TICKS.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
