"""Install smoke: a `-E` worker sends Celery's task events over ``ratchet_events_url``.

Run with the Python of a venv that has only the installed wheel (and its extras):
``RATCHET_URL=... RATCHET_EVENTS_URL=redis://... python .ci/smoke_events.py``. Exits non-zero
on any failure, with the worker's log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from celery import Celery

import celery_ratchet

app = Celery("smoke_events", task_cls="celery_ratchet:RatchetTask")
app.conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"  # a closed port: never contacted


@app.task(name="smoke.add")
def add(x: int, y: int) -> int:
    return x + y


def main() -> int:
    here = Path(__file__).resolve().parent
    log_path = Path.cwd() / "events-worker.log"
    celery_ratchet.install(app)
    seen: dict[str, set[str]] = {}

    def on_event(event: dict[str, Any]) -> None:
        seen.setdefault(event.get("uuid", ""), set()).add(event["type"])

    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": on_event})
    consumer = threading.Thread(
        target=lambda: [None for _ in receiver.consume(limit=None, timeout=None, wakeup=False)],
        daemon=True,
    )
    consumer.start()
    time.sleep(1)  # the receiver's queue is bound before the worker sends anything

    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "smoke_events", "worker",
             "-P", "ratchet", "-c", "1", "-E", "-l", "info"],  # fmt: skip
            env={**os.environ, "PYTHONPATH": str(here)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        result = add.delay(2, 3)
        value = result.get(timeout=120)
        assert value == 5, f"add(2, 3) = {value!r}"
        wanted = {"task-received", "task-started", "task-succeeded"}
        deadline = time.monotonic() + 60
        while not wanted <= seen.get(result.id, set()):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"events of {result.id}: {seen.get(result.id)}")
            time.sleep(0.1)
        print(f"events worker: add(2, 3) = {value}, events {sorted(seen[result.id])}")
    except BaseException:
        print(log_path.read_text(), file=sys.stderr)
        raise
    finally:
        receiver.should_stop = True
        worker.terminate()
        code = worker.wait(60)
    text = log_path.read_text()
    for bad in ("Traceback", "ERROR", "CRITICAL"):
        if bad in text:
            print(text, file=sys.stderr)
            raise AssertionError(f"the events worker logged {bad}")
    return 0 if code in (0, -15) else code


if __name__ == "__main__":
    sys.exit(main())
