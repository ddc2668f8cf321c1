"""Results of a ``-P ratchet`` (prefork) worker: a pool process's plain success goes back to
the worker's main process with the execution's return, and its settler writes it with its
batch; the pool process itself writes nothing for it."""

from __future__ import annotations

from pathlib import Path

import pytest
from billiard.exceptions import WorkerLostError
from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.conftest import Cluster, wait_until

pytestmark = pytest.mark.slow

TASKS = 40


def test_pool_processes_write_nothing_for_their_successes(
    server_app: Celery, server_cluster: Cluster, tmp_path: Path
) -> None:
    writes = tmp_path / "child-writes"
    value = server_app.tasks["acc.value"]
    store = ratchet_state(server_app).store
    server_cluster.start("w1", concurrency=2, RATCHET_ACCEPTANCE_CHILD_WRITES=str(writes))
    try:
        wait_until(lambda: len(store.list_nodes()) == 1, 60, "the worker registered")
        results = [value.delay(n) for n in range(TASKS)]
        assert [r.get(timeout=120) for r in results] == list(range(TASKS))
    except Exception:
        print(server_cluster.logs())
        raise
    assert store.count_by_status() == {"SUCCEEDED": TASKS}
    noted = writes.read_text().splitlines() if writes.exists() else []
    assert noted == [], f"the pool processes wrote {len(noted)} statements themselves"


def test_a_success_whose_pool_process_dies_before_returning_it_fails_as_lost(
    server_app: Celery, server_cluster: Cluster
) -> None:
    """Its result never reached the main process: Celery's lost-worker path records the
    execution as failed (WorkerLostError), never as a success without its result, and the
    row does not stay RUNNING."""
    lost = server_app.tasks["acc.lost_after_success"]
    value = server_app.tasks["acc.value"]
    store = ratchet_state(server_app).store
    server_cluster.start("w1", concurrency=1)
    try:
        wait_until(lambda: len(store.list_nodes()) == 1, 60, "the worker registered")
        result = lost.delay(7)
        with pytest.raises(WorkerLostError):
            result.get(timeout=120)
        assert value.delay(8).get(timeout=120) == 8  # a new pool process took over
    except Exception:
        print(server_cluster.logs())
        raise
    assert store.count_by_status() == {"FAILED": 1, "SUCCEEDED": 1}
