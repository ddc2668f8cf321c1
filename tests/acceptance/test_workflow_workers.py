"""Chains, groups and chords across real worker processes on PostgreSQL and MariaDB.

The body of a chord runs exactly once: checked by its side effect, with two workers
finishing the last children at the same instant, and with a worker killed mid-chord.
"""

from __future__ import annotations

import collections
import time
import uuid

import pytest
from celery import Celery, chain, chord, group

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.batch import BatchState
from celery_ratchet.domain.job import JobStatus, JobType
from tests.acceptance.conftest import Cluster, side_effects, wait_until
from tests.acceptance.test_chaos import held_by

pytestmark = pytest.mark.slow

FAST_RECOVERY = {
    "RATCHET_NODE_HEARTBEAT_INTERVAL_SECONDS": "1",
    "RATCHET_NODE_ORPHAN_GRACE_SECONDS": "3",
    "RATCHET_ORPHAN_SCAN_INTERVAL_SECONDS": "1",
}


def runs_of(app: Celery, key: str) -> int:
    return sum(1 for run_key, _ in side_effects(ratchet_state(app).store) if run_key == key)


def status(app: Celery, task_id: str) -> JobStatus | None:
    record = ratchet_state(app).store.result(task_id)
    return None if record is None else record.status


def test_chain_and_a_group_of_1000(server_app: Celery, server_cluster: Cluster) -> None:
    value, double = server_app.tasks["acc.value"], server_app.tasks["acc.double"]
    chained = chain(value.si(3), double.s(), double.s(), double.s()).apply_async()
    grouped = group(value.si(i) for i in range(1000)).apply_async()
    server_cluster.start("w1", concurrency=4)
    server_cluster.start("w2", concurrency=4)
    assert chained.get(timeout=120) == 24
    assert grouped.get(timeout=120) == list(range(1000))
    summary = ratchet_state(server_app).batches.summaries(batch_id=grouped.id)[0]
    assert (summary.state, summary.done, summary.total) == (BatchState.SUCCEEDED, 1000, 1000)
    # The seeds' types, stored with each job: each step kept its own when released.
    steps, step = [], chained
    while step is not None:
        steps.append(step.id)
        step = step.parent
    assert _types(server_app, steps) == {JobType.CHAIN_STEP.value}
    assert _types(server_app, [r.id for r in grouped.results]) == {JobType.BATCH_CHILD.value}


def test_a_chord_over_1000_children_runs_its_body_once(
    server_app: Celery, server_cluster: Cluster
) -> None:
    value, body = server_app.tasks["acc.value"], server_app.tasks["acc.chord_body"]
    key = f"chord-{uuid.uuid4().hex[:8]}"
    result = chord(value.si(i) for i in range(1000))(body.s(key))
    server_cluster.start("w1", concurrency=4)
    server_cluster.start("w2", concurrency=4)
    assert result.get(timeout=180) == sum(range(1000))
    _wait_until_settled(server_app)  # a second body would be a row, run by now
    assert runs_of(server_app, key) == 1
    assert _types(server_app, [result.id]) == {JobType.WORKFLOW_JOIN.value}


def test_two_workers_finishing_the_last_children_at_once(
    server_app: Celery, server_cluster: Cluster
) -> None:
    until, body = server_app.tasks["acc.until"], server_app.tasks["acc.chord_body"]
    # Each chord has one child per worker (its own queue); both end at the same instant.
    server_cluster.start("w1", "-Q", "celery,left", concurrency=2)
    server_cluster.start("w2", "-Q", "celery,right", concurrency=2)
    store = ratchet_state(server_app).store
    # Both running before the moments are set: else a worker booting late on a loaded
    # machine runs its children whenever it starts, not at the same instant as the other.
    wait_until(lambda: len(store.list_nodes()) == 2, 60, "both workers registered")
    keys, results = [], []
    for round_ in range(10):
        key = f"pair-{round_}-{uuid.uuid4().hex[:6]}"
        moment = time.time() + 1.0 + round_ * 0.3
        keys.append(key)
        header = [until.si(1, moment).set(queue="left"), until.si(2, moment).set(queue="right")]
        results.append(chord(header)(body.s(key)))
    for result in results:
        assert result.get(timeout=90) == 3
    _wait_until_settled(server_app)
    assert [runs_of(server_app, k) for k in keys] == [1] * 10
    for result in results:
        left, right = (store.result(c.id) for c in result.parent.results)
        assert left is not None and right is not None
        assert left.picked_by != right.picked_by


