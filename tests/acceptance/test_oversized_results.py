"""A result larger than MariaDB takes in one statement (max_allowed_packet, 16 MB on the
shared server, read, never changed) fails its job at once in a real worker's pool process
(``-P ratchet``), with StatementTooLarge naming the limit: no outage logged, nothing retried,
the jobs beside it run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.conftest import Cluster, _app_on, wait_until
from tests.conftest import Servers

pytestmark = pytest.mark.slow

MB = 1 << 20


@pytest.fixture
def mariadb_app(servers: Servers) -> Iterator[Celery]:
    yield from _app_on(servers.url("mysql"))


def test_an_oversized_result_fails_its_job_at_once_in_a_pool_process(
    mariadb_app: Celery, tmp_path: Path
) -> None:
    store = ratchet_state(mariadb_app).store
    big, value = mariadb_app.tasks["acc.big"], mariadb_app.tasks["acc.value"]
    oversized = [big.delay(20 * MB), big.delay(50 * MB)]
    fits = value.delay(7)
    cluster = Cluster(mariadb_app.conf.ratchet_url, tmp_path)
    cluster.start("w1", pool="ratchet", concurrency=2)
    try:
        wait_until(lambda: store.count_by_status() == {"SUCCEEDED": 1, "FAILED": 2}, 90,
                   "the oversized results to fail their jobs")  # fmt: skip
        assert fits.get(timeout=10) == 7
    except Exception:
        print(cluster.whole_logs()[-8000:])
        raise
    finally:
        cluster.stop_all()
    for result in oversized:
        record = store.result(result.id)
        assert record is not None
        error = json.loads(record.last_error or "{}")
        assert error["exc_type"] == "StatementTooLarge", error
        assert "max_allowed_packet = 16777216" in " ".join(error["exc_message"]), error
        assert record.attempts == 0
    assert "unreachable" not in cluster.whole_logs()
