"""Business keys: one active job per key, whoever sends it and however often. SQLite, no
broker; the same on PostgreSQL and MariaDB (set RATCHET_URL).

python examples/business_keys.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from celery import Celery

import celery_ratchet

app = Celery("business_keys", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_url = os.environ.get("RATCHET_URL", "sqlite:///ratchet-business-keys.db")
app.conf.ratchet_poll_interval = 0.2


@app.task
def sync_tenant(tenant: str) -> str:
    return f"{tenant} synced"


@app.task
def handle_payment_event(event_id: str, amount: int) -> str:
    return f"event {event_id}: {amount} booked"


def sync(tenant: str) -> Any:
    # Per-tenant jobs: at most one sync per tenant pending or running at a time.
    return sync_tenant.apply_async((tenant,), ratchet={"business_key": f"sync:{tenant}"})


def main() -> None:
    here = Path(__file__).resolve().parent
    first = sync("acme")
    again = [sync("acme"), sync("acme")]  # a user clicking "sync" three times
    other = sync("globex")
    print(f"acme's three sends share one job: {all(r.id == first.id for r in again)}")
    print(f"globex has its own: {other.id != first.id}")

    # A webhook the provider sends again because our reply was slow: the event id is the
    # key, so the retried delivery finds the job of the first one instead of booking twice.
    delivery = handle_payment_event.apply_async(
        ("evt_1001", 4200), ratchet={"business_key": "payment-event:evt_1001"}
    )
    retried = handle_payment_event.apply_async(
        ("evt_1001", 4200), ratchet={"business_key": "payment-event:evt_1001"}
    )
    print(f"retried webhook delivery got the same job: {retried.id == delivery.id}")
    try:
        handle_payment_event.apply_async(
            ("evt_1001", 4200),
            ratchet={"business_key": "payment-event:evt_1001", "on_duplicate": "raise"},
        )
    except celery_ratchet.DuplicateJob as exc:
        print(
            f"on_duplicate='raise': DuplicateJob names the active job: {exc.job_id == delivery.id}"
        )

    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "business_keys", "--quiet", "worker",
         "-P", "ratchet", "-c", "2", "-l", "warning"],
        env={**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    try:
        print(first.get(timeout=60), "|", other.get(timeout=60), "|", delivery.get(timeout=60))
        # The job has ended: the key is free, and the next send is a new job.
        later = sync("acme")
        print(f"after it ran, acme's next sync is a new job: {later.id != first.id}")
        print(later.get(timeout=60))
    finally:
        worker.terminate()
        worker.wait(60)


if __name__ == "__main__":
    main()
