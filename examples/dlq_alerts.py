"""Dead-letter alerts: ten jobs fail for good, one alert task receives one summary of them.

python examples/dlq_alerts.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery

import celery_ratchet

app = Celery("dlq_alerts", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_url = "sqlite:///ratchet-dlq-alerts.db"
app.conf.ratchet_poll_interval = 0.2
# The alert task's registered Celery name, and at most one alert per task name per 3 s.
app.conf.ratchet_dlq_alert_task = "dlq_alerts.on_dead_letters"
app.conf.ratchet_dlq_alert_interval_seconds = 3

ALERTS = Path("dlq-alerts.jsonl")


@app.task
def charge(order_id: int) -> None:
    raise ValueError(f"order {order_id}: card declined")


@app.task
def on_dead_letters(summary: dict[str, Any]) -> None:
    """Page someone, post to a chat room...; here: append the summary to a file."""
    with ALERTS.open("a") as out:
        out.write(json.dumps(summary) + "\n")


def main() -> None:
    here = Path(__file__).resolve().parent
    ALERTS.unlink(missing_ok=True)
    results = [charge.delay(i) for i in range(10)]
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "dlq_alerts", "--quiet", "worker",
         "-P", "ratchet", "-c", "4", "-l", "critical"],
        env={**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    try:
        for result in results:
            result.get(timeout=60, propagate=False)
        dlq = celery_ratchet.dlq(app)
        letters = dlq.list(task_name=charge.name)
        shown = sorted(set(dlq.alerts_of(letters).values()))
        print(f"dead letters: {len(letters)}, alert: {shown}")
        deadline = time.monotonic() + 60
        while not ALERTS.exists() and time.monotonic() < deadline:
            time.sleep(0.2)  # the window closes 3 s after the first failure
        [summary] = [json.loads(line) for line in ALERTS.read_text().splitlines()]
        print(f"alert: {summary['count']} dead letters of {summary['task_name']}")
        print(f"newest error: {summary['newest_error']}")
        letters = dlq.list(task_name=charge.name)
        print(f"after the alert: {sorted(set(dlq.alerts_of(letters).values()))}")
    finally:
        worker.terminate()
        worker.wait(60)
        ALERTS.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