def _types(app: Celery, job_ids: list[str]) -> set[str]:
    """The execution types stored with these jobs."""
    rows = ratchet_state(app).store.list_jobs(limit=5000)
    return {j.job_type for j in rows if j.job_id in set(job_ids)}


def _wait_until_settled(app: Celery) -> None:
    """No job left to run or running: whatever the workflow would still send has been sent
    and has run."""
    store = ratchet_state(app).store
    wait_until(
        lambda: not {"PENDING", "RUNNING", "WAITING"} & set(store.count_by_status()),
        120,
        "every job to settle",
    )


def _chains(app: Celery, key: str, count: int, steps: int, pause: float) -> list:  # type: ignore[type-arg]
    step = app.tasks["acc.step"]
    return [
        chain(
            step.s(0, f"{key}-{c}", pause), *(step.s(f"{key}-{c}", pause) for _ in range(steps - 1))
        ).apply_async()
        for c in range(count)
    ]


def _step_runs(app: Celery, key: str) -> collections.Counter[str]:
    store = ratchet_state(app).store
    return collections.Counter(k for k, _ in side_effects(store) if k.startswith(f"{key}-"))


def test_chains_across_three_thread_workers_run_each_step_once(
    server_app: Celery, server_cluster: Cluster
) -> None:
    """With ``-P threads`` a step's next one is handed to the worker that ran it, while it
    has room; every step still runs once, whichever worker takes it."""
    key = f"hand-{uuid.uuid4().hex[:6]}"
    results = _chains(server_app, key, count=30, steps=10, pause=0.0)
    for name in ("w1", "w2", "w3"):
        server_cluster.start(name, pool="threads", concurrency=4)
    try:
        assert [r.get(timeout=120) for r in results] == [10] * 30
    except Exception:
        print(server_cluster.logs())
        raise
    runs = _step_runs(server_app, key)
    assert runs == {f"{key}-{c}:{n}": 1 for c in range(30) for n in range(10)}
    assert ratchet_state(server_app).store.count_by_status() == {"SUCCEEDED": 300}


def test_a_warm_stop_of_one_thread_worker_mid_chains_hands_its_steps_on(
    server_app: Celery, server_cluster: Cluster
) -> None:
    """The stopped worker's buffered steps (handed to it by its own steps) go back to the
    queue, and the others run them: each once."""
    key = f"stop-{uuid.uuid4().hex[:6]}"
    results = _chains(server_app, key, count=20, steps=15, pause=0.05)
    first = server_cluster.start("w1", pool="threads", concurrency=4)
    server_cluster.start("w2", pool="threads", concurrency=4)
    try:
        wait_until(lambda: sum(_step_runs(server_app, key).values()) >= 60, 120, "60 steps run")
        assert first.stop(timeout=60) == 0
        assert [r.get(timeout=120) for r in results] == [15] * 20
    except Exception:
        print(server_cluster.logs())
        raise
    runs = _step_runs(server_app, key)
    assert runs == {f"{key}-{c}:{n}": 1 for c in range(20) for n in range(15)}


def test_a_failing_middle_step_cancels_the_rest(
    server_app: Celery, server_cluster: Cluster
) -> None:
    double, boom = server_app.tasks["acc.double"], server_app.tasks["acc.boom"]
    tag = uuid.uuid4().int % 1000 + 5000
    result = chain(
        double.si(tag), boom.si("middle"), double.si(tag + 1), double.si(tag + 2)
    ).apply_async()
    server_cluster.start("w1", concurrency=2)
    with pytest.raises(RuntimeError, match="middle"):
        result.get(timeout=60)
    assert status(server_app, result.id) is JobStatus.REVOKED
    assert status(server_app, result.parent.id) is JobStatus.REVOKED
    assert status(server_app, result.parent.parent.id) is JobStatus.FAILED
    assert runs_of(server_app, f"double-{tag}") == 1
    assert runs_of(server_app, f"double-{tag + 1}") == 0
    assert runs_of(server_app, f"double-{tag + 2}") == 0


