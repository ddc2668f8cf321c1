"""A task's result larger than MariaDB takes in one statement (max_allowed_packet, 16 MB on
the shared server) fails its job at once, with an error naming the limit and the setting: not
an outage retried until the worker stops, not the driver's error. The jobs beside it run."""

from __future__ import annotations

import pytest

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import StatementTooLarge
from tests.conftest import Servers, empty_store
from tests.helpers import wait_until
from tests.integration.conftest import BrokerTrap, make_app, worker_running

MB = 1 << 20


# Celery reports a result its backend refused as an error outside the task's body (with this
# warning), then fails the task through its failure path.
@pytest.mark.filterwarnings("ignore:Exception raised outside body:RuntimeWarning")
def test_a_result_over_max_allowed_packet_fails_its_job_at_once(
    servers: Servers, broker_trap: BrokerTrap, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(empty_store(servers.url("mysql")).url, broker_trap.url)
    big = app.tasks["t.big"]
    store = ratchet_state(app).store
    with worker_running(app):
        oversized = [big.delay(20 * MB), big.delay(50 * MB)]
        fits = big.delay(1000)
        wait_until(lambda: store.count_by_status() == {"SUCCEEDED": 1, "FAILED": 2}, 60,
                   "the oversized results to fail their jobs")  # fmt: skip
    assert fits.get(timeout=10) == "x" * 1000
    for result in oversized:
        with pytest.raises(StatementTooLarge) as refused:
            result.get(timeout=10)
        assert "max_allowed_packet = 16777216" in str(refused.value)
    outages = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert not outages, outages[:3]
