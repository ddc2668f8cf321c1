"""Resource permits and priority aging in the claim, against every database."""

from __future__ import annotations

import multiprocessing
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.domain.priority import Priority, effective_priority
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.memory import MemoryStore
from tests.helpers import new_job


def ago(minutes: float) -> datetime:
    return datetime.now(timezone.utc) - timedelta(minutes=minutes)


def permits(store: JobStore | MemoryStore, resource: str) -> int:
    if isinstance(store, MemoryStore):
        return sum(1 for p in store.snapshot().permits if p.resource == resource)
    with store.engine.connect() as conn:
        sql = "SELECT count(*) FROM scheduler_resource_permit WHERE resource = :r"
        return int(conn.execute(text(sql), {"r": resource}).scalar_one())


# -- aging ------------------------------------------------------------------------------------


def test_a_long_waiting_low_job_overtakes_fresh_high_ones(store: JobStore) -> None:
    store.enqueue_many([new_job(f"high-{i}", priority=Priority.HIGH) for i in range(3)])
    store.enqueue(new_job("old-low", priority=Priority.LOW, due=ago(50)))  # +3 levels: 8
    claimed = store.claim("n", ["celery"], 2)
    assert claimed[0].job_id == "old-low"


def test_a_low_job_waiting_less_than_it_needs_stays_behind(store: JobStore) -> None:
    store.enqueue(new_job("fresh-high", priority=Priority.HIGH))
    store.enqueue(new_job("low", priority=Priority.LOW, due=ago(20)))  # +1 level: 4 < 6
    assert [j.job_id for j in store.claim("n", ["celery"], 1)] == ["fresh-high"]


def test_equal_effective_priority_goes_by_due_time(store: JobStore) -> None:
    store.enqueue(new_job("normal", priority=Priority.NORMAL))
    store.enqueue(new_job("aged-low", priority=Priority.LOW, due=ago(16)))  # 2 + 2 = 4
    assert [j.job_id for j in store.claim("n", ["celery"], 2)] == ["aged-low", "normal"]


def test_aging_off_keeps_plain_priority_order(db_url: str) -> None:
    store = JobStore(db_url, priority_boost_minutes=0)
    with store.engine.connect() as conn:
        conn.execute(text("DELETE FROM scheduler_job"))
    store.enqueue(new_job("high", priority=Priority.HIGH))
    store.enqueue(new_job("ancient-low", priority=Priority.LOW, due=ago(600)))
    assert [j.job_id for j in store.claim("n", ["celery"], 2)] == ["high", "ancient-low"]


def test_claim_order_matches_the_domain_rule_over_mixed_levels_and_ages(store: JobStore) -> None:
    # Ages sit mid-interval (k*15 + 7 minutes) so clock differences cannot flip a step.
    jobs = [
        new_job(f"j{p}-{k}", priority=p, due=ago(k * 15 + 7))
        for p in range(10)
        for k in (0, 1, 3, 6)
    ]
    store.enqueue_many(jobs)
    now = datetime.now(timezone.utc)

    def key(job_id: str) -> tuple[int, datetime]:
        job = next(j for j in jobs if j.job_id == job_id)
        assert job.due is not None
        return (-effective_priority(job.priority, job.due, now, 15), job.due)

    claimed: list[str] = []
    while batch := store.claim("n", ["celery"], 7):
        claimed += [j.job_id for j in batch]
    assert claimed == sorted(claimed, key=key)
    assert len(claimed) == len(jobs)


# -- resource permits -------------------------------------------------------------------------


def test_plain_claims_never_take_jobs_that_need_a_permit(store: JobStore) -> None:
    store.enqueue_many([new_job(f"pay-{i}", resource="payments") for i in range(3)])
    store.enqueue(new_job("plain"))
    assert [j.job_id for j in store.claim("n", ["celery"], 10)] == ["plain"]