def test_a_worker_killed_mid_chord_leaves_the_chord_to_complete_once(
    server_app: Celery, server_cluster: Cluster
) -> None:
    value, body = server_app.tasks["acc.value"], server_app.tasks["acc.chord_body"]
    key = f"crash-{uuid.uuid4().hex[:8]}"
    result = chord(value.si(i, 0.05) for i in range(300))(body.s(key))
    victim = server_cluster.start("victim", concurrency=4, **FAST_RECOVERY)
    server_cluster.start("survivor", concurrency=4, **FAST_RECOVERY)
    store = ratchet_state(server_app).store
    wait_until(
        lambda: store.count_by_status().get("SUCCEEDED", 0) >= 60 and held_by(store, victim.pid),
        120,
        "the chord under way, the victim holding some of its children",
    )
    victim.kill()
    server_cluster.start("replacement", concurrency=4, **FAST_RECOVERY)
    assert result.get(timeout=180) == sum(range(300))
    _wait_until_settled(server_app)
    assert runs_of(server_app, key) == 1
    summary = ratchet_state(server_app).batches.summaries(batch_id=result.parent.id)[0]
    assert (summary.state, summary.done) == (BatchState.SUCCEEDED, 300)


def _progress_reports(app: Celery, key: str) -> list[tuple[float, int]]:
    """(percent, reports of the batch ended when it started) of each report run."""
    found = []
    for run_key, _ in side_effects(ratchet_state(app).store):
        kind, _, rest = run_key.partition("|")
        batch_key, percent, ended = rest.split("|") if kind == "progress" else ("", "0", "0")
        if batch_key == key:
            found.append((float(percent), int(ended)))
    return found


def test_progress_reports_each_whole_percent_once_one_at_a_time_in_order(
    server_app: Celery, server_cluster: Cluster
) -> None:
    """Two workers end batch children at the same instant: every whole percent reached is
    reported once, the reports run one after another in order, the last at 100 %."""
    until, report = server_app.tasks["acc.until"], server_app.tasks["acc.progress_report"]
    store = ratchet_state(server_app).store
    server_cluster.start("w1", concurrency=4)
    server_cluster.start("w2", concurrency=4)
    wait_until(lambda: len(store.list_nodes()) == 2, 60, "both workers registered")
    moment = time.time() + 2.0
    sizes = {"ten": 10, "wide": 150}  # reports at 10, 20, ... 100; at each of 1 ... 100
    submitted = [
        celery_ratchet.batch(key, app=server_app)
        .for_each(range(size), lambda i: until.si(i, moment))
        .on_progress(report.s(key))
        .submit()
        for key, size in sizes.items()
    ]
    for batch in submitted:
        batch.results.get(timeout=120)
    children = [r.id for batch in submitted for r in batch.results.results]
    assert _types(server_app, children) == {JobType.BATCH_CHILD.value}
    expected = {"ten": 10, "wide": 100}
    try:
        wait_until(
            lambda: all(len(_progress_reports(server_app, k)) >= n for k, n in expected.items()),
            180,
            "every progress report",
        )
        _wait_until_settled(server_app)
    except AssertionError:
        print(server_cluster.logs())
        raise
    for key, count in expected.items():
        runs = _progress_reports(server_app, key)
        percents = sorted(percent for percent, _ in runs)
        assert len(runs) == count and len(set(percents)) == count, (key, sorted(runs))
        assert percents[-1] == 100.0
        # Each started once every report before it had ended, and none after it had.
        assert sorted(runs) == [(percent, place) for place, percent in enumerate(percents)]
