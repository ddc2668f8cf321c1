"""The examples run as they are documented: ``python examples/<name>.py``, on SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.conftest import ROOT
from tests.conftest import Servers, empty_store

pytestmark = pytest.mark.slow


def run_example(name: str, cwd: Path, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py")],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_quickstart(tmp_path: Path) -> None:
    out = run_example("quickstart", tmp_path)
    assert "add(2, 3)       = 5" in out and "flaky           = report succeeded" in out


def test_reliability(tmp_path: Path) -> None:
    out = run_example("reliability", tmp_path)
    assert "retries with backoff: EUR rate fetched on attempt 3" in out
    assert "in the dead-letter queue: BadAccount: acme: no such customer" in out
    assert "requeued from the DLQ: acme opened" in out
    assert "1 permit: overlapping = False" in out


def test_dlq_alerts(tmp_path: Path) -> None:
    out = run_example("dlq_alerts", tmp_path)
    assert "dead letters: 10, alert: ['due']" in out
    assert "alert: 10 dead letters of dlq_alerts.charge" in out
    assert "newest error: ValueError: order" in out
    assert "after the alert: ['sent']" in out


def test_transactional(tmp_path: Path) -> None:
    out = run_example("transactional", tmp_path)
    assert "job rows for order 2: 0" in out and "order 1: order 1 shipped" in out


def test_business_keys(tmp_path: Path) -> None:
    out = run_example("business_keys", tmp_path)
    assert "acme's three sends share one job: True" in out
    assert "globex has its own: True" in out
    assert "retried webhook delivery got the same job: True" in out
    assert "DuplicateJob names the active job: True" in out
    assert "after it ran, acme's next sync is a new job: True" in out


def test_recurring(tmp_path: Path) -> None:
    out = run_example("recurring", tmp_path)
    fired, distinct = (
        int(n) for n in out.split("ticks fired: ")[1].split(", distinct fire times: ")
    )
    assert fired == distinct > 0, out  # two workers, and still each tick ran once


def test_workflows(tmp_path: Path) -> None:
    out = run_example("workflows", tmp_path)
    assert "chain: 115" in out and "chord: 450" in out
    assert "batch 'Import users': 100.0% done, SUCCEEDED" in out
    assert "batch outcome: imported 200: USER0 .. USER199" in out
    assert "workflow parent: 0.93" in out and "escalated branch: 4" in out


def test_async_tasks(tmp_path: Path) -> None:
    out = run_example("async_tasks", tmp_path)
    most = int(out.split("at once at most")[0].rsplit(", ", 1)[1])
    assert most > 500, out  # the thousand waits overlap on one event loop
    assert "cancelled, retried: order-7 confirmed on attempt 2" in out
    assert "sent from async code: [3, 5, 5]" in out


def test_multinode_on_postgresql(tmp_path: Path, servers: Servers) -> None:
    url = empty_store(servers.url("postgresql")).url
    out = run_example("multinode", tmp_path, RATCHET_URL=url)
    assert "node1 killed with SIGKILL" in out
    assert "jobs: 600 sent, 600 distinct results, lost: 0" in out
    ran, distinct = (int(n) for n in out.split("ticks run: ")[1].split(", distinct fire times: "))
    assert ran == distinct > 0, out


def test_streaming(tmp_path: Path) -> None:
    out = run_example("streaming", tmp_path)
    assert "streamed 2000 lines as 2000 children" in out
    assert "streamed 2000 lines as 2 chunked children" in out
    assert "Import orders: 2000 of 2000 children succeeded" in out
    assert "Load orders: 2 of 2 children succeeded" in out
    assert "Broken export: FAILED after 1000 children" in out
    assert "'Import orders' is SUCCEEDED" in out
