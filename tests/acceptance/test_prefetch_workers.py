"""Celery's prefetch multiplier on real ``-P ratchet`` workers: a worker holds at most
concurrency x multiplier jobs claimed but not started, so the others get the rest."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from celery import Celery, group
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.app import SIDE_EFFECTS
from tests.acceptance.conftest import Cluster, side_effects, wait_until
from tests.acceptance.test_chaos import held_by

pytestmark = pytest.mark.slow


def _workers_that_ran(store: JobStore) -> Counter[int]:
    """Runs per worker (a pool process's parent is its worker's main process)."""
    with store.engine.connect() as conn:
        return Counter(int(p) for (p,) in conn.execute(text(f"SELECT ppid FROM {SIDE_EFFECTS}")))


@pytest.mark.parametrize("flag", [True, False], ids=["flag", "setting"])
def test_multiplier_one_spreads_long_jobs_over_both_workers(
    server_app: Celery, server_cluster: Cluster, tmp_path: Path, flag: bool
) -> None:
    store = ratchet_state(server_app).store
    gated = server_app.tasks["acc.gated"]
    gate = tmp_path / "open"
    how = ("--prefetch-multiplier", "1") if flag else ()
    env = {} if flag else {"RATCHET_ACCEPTANCE_PREFETCH_MULTIPLIER": "1"}
    workers = [server_cluster.start(n, *how, concurrency=2, **env) for n in ("w1", "w2")]
    try:
        wait_until(lambda: len(store.list_nodes()) == 2, 60, "both workers registered")
        result = group(gated.s(f"j{i}", str(gate)) for i in range(8)).apply_async()
        # Each holds two running and two claimed but not started (2 x 1): every job is
        # claimed, four have started, and none can end before the gate opens.
        wait_until(lambda: "PENDING" not in store.count_by_status(), 60, "every job claimed")
        wait_until(lambda: len(side_effects(store)) == 4, 60, "four jobs started")
        held = {w.name: held_by(store, w.pid) for w in workers}
        gate.touch()
        assert result.get(timeout=120) == [f"j{i}" for i in range(8)]
    except Exception:
        print(server_cluster.logs())
        raise
    ran = _workers_that_ran(store)
    print(f"\n[-c 2, multiplier 1] held while gated {held}, ran {dict(ran)}")
    assert held == {"w1": 4, "w2": 4}
    assert ran == {w.pid: 4 for w in workers}


def test_late_acknowledgement_and_multiplier_one_hold_one_job_per_process(
    server_app: Celery, server_cluster: Cluster, tmp_path: Path
) -> None:
    """Celery's advice for long tasks (task_acks_late, a multiplier of 1): a worker holds
    the jobs its processes run and no more, so a worker started later gets the rest."""
    store = ratchet_state(server_app).store
    gated = server_app.tasks["acc.gated"]
    gate = tmp_path / "open"
    late = {"RATCHET_ACCEPTANCE_ACKS_LATE": "1"}
    first = server_cluster.start("w1", "--prefetch-multiplier", "1", concurrency=2, **late)
    try:
        wait_until(lambda: len(store.list_nodes()) == 1, 60, "the first worker registered")
        result = group(gated.s(f"j{i}", str(gate)) for i in range(4)).apply_async()
        wait_until(lambda: len(side_effects(store)) == 2, 60, "two jobs started")
        second = server_cluster.start("w2", "--prefetch-multiplier", "1", concurrency=2, **late)
        wait_until(lambda: len(side_effects(store)) == 4, 60, "the second worker's two jobs")
        held = {w.name: held_by(store, w.pid) for w in (first, second)}
        gate.touch()
        assert result.get(timeout=120) == [f"j{i}" for i in range(4)]
    except Exception:
        print(server_cluster.logs())
        raise
    assert held == {"w1": 2, "w2": 2}
