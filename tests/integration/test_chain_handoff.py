"""A chain's next step, sent by a task the worker runs in its own process, is released as
claimed by that worker (no claim of its own, no wake-up awaited); results are as ever."""

from __future__ import annotations

from typing import Any

from celery import Celery, chain
from sqlalchemy import select

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.store.schema import scheduler_job

TIMEOUT = 30


def _rows(app: Celery, job_ids: list[str]) -> dict[str, Any]:
    t = scheduler_job.c
    stmt = select(t.job_id, t.status, t.claims, t.created_at, t.claimed_at, t.picked_by)
    with ratchet_state(app).store.engine.connect() as conn:
        return {r.job_id: r for r in conn.execute(stmt.where(t.job_id.in_(job_ids)))}


def test_the_steps_of_a_chain_are_handed_to_the_worker_that_ran_the_step_before(
    worker_app: Celery,
) -> None:
    add = worker_app.tasks["t.add"]
    result = chain(add.s(1, 1), add.s(1), add.s(1), add.s(1), add.s(1)).delay()
    assert result.get(timeout=TIMEOUT) == 6
    ids = []
    node = result
    while node is not None:
        ids.append(node.id)
        node = node.parent
    rows = _rows(worker_app, ids)
    assert all(r.status == "SUCCEEDED" and r.claims == 1 for r in rows.values())
    later = [rows[i] for i in ids[:-1]]  # every step but the first
    # Released and claimed in one statement: the row was written as claimed.
    assert [r.claimed_at == r.created_at for r in later] == [True] * 4
    assert {r.picked_by for r in rows.values()} == {rows[ids[-1]].picked_by}


def test_a_chain_still_runs_its_steps_in_order_with_their_results(worker_app: Celery) -> None:
    add = worker_app.tasks["t.add"]
    assert chain(add.s(2, 3), add.s(10), add.s(100)).delay().get(timeout=TIMEOUT) == 115
