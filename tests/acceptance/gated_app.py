"""The acceptance app behind a start gate: every process that imports it (worker or client)
says it is ready, then waits until the test opens the gate, so all of them reach the empty
database at the same moment."""

from __future__ import annotations

import os
import time
from pathlib import Path

_gate = os.environ.get("RATCHET_TEST_START_GATE")
if _gate:
    Path(f"{_gate}.ready.{os.getpid()}").touch()
    _deadline = time.monotonic() + 300
    while not Path(_gate).exists() and time.monotonic() < _deadline:
        time.sleep(0.001)

from tests.acceptance.app import app  # noqa: E402


@app.task(name="boot.add")
def add(a: int, b: int) -> int:
    return a + b
