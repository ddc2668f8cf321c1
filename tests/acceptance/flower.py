"""A real ``celery -A tests.acceptance.app flower`` process (no ``--broker``) on a free port,
beside a real worker started with ``-E``; both send and read events over the events Redis."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tests.acceptance.conftest import ROOT, Cluster, Worker
from tests.conftest import IN_CI
from tests.helpers import wait_until
from tests.integration.test_wakeups import REDIS, _redis_reachable

#: Seconds to wait for Flower, a worker or a job; generous: the machine is shared.
PATIENCE = 90


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class FlowerProcess:
    def __init__(self, app: Celery, log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        environment = {
            **os.environ,
            "RATCHET_URL": app.conf.ratchet_url,
            "RATCHET_EVENTS_URL": REDIS,
            "PYTHONPATH": str(ROOT),
            "FLOWER_UNAUTHENTICATED_API": "true",
        }
        command = [sys.executable, "-m", "celery", "-A", "tests.acceptance.app", "flower",
                   f"--port={self.port}", "--address=127.0.0.1"]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self.healthy, PATIENCE, "Flower to answer /healthcheck")

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"Flower exited:\n{self.log.read_text()[-4000:]}")
        try:
            return self.request("GET", "/healthcheck")[0] == 200
        except OSError:
            return False

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else b"" if method == "POST" else None
        call = urllib.request.Request(self.base + path, data=data, method=method)
        try:
            with urllib.request.urlopen(call, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode()

    def json(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.request(method, path, body)
        assert status == 200, f"{method} {path}: {status} {answer}"
        return json.loads(answer)

    def wait_for_events_of(self, node: str) -> None:
        """Until Flower reads the worker's events (its heartbeats): the tasks sent after this
        show with every event of theirs."""
        wait_until(
            lambda: self.json("GET", "/api/workers?status=true").get(node) is True,
            PATIENCE,
            f"Flower to read {node}'s events",
        )

    def task_state(self, task_id: str) -> str | None:
        """The task's state as Flower's task list has it (from the events it read)."""
        state: str | None = self.json("GET", "/api/tasks").get(task_id, {}).get("state")
        return state

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def start_watched_worker(cluster: Cluster) -> tuple[Worker, str]:
    """One worker of one process with events (``-E``) on the events Redis; returns it and its
    node name. One process: while it runs a long job, the jobs sent after it wait."""
    _redis_reachable()
    worker = cluster.start("fw1", "-E", concurrency=1, RATCHET_EVENTS_URL=REDIS)
    return worker, f"fw1@{socket.gethostname()}"


@contextlib.contextmanager
def flower_running(app: Celery, tmp: Path) -> Iterator[FlowerProcess]:
    flower = FlowerProcess(app, tmp / "flower.log")
    try:
        yield flower
    except Exception:
        print(f"--- flower\n{flower.log.read_text()[-6000:]}")
        raise
    finally:
        flower.stop()


def require_flower() -> None:
    """Flower is in the test extra: missing, the test skips, and fails under CI=true."""
    if IN_CI:
        import flower  # noqa: F401
    else:
        pytest.importorskip("flower", reason="Flower is in the test extra")
