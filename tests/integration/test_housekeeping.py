"""Job logs written from tasks, and the archiver as a recurring system job."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner

import celery_ratchet
from celery_ratchet.celery.schedules.housekeeping import ARCHIVE_TASK, ARCHIVER_KEY
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.cli.main import cli
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app, worker_running


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def app(
    request: pytest.FixtureRequest, servers: Servers, broker_trap: BrokerTrap
) -> Iterator[Celery]:
    app = make_app(empty_store(servers.url(request.param)).url, broker_trap.url)

    @app.task(name="h.charge", shared=False, bind=True)
    def charge(self: Any, amount: int) -> int:
        celery_ratchet.job_logger().info("charging %d", amount)
        self.ratchet_log.warning("card expires soon")
        return amount

    with worker_running(app):
        yield app


def test_a_task_writes_its_job_log_and_jobs_show_prints_it(app: Celery) -> None:
    result = app.tasks["h.charge"].delay(42)
    assert result.get(timeout=30) == 42
    store = ratchet_state(app).store
    assert [(lv, m) for _, lv, m in store.job_log(result.id)] == [
        ("INFO", "charging 42"), ("WARNING", "card expires soon"),
    ]  # fmt: skip
    shown = CliRunner().invoke(cli, ["--url", store.url, "jobs", "show", result.id, "--json"])
    assert [line["message"] for line in json.loads(shown.output)["log"]] == [
        "charging 42", "card expires soon",
    ]  # fmt: skip


def test_job_logger_outside_a_task_says_so() -> None:
    with pytest.raises(RuntimeError, match="inside a task"):
        celery_ratchet.job_logger()


def test_the_archiver_is_one_recurring_job_and_runs_as_a_task(app: Celery) -> None:
    store = ratchet_state(app).store
    masters = {m["business_key"]: m for m in store.list_masters()}
    assert ARCHIVER_KEY in masters and "0 0 1 * * ?" in masters[ARCHIVER_KEY]["schedule_spec"]
    result = app.tasks[ARCHIVE_TASK].delay()
    assert result.get(timeout=30) == {"archived": 0, "log_lines_deleted": 0, "batches_deleted": 0}
    out = CliRunner().invoke(cli, ["--url", store.url, "archive", "--older-than", "0"])
    assert out.exit_code == 0, out.output
    assert "archived" in out.output and store.result(result.id) is None  # just archived
