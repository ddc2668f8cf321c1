"""Retries with backoff, the dead-letter queue, a resource permit: one file, SQLite, no broker.

python examples/reliability.py
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

from celery import Celery

import celery_ratchet

app = Celery("reliability", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_url = "sqlite:///ratchet-reliability.db"
app.conf.ratchet_resources = {"ledger": 1}  # at most one ledger job at a time, cluster-wide
app.conf.ratchet_poll_interval = 0.2

FIXED = Path("ledger-fixed.flag")


@celery_ratchet.do_not_retry
class BadAccount(ValueError):
    """Retrying cannot fix this: straight to the dead-letter queue."""


@app.task(bind=True, backoff="exponential", backoff_param=0.2, max_retries=3)
def fetch_rate(self, currency: str) -> str:  # type: ignore[no-untyped-def]
    """Fails twice (retried after 0.2 s, then 0.4 s), then succeeds."""
    if self.request.retries < 2:
        raise ConnectionError(f"rates service busy (attempt {self.request.retries + 1})")
    return f"{currency} rate fetched on attempt {self.request.retries + 1}"


@app.task(backoff="none", max_retries=5)
def open_account(name: str) -> str:
    if not FIXED.exists():
        raise BadAccount(f"{name}: no such customer")
    return f"{name} opened"


@app.task(resource="ledger")
def post_to_ledger(entry: int) -> tuple[float, float]:
    start = time.monotonic()
    time.sleep(0.3)
    return start, time.monotonic()


def main() -> None:
    here = Path(__file__).resolve().parent
    FIXED.unlink(missing_ok=True)
    rate = fetch_rate.delay("EUR")
    account = open_account.delay("acme")
    entries = [post_to_ledger.delay(i) for i in range(4)]
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "reliability", "--quiet", "worker",
         "-P", "ratchet", "-c", "4", "-l", "warning"],
        env={**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    try:
        print("retries with backoff:", rate.get(timeout=60))
        try:
            account.get(timeout=60)
        except Exception as exc:  # rebuilt from the store: the class lives in the worker
            print(f"do-not-retry failure, one attempt: {type(exc).__name__}: {exc}")
        dlq = celery_ratchet.dlq(app)
        letter = dlq.show(account.id)
        assert letter is not None
        print(f"in the dead-letter queue: {letter.exception} (args {letter.args})")
        FIXED.touch()
        dlq.retry(account.id)
        print("requeued from the DLQ:", app.AsyncResult(account.id).get(timeout=60))
        spans = sorted(r.get(timeout=60) for r in entries)
        overlapping = any(b[0] < a[1] for a, b in itertools.pairwise(spans))
        print(f"4 ledger jobs on 4 worker processes, 1 permit: overlapping = {overlapping}")
    finally:
        worker.terminate()
        worker.wait(60)
        FIXED.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
