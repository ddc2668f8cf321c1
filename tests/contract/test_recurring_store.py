"""Recurring masters in the store: one per business key, each fire time fired once."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from celery_ratchet.domain.job import SCHEDULES_QUEUE, JobStatus, JobType
from celery_ratchet.domain.schedule import MasterSpec, plan
from celery_ratchet.runtime import recurring
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.memory import MemoryStore
from tests.helpers import new_job

NOW = datetime(2026, 6, 1, 12, 0, 30, tzinfo=timezone.utc)
SPEC = MasterSpec("cron:0 * * * * ?", "UTC")


def _register(url: str | JobStore | MemoryStore, key: str, spec_json: str) -> str:
    """Registers as a node starting would: on a store of its own (a URL), or on ``url``."""
    store = JobStore(url) if isinstance(url, str) else url
    template = new_job("template", task="tests.tick")
    return recurring.register(
        store,
        key,
        MasterSpec.from_json(spec_json),
        task_name="tests.tick",
        priority=4,
        message=template.message,
        now=NOW,
    )


@pytest.mark.slow  # separate processes, each starting Python afresh
def test_many_nodes_registering_one_key_make_one_master(store: JobStore, db_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        outcomes = pool.starmap(_register, [(db_url, "nightly", SPEC.to_json())] * 8)
    assert outcomes.count("created") == 1
    [master] = store.list_masters()
    assert (master["business_key"], master["status"]) == ("nightly", "PENDING")
    assert master["scheduled_time"] == datetime(2026, 6, 1, 12, 1, tzinfo=timezone.utc)


def test_registering_again_updates_in_place(
    store: JobStore, open_store: Callable[..., JobStore]
) -> None:
    _register(open_store(), "report", SPEC.to_json())
    every_hour = MasterSpec("cron:0 0 * * * ?", "Europe/London", misfire="SKIP")
    assert _register(open_store(), "report", every_hour.to_json()) == "updated"
    [master] = store.list_masters()
    assert MasterSpec.from_json(master["schedule_spec"]) == every_hour
    # 12:00:30 UTC is 13:00:30 in London (BST): the next hour is 14:00 BST, 13:00 UTC.
    assert master["scheduled_time"] == datetime(2026, 6, 1, 13, 0, tzinfo=timezone.utc)


def test_pause_resume_and_cancel(store: JobStore, open_store: Callable[..., JobStore]) -> None:
    _register(open_store(), "k", SPEC.to_json())
    recurring.pause(store, "k")
    assert store.claim("n", [SCHEDULES_QUEUE], 5) == []
    assert [m["status"] for m in store.list_masters()] == ["PAUSED"]
    # Paused still counts as active: registering again does not add a second master.
    assert _register(open_store(), "k", SPEC.to_json()) == "updated"
    recurring.resume(store, "k", now=NOW + timedelta(hours=1))
    [master] = store.list_masters()
    assert (master["status"], master["scheduled_time"]) == (
        "PENDING",
        NOW + timedelta(hours=1, seconds=30),
    )
    recurring.cancel(store, "k")
    assert store.list_masters() == []
    assert _register(open_store(), "k", SPEC.to_json()) == "revived"


def test_a_fire_time_creates_its_occurrence_once(
    store: JobStore, open_store: Callable[..., JobStore]
) -> None:
    past = MasterSpec("every:1")
    _register(open_store(), "tick", past.to_json())
    store.enqueue(new_job("unrelated"))
    _make_masters_due(store)
    [master] = [j for j in store.claim("n", [SCHEDULES_QUEUE], 5)]
    assert master.job_type is JobType.RECURRING
    fire = master.scheduled_time
    occurrence = new_job(recurring.occurrence_id(master.job_id, fire), task="tests.tick")
    assert store.fire_master(master, [occurrence], fire + timedelta(seconds=1))
    # The same fire time again (a node that crashed after firing, recovered): nothing new.
    store.settle([])
    [again] = _claim_due_master(store)
    assert store.fire_master(again, [occurrence], fire + timedelta(seconds=2))
    ids = [j.job_id for j in store.list_jobs(limit=10)]
    assert ids.count(occurrence.job_id) == 1
    # A claim that was lost writes nothing at all.
    assert not store.fire_master(master, [new_job("never")], fire + timedelta(seconds=3))
    assert store.result("never") is None


def _make_masters_due(store: JobStore | MemoryStore) -> None:
    """Every recurring master due now."""
    if isinstance(store, MemoryStore):
        store.forge(
            lambda rows: (
                [
                    setattr(r, "scheduled_time", r.created_at)
                    for r in rows.jobs.values()
                    if r.job_type == "RECURRING"
                ]
                and None
            )
        )
        return
    with store.engine.connect() as conn:
        conn.exec_driver_sql(
            "UPDATE scheduler_job SET scheduled_time = created_at WHERE job_type = 'RECURRING'"
        )


def _claim_due_master(store: JobStore) -> list:  # type: ignore[type-arg]
    _make_masters_due(store)
    return store.claim("n", [SCHEDULES_QUEUE], 5)


def test_an_exhausted_master_finishes(store: JobStore, open_store: Callable[..., JobStore]) -> None:
    _register(open_store(), "once", MasterSpec("cron:0 0 0 1 1 ? 2027").to_json())
    [master] = _claim_due_master(store)
    assert store.fire_master(master, [], None)
    assert store.list_masters() == []
    record = store.result(master.job_id)
    assert record is not None and record.status is JobStatus.SUCCEEDED


def test_masters_fired_together_each_fire_once(
    store: JobStore, open_store: Callable[..., JobStore]
) -> None:
    for key in ("a", "b", "c", "d"):
        _register(open_store(), key, MasterSpec("every:1").to_json())
    masters = sorted(_claim_due_master(store), key=lambda m: m.job_id)
    assert len(masters) == 4
    firings = []
    for m in masters:
        fire = m.scheduled_time
        occurrence = new_job(recurring.occurrence_id(m.job_id, fire), task="tests.tick")
        # The last master's schedule is over: it finishes instead of coming due again.
        next_due = None if m is masters[-1] else fire + timedelta(seconds=1)
        firings.append((m, [occurrence], next_due))
    assert store.fire_masters(firings) == [True] * 4
    # Fired again for the same times (a node that crashed after firing): nothing twice.
    again = sorted(_claim_due_master(store), key=lambda m: m.job_id)
    assert len(again) == 3
    refire = [(m, firings[i][1], m.scheduled_time + timedelta(hours=1))
              for i, m in enumerate(again)]  # fmt: skip
    assert store.fire_masters(refire) == [True] * 3
    ids = [j.job_id for j in store.list_jobs(limit=20)]
    for _, [occurrence], _ in firings:
        assert ids.count(occurrence.job_id) == 1
    statuses = {m["job_id"]: m["status"] for m in store.list_masters(include_cancelled=True)}
    assert statuses[masters[-1].job_id] == "SUCCEEDED"
    assert {statuses[m.job_id] for m in again} == {"PENDING"}


def test_a_lost_claim_among_masters_fired_together_stops_only_its_own(
    store: JobStore, open_store: Callable[..., JobStore]
) -> None:
    for key in ("kept", "lost"):
        _register(open_store(), key, MasterSpec("every:1").to_json())
    kept, lost = sorted(_claim_due_master(store), key=lambda m: m.job_id)
    assert (kept.job_id, lost.job_id) == ("recurring:kept", "recurring:lost")
    with store.engine.connect() as conn:  # another node took the second one over
        conn.exec_driver_sql(
            "UPDATE scheduler_job SET claim_token = 'other' WHERE job_id = 'recurring:lost'"
        )
    firings = [
        (m, [new_job(f"occurrence-of-{m.job_id}", task="tests.tick")],
         m.scheduled_time + timedelta(seconds=1))
        for m in (kept, lost)
    ]  # fmt: skip
    assert store.fire_masters(firings) == [True, False]
    assert store.result("occurrence-of-recurring:kept") is not None
    assert store.result("occurrence-of-recurring:lost") is None


def test_run_now_makes_a_waiting_master_due_once_and_keeps_its_next_fire_time(
    store: JobStore,
) -> None:
    template = new_job("template", task="tests.tick")
    daily = MasterSpec("cron:0 0 3 * * ?", "UTC")
    recurring.register(store, "daily", daily, task_name="tests.tick", priority=4,
                       message=template.message)  # fmt: skip
    [before] = store.list_masters()
    assert store.claim("n", [SCHEDULES_QUEUE], 5) == []  # its fire time is hours away
    recurring.run_now(store, "daily")
    [master] = store.claim("n", [SCHEDULES_QUEUE], 5)
    decided = plan(daily.timetable, master.scheduled_time, master.scheduled_time, daily.policy)
    assert decided.fire == (master.scheduled_time,)
    assert decided.next_due == before["scheduled_time"]
    assert master.scheduled_time < before["scheduled_time"]
    with pytest.raises(ValueError, match="RUNNING"):  # claimed: firing already
        recurring.run_now(store, "daily")


def test_run_now_refuses_a_paused_schedule_and_names_an_unknown_one(store: JobStore) -> None:
    template = new_job("template", task="tests.tick")
    recurring.register(store, "k", SPEC, task_name="tests.tick", priority=4,
                       message=template.message)  # fmt: skip
    recurring.pause(store, "k")
    with pytest.raises(ValueError, match="PAUSED"):
        recurring.run_now(store, "k")
    with pytest.raises(LookupError, match="nobody"):
        recurring.run_now(store, "nobody")
