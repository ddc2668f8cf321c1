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

from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.conftest import ROOT, Cluster, wait_until

pytestmark = pytest.mark.slow

#: ``celery`` exits with this (EX_UNAVAILABLE) when no node replied.
NO_NODE_REPLIED = 69


def celery(app: Celery, *args: str, expect_reply: bool = True) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.acceptance.app *args``. A loaded machine can miss Celery's one-second
    reply window: a question (``inspect``, ``status``) is asked again when no node replied,
    and a command, which must not be sent twice, waits longer for its reply."""
    environment = {**os.environ, "RATCHET_URL": app.conf.ratchet_url, "PYTHONPATH": str(ROOT)}
    if args[:1] == ("control",):
        args = ("control", "--timeout", "5", *args[1:])
    tries = 3 if expect_reply and args[:1] in {("inspect",), ("status",)} else 1
    for _ in range(tries):
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.acceptance.app", *args],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != NO_NODE_REPLIED:
            break
    return done


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

        running = ratchet_app.tasks["acc.sleep"].delay("cli-active", 600)
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

        elsewhere = celery(
            ratchet_app, "inspect", "ping", "-d", "nobody@nowhere", expect_reply=False
        )
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


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_purge_deletes_pending_jobs_and_says_how_many(ratchet_app: Celery) -> None:
    double = ratchet_app.tasks["acc.double"]
    jobs = [double.delay(n) for n in range(3)]
    purge = celery(ratchet_app, "purge", "-f")
    assert purge.returncode == 0, purge.stderr
    assert "Purged 3 messages from 1 known task queue." in purge.stdout
    store = ratchet_state(ratchet_app).store
    assert all(store.result(job.id) is None for job in jobs)
    again = celery(ratchet_app, "purge", "-f")
    assert "No messages purged from 1 queue." in again.stdout


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_call_result_and_the_other_commands(ratchet_app: Celery, cluster: Cluster) -> None:
    cluster.start("w1")
    node = f"w1@{socket.gethostname()}"
    try:
        wait_until(
            lambda: celery(ratchet_app, "inspect", "ping").returncode == 0,
            60,
            "the worker to answer ping",
        )
        call = celery(ratchet_app, "call", "acc.double", "--args", "[21]")
        assert call.returncode == 0, call.stderr
        task_id = call.stdout.strip()
        wait_until(
            lambda: celery(ratchet_app, "result", task_id).stdout.strip() == "42",
            60,
            "celery result to print the job's result",
        )
        for command, expected in [
            (("inspect", "reserved"), "- empty -"),
            (("inspect", "scheduled"), "- empty -"),
            (("inspect", "active_queues"), "'name': 'celery'"),
            (("inspect", "query_task", task_id), "{}"),
            (("inspect", "conf"), '"ratchet_poll_interval": 0.2'),
            (("inspect", "report"), "software -> celery:"),
            (("control", "time_limit", "acc.double", "60", "120"), "time limits set"),
            (("control", "pool_grow", "1"), "pool will grow"),
            (("control", "pool_shrink", "1"), "pool will shrink"),
            (("control", "enable_events"), "task events enabled"),
            (("control", "disable_events"), "task events disabled"),
            (("control", "add_consumer", "extra"), "add consumer extra"),
            (("control", "cancel_consumer", "extra"), "no longer consuming from extra"),
            (("control", "revoke", "not-a-job"), "flagged as revoked"),
            (("inspect", "revoked"), "not-a-job"),
        ]:
            done = celery(ratchet_app, *command)
            assert done.returncode == 0, (command, done.stderr)
            assert replied(node, done.stdout), (command, done.stdout)
            assert expected in done.stdout, (command, done.stdout)
        log = cluster.workers[0].log.read_text()
        grown, shrunk = "runs 5 jobs at once", "runs 4 jobs at once"
        assert grown in log and shrunk in log.split(grown, 1)[1], "claims follow the pool"
    except Exception:
        print(cluster.logs())
        raise
