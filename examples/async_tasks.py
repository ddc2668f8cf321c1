"""``async def`` tasks on one event loop: 1,000 HTTP-like waits at once in one process, a
coroutine over its time limit cancelled and retried, sends from async code. SQLite, no broker.

python examples/async_tasks.py
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from celery import Celery, group

app = Celery("async_tasks", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_url = "sqlite:///ratchet-async.db"
app.conf.ratchet_poll_interval = 0.2
# Per kind of job, 1000 each by default (the seeds' RATCHET_VIRTUAL_THREAD_LIMIT_*): adjusted.
app.conf.ratchet_async_limit_single = 500
app.conf.ratchet_async_limit_batch_child = 2000

_waiting = _most_waiting = 0


@app.task
async def fetch(page: int) -> int:
    """Stands for an HTTP call: one second of waiting on I/O. Returns how many of these
    waited at once, at most, in this worker process."""
    global _waiting, _most_waiting
    _waiting += 1
    _most_waiting = max(_most_waiting, _waiting)
    try:
        await asyncio.sleep(1)
    finally:
        _waiting -= 1
    return _most_waiting


@app.task(bind=True, time_limit=1, backoff="fixed", backoff_param=0.1, max_retries=2)
async def slow_partner(self, order: str) -> str:  # type: ignore[no-untyped-def]
    """The partner hangs the first time: cancelled at the time limit, retried."""
    if self.request.retries == 0:
        await asyncio.sleep(30)
    return f"{order} confirmed on attempt {self.request.retries + 1}"


@app.task
def total(numbers: list[int]) -> int:
    """A sync task on the async pool: it runs in a thread."""
    return sum(numbers)


@app.task
async def notify_all(customers: list[str]) -> list[str]:
    """Sends from async code without blocking the loop: await task.adelay(...)."""
    sent = [await total.adelay([len(name)]) for name in customers]
    return [result.id for result in sent]


def main() -> None:
    here = Path(__file__).resolve().parent
    pages = group(fetch.s(page) for page in range(1000)).apply_async()
    partner = slow_partner.delay("order-7")
    notified = notify_all.delay(["ada", "grace", "linus"])
    started = time.monotonic()
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "async_tasks", "--quiet", "worker",
         "-P", "ratchet-async", "-c", "4", "-l", "warning"],
        env={**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    try:
        most = max(pages.get(timeout=120))
        took = time.monotonic() - started
        print(f"1000 one-second waits in one process: {took:.1f}s, {most} at once at most")
        print("over its time limit, cancelled, retried:", partner.get(timeout=60))
        children = [app.AsyncResult(job_id) for job_id in notified.get(timeout=60)]
        print("sent from async code:", [child.get(timeout=60) for child in children])
    finally:
        worker.terminate()
        worker.wait(60)


if __name__ == "__main__":
    main()
