"""celery_ratchet in one file: an ordinary Celery app, a worker, results, no broker.

    python examples/quickstart.py

The two lines that make this a ratchet app are marked. With no ``ratchet_url`` the job store
is the embedded SQLite default, ``./ratchet.db``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from celery import group

from celery_ratchet import Celery  # 1. the app class: ratchet from its creation on

app = Celery("quickstart")
# app.conf.ratchet_url = "postgresql://localhost/shop"  # 2. the store (default SQLite)


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task(bind=True, max_retries=3)
def flaky(self, name: str) -> str:  # type: ignore[no-untyped-def]
    """Fails twice, then succeeds: each retry reschedules the same row."""
    if self.request.retries < 2:
        raise self.retry(countdown=0.5, exc=RuntimeError(f"{name}: not yet"))
    return f"{name} succeeded on attempt {self.request.retries + 1}"


def main() -> None:
    here = Path(__file__).resolve().parent
    print("enqueueing: add(2, 3), a group of 10 adds, a flaky task, add(40, 2) in 2 s")
    single = add.delay(2, 3)
    many = group(add.s(i, i) for i in range(10)).apply_async()
    retried = flaky.delay("report")
    later = add.apply_async((40, 2), countdown=2)

    print("starting: celery -A quickstart worker -P ratchet -c 2")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "quickstart",
            "--quiet",
            "worker",
            "-P",
            "ratchet",
            "-c",
            "2",
            "-l",
            "warning",
        ],
        env={
            **os.environ,
            "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            # The store this script uses, named: this script has said it is the default.
            "RATCHET_URL": os.environ.get("RATCHET_URL", "sqlite:///ratchet.db"),
        },
    )
    started = time.monotonic()
    try:
        print("add(2, 3)       =", single.get(timeout=60))
        print("group of adds   =", many.get(timeout=60))
        print("flaky           =", retried.get(timeout=60))
        print(
            "add(40, 2) later =",
            later.get(timeout=60),
            f"(after {time.monotonic() - started:.1f} s)",
        )
    finally:
        worker.terminate()
        worker.wait(60)
    print("done: results came from the job store in ./ratchet.db; no broker was contacted")


if __name__ == "__main__":
    main()
