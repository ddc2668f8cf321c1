"""Streaming batches: children from an iterator, a chunk at a time; chunk processing. SQLite.

python examples/streaming.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from celery import Celery

import celery_ratchet

app = Celery("streaming", task_cls="celery_ratchet:RatchetTask")
app.conf.ratchet_url = "sqlite:///ratchet-streaming.db"
app.conf.ratchet_poll_interval = 0.1

EXPORT = Path("orders-export.csv")
OUTCOMES = Path("stream-outcomes.log")


def note(line: str) -> None:
    with OUTCOMES.open("a") as f:
        f.write(line + "\n")


@app.task
def import_order(line: str) -> int:
    """One child per line."""
    return int(line.split(",")[1])


@app.task
def load_orders(lines: list[str]) -> int:
    """Chunk processing: one child per list of lines (an ETL step writing them at once)."""
    return sum(int(line.split(",")[1]) for line in lines)


@app.task
def imported(summary: dict[str, Any]) -> None:
    note(f"{summary['name']}: {summary['succeeded']} of {summary['total']} children succeeded")


@app.task
def import_failed(summary: dict[str, Any]) -> None:
    note(f"{summary['name']}: FAILED after {summary['written']} children: {summary['error']}")


def lines_of(path: Path) -> Iterator[str]:
    """A file read line by line: never all of it in memory."""
    with path.open() as f:
        for line in f:
            yield line.strip()


def truncated(path: Path, after: int) -> Iterator[str]:
    for n, line in enumerate(lines_of(path)):
        if n == after:
            raise OSError("export truncated")
        yield line


def wait_for_outcomes(count: int) -> list[str]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = OUTCOMES.read_text().splitlines() if OUTCOMES.exists() else []
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise SystemExit("the batches did not finish in time")


def main() -> None:
    here = Path(__file__).resolve().parent
    OUTCOMES.unlink(missing_ok=True)
    EXPORT.write_text("".join(f"order{i},{i % 7}\n" for i in range(2_000)))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "streaming", "--quiet", "worker",
         "-P", "ratchet", "-c", "4", "-l", "warning"],
        env={**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )  # fmt: skip
    try:
        per_line = (
            celery_ratchet.batch("Import orders", app=app)
            .on_success(imported.s())
            .on_failure(import_failed.s())
            .stream(lines_of(EXPORT), import_order.s, chunk_size=500)
        )
        print(f"streamed {per_line.items} lines as {per_line.total} children")
        chunked = (
            celery_ratchet.batch("Load orders", app=app)
            .on_success(imported.s())
            .stream(lines_of(EXPORT), load_orders.s, chunk_size=1000, chunked=True)
        )
        print(f"streamed {chunked.items} lines as {chunked.total} chunked children")
        try:
            (
                celery_ratchet.batch("Broken export", app=app)
                .on_failure(import_failed.s())
                .stream(truncated(EXPORT, 1_200), import_order.s, chunk_size=500)
            )
        except OSError as exc:
            print(f"the producer's iterator raised: {exc}")
        for line in sorted(wait_for_outcomes(3)):
            print(line)
        print(f"'Import orders' is {per_line.progress().state.value}")
    finally:
        worker.terminate()
        worker.wait(60)


if __name__ == "__main__":
    main()
