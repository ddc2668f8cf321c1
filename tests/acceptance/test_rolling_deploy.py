"""A rolling deploy half done: a worker of the release before meets the jobs of a task the
next release added. Until a worker that knows the task runs, it hands them back for a while;
once one does, it hands each job it claims to that worker alone, so that none is won again
by a worker of the release before, and none fails as not registered, while both run."""

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
HANDED = "ratchet: task 'acc.next_release' is unknown to worker old@"


def test_jobs_of_a_task_only_the_newer_worker_knows_all_run_there_while_both_run(
    server_app: Celery, server_cluster: Cluster
) -> None:
    store = ratchet_state(server_app).store
    # A minute's grace rather than ten: a job the old worker kept winning from the new one
    # would fail within the test (as it did before the hand-over), while a minute is ample
    # for the new worker to register and be seen.
    old = server_cluster.start("old", concurrency=2, RATCHET_UNKNOWN_TASK_GRACE_SECONDS="60")
    try:
        wait_until(lambda: len(store.list_nodes()) == 1, 60, "the old worker registered")
        # Sent by name: this process runs the release before too.
        results = [server_app.send_task("acc.next_release", (f"n{i}",)) for i in range(100)]
        wait_until(lambda: REFUSED in old.log.read_text(), 60, "the old worker refusing one")
        new = server_cluster.start("new", RATCHET_ACCEPTANCE_NEXT_RELEASE="1")
        # Both run to the end: the old worker keeps claiming jobs of the task it does not
        # know (those it handed back before the new one came are due again over a minute),
        # and hands each to the new worker, which alone may claim it then.
        assert [r.get(timeout=180) for r in results] == [f"n{i}" for i in range(100)]
        wait_until(lambda: HANDED in old.log.read_text(), 60, "the old worker's hand-over said")
        assert old.process.poll() is None  # still running
    except Exception:
        print(server_cluster.logs())
        raise
    with store.engine.connect() as conn:
        ran = Counter(int(p) for (p,) in conn.execute(text(f"SELECT ppid FROM {SIDE_EFFECTS}")))
        claims = Counter(
            int(c)
            for (c,) in conn.execute(
                text("SELECT claims FROM scheduler_job WHERE task_name = 'acc.next_release'")
            )
        )
    print(f"\n[rolling deploy] runs by worker: old {ran[old.pid]}, new {ran[new.pid]}")
    print(f"[rolling deploy] jobs by claims counted: {dict(sorted(claims.items()))}")
    assert ran == {new.pid: 100}
    assert store.count_by_status() == {"SUCCEEDED": 100}
    # Each job's claims count one: the new worker's. The old worker's hand-overs and its
    # timed hand-backs before the new one came finished, and are not counted (they would
    # count toward ratchet_max_recoveries, which bounds claims that never finished).
    assert claims == {1: 100}, claims
    text_of_old = old.log.read_text()
    assert text_of_old.count("is not registered") == 1, text_of_old[-3000:]
    assert text_of_old.count("is unknown to worker") == 1, text_of_old[-3000:]
