"""Flower started as ``celery -A app flower`` (no broker, no ``--broker``) on a ratchet app with
a real worker: its HTTP API sees the worker through the store (inspect), lists the tasks it ran
from the events Redis, sets rate and time limits, adds a consumer, sends a task, reads queue
lengths from the store, grows and shrinks the pool, ends a running job as REVOKED with a revoke
with terminate, and stops the worker with its shutdown."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery

from tests.acceptance.conftest import Cluster
from tests.acceptance.flower import (
    PATIENCE,
    FlowerProcess,
    flower_running,
    require_flower,
    start_watched_worker,
)
from tests.helpers import wait_until

pytestmark = pytest.mark.slow


def consumed_queues(flower: FlowerProcess, node: str) -> list[str]:
    """The queues ``node`` consumes, as Flower's inspect sees them; none while a refresh
    missed the worker's reply (waited on, never a KeyError)."""
    worker = flower.json("GET", f"/api/workers?refresh=1&workername={node}").get(node)
    return [queue["name"] for queue in (worker or {}).get("active_queues") or []]


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_flower_api_on_a_ratchet_app(ratchet_app: Celery, cluster: Cluster, tmp_path: Path) -> None:
    require_flower()
    worker, node = start_watched_worker(cluster)
    try:
        with flower_running(ratchet_app, tmp_path) as flower:
            wait_until(
                lambda: node in flower.json("GET", "/api/workers?refresh=1"),
                PATIENCE,
                "Flower to see the worker through inspect",
            )
            seen = flower.json("GET", f"/api/workers?refresh=1&workername={node}")[node]
            assert seen["stats"]["pool"]["max-concurrency"] == 1
            assert "acc.double" in seen["registered"]
            wait_until(
                lambda: consumed_queues(flower, node) == ["celery"],
                PATIENCE,
                "Flower to list the worker's queue",
            )

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

            limits = flower.json(
                "POST", f"/api/task/timeout/acc.double?workername={node}&soft=30&hard=60"
            )
            assert limits == {"message": "time limits set successfully"}
            added = flower.json("POST", f"/api/worker/queue/add-consumer/{node}?queue=reports")
            assert added == {"message": "add consumer reports"}
            wait_until(
                lambda: "reports" in consumed_queues(flower, node),
                PATIENCE,
                "the worker to consume from reports",
            )
            sent = flower.json("POST", "/api/task/async-apply/acc.double", {"args": [5]})
            assert ratchet_app.AsyncResult(sent["task-id"]).get(timeout=PATIENCE) == 10

            running = ratchet_app.tasks["acc.sleep"].delay("flower-api", 600)
            wait_until(
                lambda: flower.task_state(running.id) == "STARTED",
                PATIENCE,
                "Flower to see the long job start",
            )
            # The worker's one process is busy: these wait (claimed ahead, or still pending).
            waiting = [ratchet_app.tasks["acc.double"].delay(n) for n in range(3)]
            lengths = flower.json("GET", "/api/queues/length")["active_queues"]
            (celery,) = [queue for queue in lengths if queue["name"] == "celery"]
            assert celery["name"] == "celery" and celery["messages"] == 4
            assert celery["messages_ready"] + celery["messages_unacknowledged"] == 4
            assert celery["messages_unacknowledged"] >= 1

            answer = flower.json("POST", f"/api/task/revoke/{running.id}?terminate=true")
            assert answer == {"message": f"Revoked '{running.id}'"}
            wait_until(lambda: running.state == "REVOKED", PATIENCE, "the job to be REVOKED")
            assert [job.get(timeout=PATIENCE) for job in waiting] == [0, 2, 4]

            grown = flower.json("POST", f"/api/worker/pool/grow/{node}?n=1")
            assert grown == {"message": f"Growing '{node}' worker's pool by 1"}
            shrunk = flower.json("POST", f"/api/worker/pool/shrink/{node}?n=1")
            assert shrunk == {"message": f"Shrinking '{node}' worker's pool by 1"}
            stopping = flower.json("POST", f"/api/worker/shutdown/{node}")
            assert stopping == {"message": "Shutting down!"}
            assert worker.process.wait(PATIENCE) == 0
    except Exception:
        print(cluster.logs())
        raise
