"""The store reads of the web dashboard, on SQLite, PostgreSQL and MariaDB: keyset pages of
jobs, throughput per minute, a job's chain and batch, a batch's children, resource permits."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

from celery_ratchet.domain.job import JobStatus, JobType, Settlement
from celery_ratchet.store.inspection import Inspection
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job


def test_keyset_pages_walk_every_job_once_newest_first(store: JobStore) -> None:
    store.enqueue_many([new_job(f"j{i:02}") for i in range(7)])
    seen: list[str] = []
    before = None
    while True:
        page = store.list_jobs(limit=3, before_job_id=before)
        if not page:
            break
        seen += [j.job_id for j in page]
        before = page[-1].job_id
    assert seen == [f"j{i:02}" for i in reversed(range(7))]


def test_a_keyset_page_keeps_its_filters(store: JobStore) -> None:
    store.enqueue_many([new_job(f"a{i}", queue="a" if i % 2 else "b") for i in range(6)])
    page = store.list_jobs(queue="a", limit=2, before_job_id="a5")
    assert [j.job_id for j in page] == ["a3", "a1"]


def test_finished_per_minute_counts_ended_jobs_in_the_last_minute_bucket(store: JobStore) -> None:
    store.enqueue_many([new_job(f"f{i}") for i in range(3)] + [new_job("still")])
    claimed = [j for j in store.claim("n", ["celery"], 10) if j.job_id != "still"]
    store.settle(
        [Settlement(claimed[0].job_id, claimed[0].token, JobStatus.FAILED, error="{}")]
        + [Settlement(j.job_id, j.token, JobStatus.SUCCEEDED) for j in claimed[1:]]
    )
    minutes = Inspection(store).finished_per_minute(60)
    assert len(minutes) == 60
    assert minutes[-1] == 3 and sum(minutes) == 3


def test_job_links_name_the_batch_and_the_chain(store: JobStore) -> None:
    step = dataclasses.replace(
        new_job("second"),
        depends_on="first",
        parent_id="first",
        root_id="first",
        job_type=JobType.CHAIN_STEP,
    )
    store.enqueue_many(
        [dataclasses.replace(new_job("first"), group_id="g1", root_id="first")], [step]
    )
    first = Inspection(store).job_links("first")
    second = Inspection(store).job_links("second")
    assert first is not None and second is not None
    assert first["group_id"] == "g1"
    assert first["dependents"] == [("second", JobStatus.WAITING.value)]
    assert second["depends_on"] == "first" and second["root_id"] == "first"
    assert Inspection(store).job_links("nobody") is None


def test_children_by_status_of_a_batch(store: JobStore) -> None:
    store.enqueue_many([dataclasses.replace(new_job(f"c{i}"), group_id="g") for i in range(3)])
    [one] = store.claim("n", ["celery"], 1)
    store.settle([Settlement(one.job_id, one.token, JobStatus.SUCCEEDED)])
    assert Inspection(store).children_by_status("g") == {"PENDING": 2, "SUCCEEDED": 1}
    assert Inspection(store).children_by_status("other") == {}


def test_resources_show_capacity_and_the_running_holders_only(store: JobStore) -> None:
    store.enqueue_many([new_job(f"pay-{i}", resource="payments") for i in range(3)])
    held = store.claim_for_resource("node-a", ["celery"], "payments", 2, 10)
    assert len(held) == 2
    [usage] = Inspection(store).resources()
    assert usage["resource"] == "payments" and usage["capacity"] == 2
    assert sorted(h["job_id"] for h in usage["held"]) == sorted(j.job_id for j in held)
    assert {h["node_id"] for h in usage["held"]} == {"node-a"}
    ended = held[0]
    store.settle([Settlement(ended.job_id, ended.token, JobStatus.SUCCEEDED, resource="payments")])
    [usage] = Inspection(store).resources()
    assert [h["job_id"] for h in usage["held"]] == [held[1].job_id]


def test_the_database_clock_is_an_aware_utc_time(store: JobStore) -> None:
    before = datetime.now(timezone.utc) - timedelta(minutes=5)
    now = Inspection(store).database_now()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    assert now > before
