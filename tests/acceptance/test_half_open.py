"""Connections left half-open: workers reach the database through a proxy that stops relaying
on every connection open at one moment (both ends stay open and neither learns anything),
while new connections pass, as when a NAT or a firewall forgets its connections. Each
statement sent on such a connection waits for a reply that never comes: the workers must drop
those connections, say so, and go on with new ones, on PostgreSQL and MariaDB.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery, group

from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.conftest import Cluster, assert_each_ran_once, noted_runs
from tests.helpers import wait_until
from tests.proxy import LossyProxy

pytestmark = pytest.mark.slow

#: No statement deadline set: the one derived from these (the grace period; a heartbeat half
#: the margin between the interval and the grace) is what is tested.
SETTINGS = {
    "RATCHET_NODE_HEARTBEAT_INTERVAL_SECONDS": "1",
    "RATCHET_NODE_ORPHAN_GRACE_SECONDS": "5",
    "RATCHET_ORPHAN_SCAN_INTERVAL_SECONDS": "1",
}
DROPPED = "got no reply from the job store"


@pytest.fixture
def proxied(server_app: Celery, tmp_path: Path) -> Iterator[tuple[LossyProxy, Cluster]]:
    proxy, url = LossyProxy.in_front_of(server_app.conf.ratchet_url)
    cluster = Cluster(url, tmp_path)
    try:
        yield proxy, cluster
    finally:
        cluster.stop_all()
        proxy.close()


def test_workers_whose_connections_went_half_open_drop_them_and_run_every_job_once(
    server_app: Celery, proxied: tuple[LossyProxy, Cluster], tmp_path: Path
) -> None:
    proxy, cluster = proxied
    store = ratchet_state(server_app).store
    noted = server_app.tasks["acc.noted_sleep"]
    run_log = tmp_path / "runs.log"
    workers = [
        cluster.start(name, concurrency=2, RATCHET_ACCEPTANCE_RUN_LOG=str(run_log), **SETTINGS)
        for name in ("w1", "w2")
    ]
    keys = [f"j{i}" for i in range(8)]
    try:
        wait_until(lambda: len(store.list_nodes()) == 2, 60, "both workers registered")
        # Each has heartbeaten since: its pool holds connections made through the proxy.
        first = store.node_heartbeats()
        wait_until(
            lambda: all(beat != first.get(node) for node, beat in store.node_heartbeats().items()),
            30,
            "a heartbeat of each worker",
        )
        assert proxy.freeze_open() > 0
        # Sent straight to the database: only the workers' connections are half-open.
        group(noted.s(key, 0.5) for key in keys).apply_async()
        wait_until(lambda: store.count_by_status() == {"SUCCEEDED": 8}, 90, "every job to end")
    except Exception:
        print(cluster.logs())
        print(store.count_by_status())
        raise

    runs = noted_runs(run_log)
    print(f"\n[half-open] runs: {dict(runs)}")
    assert_each_ran_once(runs, keys)
    logs = cluster.whole_logs()
    assert DROPPED in logs, logs[-6000:]
    assert all(DROPPED in w.log.read_text() for w in workers), logs[-6000:]
