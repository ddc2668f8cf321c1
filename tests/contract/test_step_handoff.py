"""A chain's next step released as claimed by one node, in one statement (store side)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

from sqlalchemy import select

from celery_ratchet.domain.job import JobStatus, JobType, NewJob, Settlement
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job
from tests.helpers import new_job


def step(job_id: str, after: str) -> NewJob:
    return dataclasses.replace(
        new_job(job_id), depends_on=after, parent_id=after, job_type=JobType.CHAIN_STEP
    )


def sent_by(job_id: str, parent: str, **changes: object) -> NewJob:
    """The step as the task before it sends it: its message, from inside that task."""
    return dataclasses.replace(new_job(job_id), parent_id=parent, **changes)  # type: ignore[arg-type]


def _row(store: JobStore, job_id: str) -> object:
    t = scheduler_job.c
    stmt = select(t.status, t.picked_by, t.claim_token, t.claims, t.created_at, t.claimed_at)
    with store.engine.connect() as conn:
        return conn.execute(stmt.where(t.job_id == job_id)).one()


def test_a_waiting_step_is_released_as_claimed_by_the_node(store: JobStore) -> None:
    store.enqueue_many([new_job("h1")], [step("h2", "h1")])
    [head] = store.claim("node-a", ["celery"], 10)
    claimed = store.release_step_to(sent_by("h2", "h1"), "node-a")
    assert claimed is not None
    assert (claimed.job_id, claimed.claims, claimed.queue) == ("h2", 1, "celery")
    row = _row(store, "h2")
    assert row.status == JobStatus.RUNNING.value  # type: ignore[attr-defined]
    assert row.picked_by == "node-a"  # type: ignore[attr-defined]
    assert row.claim_token == claimed.token  # type: ignore[attr-defined]
    assert row.claimed_at is not None  # type: ignore[attr-defined]
    # Nothing else may claim it, and its claim settles as any claim does.
    assert store.claim("node-b", ["celery"], 10) == []
    store.settle([Settlement("h2", claimed.token, JobStatus.SUCCEEDED)])
    record = store.result("h2")
    assert record is not None and record.status is JobStatus.SUCCEEDED
    assert head.job_id == "h1"


def test_no_waiting_row_releases_nothing_and_writes_nothing(store: JobStore) -> None:
    assert store.release_step_to(sent_by("loose", "someone"), "node-a") is None
    assert store.result("loose") is None
    store.enqueue_many([new_job("once-1")], [step("once-2", "once-1")])
    assert store.release_step_to(sent_by("once-2", "once-1"), "node-a") is not None
    # Released already (a second execution of the step before it sends it again).
    assert store.release_step_to(sent_by("once-2", "once-1"), "node-b") is None
    assert _row(store, "once-2").picked_by == "node-a"  # type: ignore[attr-defined]


def test_a_step_that_needs_a_permit_a_due_time_or_a_key_is_left_to_the_usual_release(
    store: JobStore,
) -> None:
    store.enqueue_many([new_job("p1")], [step("p2", "p1")])
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    for changed in ({"resource": "gpu"}, {"due": later}, {"business_key": "k"}):
        assert store.release_step_to(sent_by("p2", "p1", **changed), "node-a") is None
    assert store.result("p2").status is JobStatus.WAITING  # type: ignore[union-attr]


def test_a_step_of_a_paused_queue_is_left_to_the_usual_release_to_wait_there(
    store: JobStore,
) -> None:
    """Read in the hand-over itself: a pause its node has not seen yet holds too."""
    store.enqueue_many([new_job("q1")], [step("q2", "q1")])
    store.pause_queue("celery")
    assert store.release_step_to(sent_by("q2", "q1"), "node-a") is None
    assert store.result("q2").status is JobStatus.WAITING  # type: ignore[union-attr]
    store.resume_queue("celery")
    assert store.release_step_to(sent_by("q2", "q1"), "node-a") is not None
