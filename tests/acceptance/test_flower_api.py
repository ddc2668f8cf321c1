"""Flower started as ``celery -A app flower`` (no broker, no ``--broker``) on a ratchet app with
a real worker: its HTTP API sees the worker through the store (inspect), lists the tasks it ran
from the events Redis, sets rate limits, reads queue lengths from the store, and its revoke
with terminate ends a running job as REVOKED."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery

from tests.acceptance.conftest import Cluster
from tests.acceptance.flower import PATIENCE, flower_running, require_flower, start_watched_worker
from tests.helpers import wait_until

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_flower_api_on_a_ratchet_app(ratchet_app: Celery, cluster: Cluster, tmp_path: Path) -> None:
    require_flower()
    _, node = start_watched_worker(cluster)
    try:
        with flower_running(ratchet_app, tmp_path) as flower:
            wait_until(
                lambda: node in flower.json("GET", "/api/workers?refresh=1"),
                PATIENCE,
                "Flower to see the worker through inspect",
            )
            worker = flower.json("GET", f"/api/workers?refresh=1&workername={node}")[node]
            assert worker["stats"]["pool"]["max-concurrency"] == 1
            assert "acc.double" in worker["registered"]
            assert [q["name"] for q in worker["active_queues"]] == ["celery"]

            flower.wait_for_events_of(node)
            done = ratchet_app.tasks["acc.double"].delay(21)
            assert done.get(timeout=PATIENCE) == 42
            wait_until(
                lambda: flower.task_state(done.id) == "SUCCESS",
                PATIENCE,
                "Flower to list the task from its events",
            )
            listed = flower.json("GET", f"/api/task/info/{done.id}")
            assert listed["name"] == "acc.double" and listed["worker"] == node

            limit = flower.json(
                "POST", f"/api/task/rate-limit/acc.double?workername={node}&ratelimit=10/m"
            )
            assert limit == {"message": "new rate limit set successfully"}

            running = ratchet_app.tasks["acc.sleep"].delay("flower-api", 600)
            wait_until(
                lambda: flower.task_state(running.id) == "STARTED",
                PATIENCE,
                "Flower to see the long job start",
            )
            # The worker's one process is busy: these wait (claimed ahead, or still pending).
            waiting = [ratchet_app.tasks["acc.double"].delay(n) for n in range(3)]
            (celery,) = flower.json("GET", "/api/queues/length")["active_queues"]
            assert celery["name"] == "celery" and celery["messages"] == 4
            assert celery["messages_ready"] + celery["messages_unacknowledged"] == 4
            assert celery["messages_unacknowledged"] >= 1

            answer = flower.json("POST", f"/api/task/revoke/{running.id}?terminate=true")
            assert answer == {"message": f"Revoked '{running.id}'"}
            wait_until(lambda: running.state == "REVOKED", PATIENCE, "the job to be REVOKED")
            assert [job.get(timeout=PATIENCE) for job in waiting] == [0, 2, 4]
    except Exception:
        print(cluster.logs())
        raise
