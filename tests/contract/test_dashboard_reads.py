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


def _ended(store: JobStore, outcomes: dict[str, JobStatus]) -> None:
    claimed = {j.job_id: j for j in store.claim("n", ["celery"], 100)}
    store.settle(
        [Settlement(i, claimed[i].token, status, error="{}") for i, status in outcomes.items()]
    )


def test_search_by_part_of_a_task_name_in_any_case_and_ticks_left_out(store: JobStore) -> None:
    store.enqueue_many(
        [
            new_job("a", task="shop.Charge_card"),
            new_job("b", task="shop.refund"),
            new_job("c", task="shop%charge"),
            new_job("recurring:nightly@2026-01-01T03:00:00+00:00", task="shop.charge_card"),
        ]
    )
    found = store.list_jobs(task_contains="CHARGE", ticks=False)
    assert [j.job_id for j in found] == ["c", "a"]
    assert [j.job_id for j in store.list_jobs(task_contains="%")] == ["c"]  # no wildcard
    assert len(store.list_jobs(task_contains="charge")) == 3  # ticks by default, as before


def test_a_creation_time_range_lists_the_jobs_created_in_it(store: JobStore) -> None:
    store.enqueue_many([new_job(f"t{i}") for i in range(6)])
    stamps = {j.job_id: j.created_at for j in store.list_jobs()}
    now = Inspection(store).database_now()
    assert {j.job_id for j in store.list_jobs(created_since=now - timedelta(minutes=1))} == set(
        stamps
    )
    assert store.list_jobs(created_since=now + timedelta(minutes=1)) == []
    assert store.list_jobs(created_until=now - timedelta(minutes=1)) == []
    middle = sorted(stamps.values())[3]
    newer = store.list_jobs(created_since=middle)
    assert {j.job_id for j in newer} == {i for i, at in stamps.items() if at >= middle}
    older = store.list_jobs(created_until=middle)
    assert {j.job_id for j in older} == {i for i, at in stamps.items() if at < middle}


def test_listed_jobs_carry_when_they_were_claimed(store: JobStore) -> None:
    store.enqueue_many([new_job("x")])
    _ended(store, {"x": JobStatus.SUCCEEDED})
    [x] = store.list_jobs()
    assert isinstance(x.claimed_at, datetime) and isinstance(x.finished_at, datetime)
    assert x.claimed_at <= x.finished_at


def test_task_stats_and_series_count_outcomes_and_time_runs(store: JobStore) -> None:
    store.enqueue_many(
        [new_job(f"ok{i}", task="t.ok") for i in range(3)]
        + [new_job("bad", task="t.ok"), new_job("other", task="t.other")]
    )
    _ended(
        store,
        {
            "ok0": JobStatus.SUCCEEDED,
            "ok1": JobStatus.SUCCEEDED,
            "ok2": JobStatus.SUCCEEDED,
            "bad": JobStatus.FAILED,
            "other": JobStatus.SUCCEEDED,
        },
    )
    stats = {r["task_name"]: r for r in Inspection(store).task_stats(3600)}
    assert set(stats) == {"t.ok", "t.other"}
    ok = stats["t.ok"]
    assert (ok["succeeded"], ok["failed"], ok["revoked"]) == (3, 1, 0)
    assert ok["run_avg"] is not None and 0 <= ok["run_avg"] < 60
    assert ok["wait_max"] is not None and ok["wait_max"] >= 0
    series = Inspection(store).task_series("t.ok", 3600, 60)
    assert len(series["spans"]) == 60
    assert sum(s["succeeded"] for s in series["spans"]) == 3
    assert series["spans"][-1]["failed"] == 1  # the newest span: ended just now
    everything = Inspection(store).task_series(None, 3600, 12)
    assert sum(s["succeeded"] + s["failed"] for s in everything["spans"]) == 5


def test_due_later_jobs_are_counted_per_queue(store: JobStore) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    store.enqueue_many(
        [new_job("now"), new_job("soon", due=later), new_job("q2", queue="q2", due=later)]
    )
    assert Inspection(store).scheduled_later() == {"celery": 1, "q2": 1}
