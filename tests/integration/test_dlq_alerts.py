"""Dead-letter alerts through Celery: the alert job is the configured task, sent by name with
the summary as its one argument, routed like any send; an in-process worker runs it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery import Celery

from celery_ratchet.celery.app.install import install
from celery_ratchet.celery.control.alerts import dead_letter_alerts
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus, JobType, Settlement, error_record
from celery_ratchet.errors import ConfigurationError
from celery_ratchet.runtime import liveness
from tests.conftest import Servers, empty_store
from tests.helpers import new_job, wait_until
from tests.integration.conftest import BrokerTrap, make_app, worker_running

ALERT_TASK = "alerts.on_dead_letters"


def _app(url: str, broker_url: str, interval: float) -> tuple[Celery, list[dict[str, Any]]]:
    """An app alerting on dead letters, and the summaries its alert task has run with."""
    app = make_app(
        url,
        broker_url,
        ratchet_dlq_alert_task=ALERT_TASK,
        ratchet_dlq_alert_interval_seconds=interval,
        task_routes={ALERT_TASK: {"queue": "alerts"}},
    )
    install(app)  # as the worker's app is: the consumer asks for the alerts
    seen: list[dict[str, Any]] = []

    @app.task(name=ALERT_TASK, shared=False)
    def on_dead_letters(summary: dict[str, Any]) -> int:
        seen.append(summary)
        return int(summary["count"])

    return app, seen


def _fail(app: Celery, job_id: str) -> None:
    store = ratchet_state(app).store
    store.enqueue(new_job(job_id, task="shop.charge", queue="dead"))
    [claimed] = store.claim("node", ["dead"], 1)
    error = error_record("ValueError", [f"{job_id} declined"], "builtins")
    store.settle([Settlement(job_id, claimed.token, JobStatus.FAILED, error=error)])


def test_the_alert_job_is_the_alert_task_sent_the_summary(
    servers: Servers, broker_trap: BrokerTrap
) -> None:
    app, _ = _app(empty_store(servers.url("sqlite")).url, broker_trap.url, 0.001)
    for i in range(3):
        _fail(app, f"dead-{i}")
    alerts = dead_letter_alerts(app)
    assert alerts is not None
    sent: list[Any] = []
    wait_until(lambda: sent.extend(alerts.send_due()) or sent, 10, "the window to close")

    [alert] = sent
    assert (alert.task_name, alert.queue) == (ALERT_TASK, "alerts")
    assert alert.job_type is JobType.SYSTEM  # the seeds' DLQ_ALERT
    args, kwargs, _ = json.loads(alert.message.payload)
    [summary] = args
    assert kwargs == {}
    assert (summary["task_name"], summary["count"]) == ("shop.charge", 3)
    assert sorted(summary["job_ids"]) == ["dead-0", "dead-1", "dead-2"]
    assert summary["newest_error"].startswith("ValueError: dead-")
    assert alerts.send_due() == []  # the window is closed: nothing left to send
    assert broker_trap.connections == 0


def test_no_alerts_without_the_setting(servers: Servers, broker_trap: BrokerTrap) -> None:
    app = make_app(empty_store(servers.url("sqlite")).url, broker_trap.url)
    assert dead_letter_alerts(app) is None


@pytest.mark.parametrize("dialect", ["sqlite"])
def test_a_worker_sends_and_runs_the_alert(
    servers: Servers, broker_trap: BrokerTrap, dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's housekeeping sends the alerts; it looks every 10 s, here every 0.2 s.
    monkeypatch.setattr(liveness, "HOUSEKEEPING_INTERVAL", 0.2)
    app, seen = _app(empty_store(servers.url(dialect)).url, broker_trap.url, 0.5)
    app.conf.task_routes = {}
    _fail(app, "dead-w")
    with worker_running(app):
        wait_until(lambda: seen, 30, "the worker to run the alert")
    [summary] = seen
    assert (summary["task_name"], summary["count"], summary["job_ids"]) == (
        "shop.charge",
        1,
        ["dead-w"],
    )


def test_an_alert_that_cannot_be_sent_keeps_its_window_and_holds_up_no_other(
    servers: Servers, broker_trap: BrokerTrap
) -> None:
    app, _ = _app(empty_store(servers.url("sqlite")).url, broker_trap.url, 0.001)
    store = ratchet_state(app).store
    _fail(app, "charge-dead")
    store.enqueue(new_job("refund-dead", task="shop.refund", queue="dead"))
    [claimed] = store.claim("node", ["dead"], 1)
    store.settle([Settlement("refund-dead", claimed.token, JobStatus.FAILED, error="{}")])
    alerts = dead_letter_alerts(app)
    assert alerts is not None
    make = alerts.alert_job

    def refusing(job_id: str, summary: dict[str, Any]) -> Any:
        if summary["task_name"] == "shop.charge":
            raise ValueError("refused")
        return make(job_id, summary)

    alerts.alert_job = refusing
    sent: list[Any] = []
    wait_until(lambda: sent.extend(alerts.send_due()) or sent, 10, "the windows to close")
    assert [json.loads(a.message.payload)[0][0]["task_name"] for a in sent] == ["shop.refund"]
    assert store.alert_states(["shop.charge"])["shop.charge"].failed == 1  # still open

    alerts.alert_job = make
    assert [json.loads(a.message.payload)[0][0]["count"] for a in alerts.send_due()] == [1]


def test_alerts_are_refused_for_an_app_ratchet_is_not_installed_on(
    servers: Servers, broker_trap: BrokerTrap
) -> None:
    app = Celery("plain", broker=broker_trap.url)
    app.conf.ratchet_url = empty_store(servers.url("sqlite")).url
    app.conf.ratchet_dlq_alert_task = ALERT_TASK
    with pytest.raises(ConfigurationError, match="install"):
        dead_letter_alerts(app)
    assert broker_trap.connections == 0
