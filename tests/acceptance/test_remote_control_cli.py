"""Celery's own ``celery inspect``, ``celery status`` and ``celery control`` commands against a
real ``-P ratchet`` worker on PostgreSQL, with no broker: the output and exit codes of stock
Celery."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from celery import Celery

from tests.acceptance.conftest import ROOT, Cluster, wait_until

pytestmark = pytest.mark.slow

#: ``celery`` exits with this (EX_UNAVAILABLE) when no node replied.
NO_NODE_REPLIED = 69


def celery(app: Celery, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "RATCHET_URL": app.conf.ratchet_url, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.acceptance.app", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def replied(node: str, output: str) -> bool:
    """Whether ``output`` has Celery's reply line ``->  <node>: OK``."""
    return any(
        line.startswith("->") and line.split(None, 1)[1] == f"{node}: OK"
        for line in output.splitlines()
    )


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_inspect_status_and_control_commands_answer_as_stock(
    ratchet_app: Celery, cluster: Cluster
) -> None:
    worker = cluster.start("w1")
    node = f"w1@{socket.gethostname()}"
    try:
        wait_until(
            lambda: celery(ratchet_app, "inspect", "ping").returncode == 0,
            60,
            "the worker to answer ping",
        )
        ping = celery(ratchet_app, "inspect", "ping")
        assert ping.returncode == 0, ping.stderr
        assert replied(node, ping.stdout) and "pong" in ping.stdout
        assert "1 node online." in ping.stdout

        status = celery(ratchet_app, "status")
        assert status.returncode == 0, status.stderr
        assert replied(node, status.stdout) and "1 node online." in status.stdout

        running = ratchet_app.tasks["acc.sleep"].delay("cli-active", 30)
        wait_until(
            lambda: running.id in celery(ratchet_app, "inspect", "active").stdout,
            60,
            "the running job to show in inspect active",
        )
        active = celery(ratchet_app, "inspect", "active", "--json")
        assert active.returncode == 0, active.stderr
        assert '"name": "acc.sleep"' in active.stdout

        stats = celery(ratchet_app, "inspect", "stats")
        assert stats.returncode == 0, stats.stderr
        assert replied(node, stats.stdout)
        assert '"max-concurrency": 4' in stats.stdout

        registered = celery(ratchet_app, "inspect", "registered")
        assert registered.returncode == 0, registered.stderr
        assert "acc.double" in registered.stdout

        elsewhere = celery(ratchet_app, "inspect", "ping", "-d", "nobody@nowhere")
        assert elsewhere.returncode == NO_NODE_REPLIED
        assert "No nodes replied within time constraint" in elsewhere.stderr

        limit = celery(ratchet_app, "control", "rate_limit", "acc.double", "10/m")
        assert limit.returncode == 0, limit.stderr
        assert replied(node, limit.stdout)
        assert "new rate limit set successfully" in limit.stdout

        terminate = celery(ratchet_app, "control", "terminate", "SIGKILL", running.id)
        assert terminate.returncode == 0, terminate.stderr
        assert f"terminate: {running.id}" in terminate.stdout
        wait_until(lambda: running.state == "REVOKED", 60, "the terminated job to be REVOKED")

        # As in stock Celery the worker stops before it replies.
        shutdown = celery(ratchet_app, "control", "shutdown")
        assert shutdown.returncode == NO_NODE_REPLIED
        assert "No nodes replied within time constraint" in shutdown.stderr
        assert worker.process.wait(60) == 0
    except Exception:
        print(cluster.logs())
        raise
