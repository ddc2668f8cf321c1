"""Dead-letter alerts across real worker processes: 100 jobs failing for good on three
workers within one window raise one alert, which counts all 100."""

from __future__ import annotations

import pytest
from celery import Celery
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.conftest import Cluster
from tests.helpers import wait_until

JOBS = 100
WINDOW_SECONDS = 30
ALERTING = {
    "RATCHET_DLQ_ALERT_TASK": "acc.on_dead_letters",
    "RATCHET_DLQ_ALERT_INTERVAL_SECONDS": str(WINDOW_SECONDS),
}


def _rows(app: Celery, sql: str) -> list[tuple[object, ...]]:
    with ratchet_state(app).store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


@pytest.mark.slow
def test_a_hundred_dead_letters_on_three_workers_raise_one_alert(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    for k in range(3):
        server_cluster.start(f"alerting{k}", concurrency=4, **ALERTING)
    wait_until(lambda: len(store.list_nodes()) == 3, 60, "three workers registered")

    boom = server_app.tasks["acc.boom"]
    for i in range(JOBS):
        boom.delay(f"dead letter {i}")

    failed = "SELECT COUNT(*) FROM scheduler_job WHERE task_name = 'acc.boom' AND status = 'FAILED'"
    wait_until(lambda: _rows(server_app, failed)[0][0] == JOBS, 60, "every job failed")
    nodes = _rows(
        server_app,
        "SELECT COUNT(DISTINCT picked_by) FROM scheduler_job WHERE task_name = 'acc.boom'",
    )
    assert nodes[0][0] >= 2, "the failures should have been spread over the workers"

    alerts = "SELECT job_id, status FROM scheduler_job WHERE task_name = 'acc.on_dead_letters'"
    wait_until(
        lambda: [s for _, s in _rows(server_app, alerts)] == ["SUCCEEDED"],
        WINDOW_SECONDS + 60,
        f"the alert job to run\n{server_cluster.logs()}",
    )
    [(alert_id, _)] = _rows(server_app, alerts)
    [(job_type,)] = _rows(
        server_app, f"SELECT job_type FROM scheduler_job WHERE job_id = '{alert_id}'"
    )
    assert job_type == "SYSTEM"  # the seeds' DLQ_ALERT
    summary = server_app.AsyncResult(alert_id).get(timeout=10)
    assert summary["task_name"] == "acc.boom"
    assert summary["count"] == JOBS
    assert len(summary["job_ids"]) == 20 and summary["more_jobs"] == JOBS - 20
    assert "RuntimeError: dead letter" in summary["newest_error"]

    state = store.alert_states(["acc.boom"])["acc.boom"]
    assert (state.opened_at, state.failed, state.last_count) == (None, 0, JOBS)
    # The window is closed: no node has anything left to send for it.
    assert len(_rows(server_app, alerts)) == 1
