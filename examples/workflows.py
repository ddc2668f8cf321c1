"""Chains, chords, a batch with progress, a conditional workflow: SQLite, no broker.

python examples/workflows.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from celery import Celery, chain, chord

import celery_ratchet

app = Celery("workflows", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_url = "sqlite:///ratchet-workflows.db"
app.conf.ratchet_poll_interval = 0.1

PROGRESS = Path("batch-progress.log")
OUTCOME = Path("batch-outcome.log")


@app.task
def fetch(n: int) -> int:
    return n * 10


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
def total(values: list[int]) -> int:
    return sum(values)


@app.task
def import_user(user: str) -> str:
    time.sleep(0.01)
    return user.upper()


@app.task
def report_progress(progress: dict[str, Any]) -> None:
    with PROGRESS.open("a") as f:
        f.write(f"{progress['percent_done']}\n")


@app.task
def import_done(users: list[str]) -> None:
    OUTCOME.write_text(f"imported {len(users)}: {users[0]} .. {users[-1]}")


@app.task
def import_failed(summary: dict[str, Any]) -> None:
    OUTCOME.write_text(f"failed: {summary['failed']} of {summary['total']}")


@app.task
def score(order_id: int) -> float:
    return 0.93


@celery_ratchet.predicate
def is_high(value: float) -> bool:
    """A workflow condition: a function allowed by the decorator, referenced by its path."""
    return value > 0.8


def main() -> None:
    here = Path(__file__).resolve().parent
    for f in (PROGRESS, OUTCOME):
        f.unlink(missing_ok=True)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workflows", "--quiet", "worker",
         "-P", "ratchet", "-c", "4", "-l", "warning"],
        env={**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    try:
        # Every step is stored now; each waits (WAITING) until the one before succeeds.
        print("chain:", chain(fetch.s(1), add.s(5), add.s(100)).apply_async().get(timeout=60))
        # The body is sent once, by the database, when the last child finishes.
        print("chord:", chord(fetch.s(i) for i in range(10))(total.s()).get(timeout=60))

        users = [f"user{i}" for i in range(200)]
        submitted = (
            celery_ratchet.batch("Import users", app=app)
            .for_each(users, import_user.s)
            .on_progress(report_progress.s())
            .on_success(import_done.s())
            .on_failure(import_failed.s())
            .submit()
        )
        submitted.results.get(timeout=120)
        deadline = time.monotonic() + 30
        while not OUTCOME.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        progress = submitted.progress()
        print(f"batch {progress.name!r}: {progress.percent_done}% done, {progress.state.value}")
        print("batch outcome:", OUTCOME.read_text())

        flow = (
            celery_ratchet.workflow(score.s(42), app=app)
            .on_success(add.si(1, 1), name="archived")
            .when_result("workflows:is_high", add.si(2, 2), name="escalated")
            .on_failure(add.si(0, 0), name="alerted")
            .submit()
        )
        print("workflow parent:", flow.parent.get(timeout=60))
        print("escalated branch:", flow.branches["escalated"].get(timeout=60))
    finally:
        worker.terminate()
        worker.wait(60)


if __name__ == "__main__":
    main()