def test_at_most_capacity_jobs_of_a_resource_run_and_ending_one_frees_its_permit(
    store: JobStore,
) -> None:
    store.enqueue_many([new_job(f"pay-{i}", resource="payments") for i in range(5)])
    first = store.claim_for_resource("a", ["celery"], "payments", 2, 10)
    assert len(first) == 2 and all(j.resource == "payments" for j in first)
    assert store.claim_for_resource("b", ["celery"], "payments", 2, 10) == []
    assert permits(store, "payments") == 2
    done = first[0]
    store.settle([Settlement(done.job_id, done.token, JobStatus.SUCCEEDED, resource="payments")])
    assert permits(store, "payments") == 1
    assert len(store.claim_for_resource("b", ["celery"], "payments", 2, 10)) == 1


def test_a_retry_and_orphan_recovery_release_permits(store: JobStore) -> None:
    store.enqueue_many([new_job(f"pay-{i}", resource="payments") for i in range(3)])
    store.register_node("dead", "h", 1, ["celery"], 1)
    retried, orphan = store.claim_for_resource("dead", ["celery"], "payments", 2, 2)
    assert store.replace_running(retried.token, new_job(retried.job_id, resource="payments"))
    with store.engine.connect() as conn:
        conn.execute(text("UPDATE scheduler_node SET heartbeat_ts = :t"), {"t": ago(10)})
    assert store.recover_orphans(grace_seconds=60).requeued == [orphan.job_id]
    assert permits(store, "payments") == 0
    assert len(store.claim_for_resource("n", ["celery"], "payments", 2, 10)) == 2


def test_a_permit_whose_job_ended_without_releasing_it_does_not_count(store: JobStore) -> None:
    store.enqueue_many([new_job(f"pay-{i}", resource="payments") for i in range(2)])
    [held] = store.claim_for_resource("a", ["celery"], "payments", 1, 10)
    store.settle([Settlement(held.job_id, held.token, JobStatus.FAILED)])  # no resource given
    assert permits(store, "payments") == 1  # left behind ...
    assert len(store.claim_for_resource("a", ["celery"], "payments", 1, 10)) == 1  # ... ignored
    assert permits(store, "payments") == 1


def _hold_permits(url: str, node: str, rounds: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = JobStore(url)
    worst = 0
    for _ in range(rounds):
        jobs = store.claim_for_resource(node, ["celery"], "payments", 3, 2)
        with store.engine.connect() as conn:
            running = conn.execute(
                text("SELECT count(*) FROM scheduler_job WHERE status = 'RUNNING'")
            ).scalar_one()
        worst = max(worst, int(running))
        time.sleep(0.01)
        store.settle([Settlement(j.job_id, j.token, JobStatus.SUCCEEDED, resource="payments")
                      for j in jobs])  # fmt: skip
    out.put(worst)


@pytest.mark.slow  # separate processes, each starting Python afresh
def test_racing_nodes_never_exceed_the_capacity(server_store: JobStore) -> None:
    processes = 4
    server_store.enqueue_many([new_job(f"pay-{i}", resource="payments") for i in range(120)])
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    workers = [
        ctx.Process(target=_hold_permits, args=(server_store.url, f"n{i}", 40, out))
        for i in range(processes)
    ]
    for w in workers:
        w.start()
    worst = max(out.get(timeout=120) for _ in workers)
    for w in workers:
        w.join(30)
    assert worst <= 3
    assert server_store.count_by_status().get("SUCCEEDED", 0) > 0


def test_rows_with_broker_sized_priorities_are_still_claimed(store: JobStore) -> None:
    store.enqueue(new_job("legacy", priority=4))
    with store.engine.connect() as conn:  # as written before priorities were capped at 9
        conn.execute(text("UPDATE scheduler_job SET priority = 200 WHERE job_id = 'legacy'"))
    store.enqueue(new_job("high", priority=Priority.HIGH))
    assert [j.job_id for j in store.claim("n", ["celery"], 5)] == ["legacy", "high"]
