"""A rolling deploy half done: a worker of the release before meets the jobs of a task the
next release added. It hands them back for the workers that know the task, rather than
failing them as not registered."""

from __future__ import annotations

from collections import Counter

import pytest
from celery import Celery
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.app import SIDE_EFFECTS
from tests.acceptance.conftest import Cluster, wait_until

pytestmark = pytest.mark.slow

REFUSED = "ratchet: task 'acc.next_release' is not registered on worker old@"


def test_jobs_of_a_task_only_the_newer_worker_knows_all_run_there(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    old = server_cluster.start("old", concurrency=2)
    try:
        wait_until(lambda: len(store.list_nodes()) == 1, 60, "the old worker registered")
        # Sent by name: this process runs the release before too.
        results = [server_app.send_task("acc.next_release", (f"n{i}",)) for i in range(100)]
        wait_until(lambda: REFUSED in old.log.read_text(), 60, "the old worker refusing one")
        new = server_cluster.start("new", RATCHET_ACCEPTANCE_NEXT_RELEASE="1")
        wait_until(lambda: any(r.ready() for r in results), 120, "the new worker running one")
        # The old worker leaves, as a rolling deploy ends. While both run, a job it handed
        # back is claimed by whichever looks first once due again, and the old one can win
        # that race again and again (5, 10, 20, 40, 60 s later): not what this test holds.
        old.stop()
        assert [r.get(timeout=180) for r in results] == [f"n{i}" for i in range(100)]
    except Exception:
        print(server_cluster.logs())
        raise
    with store.engine.connect() as conn:
        ran = Counter(int(p) for (p,) in conn.execute(text(f"SELECT ppid FROM {SIDE_EFFECTS}")))
    print(f"\n[rolling deploy] runs by worker: old {ran[old.pid]}, new {ran[new.pid]}")
    assert ran == {new.pid: 100}
    assert store.count_by_status() == {"SUCCEEDED": 100}
    assert old.log.read_text().count("is not registered") == 1, old.log.read_text()[-3000:]
