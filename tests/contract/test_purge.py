"""Purging a queue's pending jobs (the dashboard's purge, ``celery purge``): what waited on a
purged job is revoked with it, its chord counts it, and no schedule goes with it."""

from __future__ import annotations

import dataclasses

from celery_ratchet.domain.batch import BatchKind, NewBatch
from celery_ratchet.domain.job import SCHEDULES_QUEUE, JobStatus
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.runtime import recurring
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.jobstore import JobStore
from tests.contract.test_step_handoff import step
from tests.helpers import new_job


def test_a_purge_revokes_what_waited_on_its_jobs_and_leaves_the_schedules(
    store: JobStore,
) -> None:
    elsewhere = dataclasses.replace(step("chain-2", "chain-1"), queue="other")
    store.enqueue_many([new_job("chain-1")], [elsewhere])
    batches = BatchStore(store)
    batches.open(NewBatch("chord-1", BatchKind.CHORD, 2))
    store.enqueue_many(
        [
            dataclasses.replace(new_job("member-1"), group_id="chord-1"),
            dataclasses.replace(new_job("member-2"), group_id="chord-1", queue="other"),
            new_job("plain"),
        ]
    )
    recurring.register(
        store, "nightly", MasterSpec("every:3600"), task_name="tests.add", priority=4,
        message=new_job("template").message,
    )  # fmt: skip

    # Before: 4 deleted (the schedule's master with them), chain-2 WAITING for good, the
    # chord open for good with one of its two members gone.
    assert store.purge_pending(["celery", SCHEDULES_QUEUE]) == 3
    assert [m["business_key"] for m in store.list_masters()] == ["nightly"]
    for gone in ("chain-1", "member-1", "plain"):
        assert store.result(gone) is None, gone
    after = store.result("chain-2")
    assert after is not None and after.status is JobStatus.REVOKED
    assert "purged with its queue" in str(after.last_error)
    chord = batches.get("chord-1")
    assert chord is not None and (chord.done, chord.failed) == (1, 1)
    member = store.result("member-2")
    assert member is not None and member.status is JobStatus.PENDING
