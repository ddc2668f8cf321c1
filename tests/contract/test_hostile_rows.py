"""Rows written by hand or by another tool: none may poison a claim, a listing or a result."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import update

from celery_ratchet.domain.job import JobStatus, Message
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job
from tests.helpers import new_job

SECRET = "4111111111111111"


def _forge(store: JobStore, job_id: str, **values: Any) -> None:
    with store.engine.connect() as conn:
        conn.execute(update(scheduler_job).where(scheduler_job.c.job_id == job_id).values(values))


def _secret_job(job_id: str) -> Any:
    job = new_job(job_id)
    body = json.dumps([[SECRET], {}, {}]).encode()
    return replace(job, message=replace(job.message, payload=body))


def test_a_malformed_row_fails_alone_and_the_rest_of_its_batch_runs(store: JobStore) -> None:
    for i in range(8):
        store.enqueue(_secret_job(f"j{i}"))
    _forge(store, "j2", job_type="LEGACY")
    _forge(store, "j4", headers=json.dumps({"id": "someone-else", "task": "tests.add"}))
    _forge(store, "j6", headers="not json at all")
    _forge(store, "j7", task_name="tests.other")

    claimed = store.claim("n", ["celery"], 10)

    assert sorted(j.job_id for j in claimed) == ["j0", "j1", "j3", "j5"]
    assert store.claim("n", ["celery"], 10) == []
    reasons = {}
    for job_id in ("j2", "j4", "j6", "j7"):
        record = store.result(job_id)
        assert record is not None and record.status is JobStatus.FAILED, job_id
        assert record.finished_at is not None
        error = json.loads(record.last_error or "{}")
        assert error["exc_type"] == "MalformedJob"
        reasons[job_id] = " ".join(error["exc_message"])
        assert SECRET not in (record.last_error or "") + (record.error_traceback or "")
    assert "job_type 'LEGACY' is not one of SINGLE" in reasons["j2"]
    assert "'someone-else'" in reasons["j4"] and "'j4'" in reasons["j4"]
    assert "headers column is not a JSON object" in reasons["j6"]
    assert "runs task 'tests.add', not the row's task_name 'tests.other'" in reasons["j7"]
    assert store.count_by_status() == {"RUNNING": 4, "FAILED": 4}


#: Deeper than Python's JSON decoder recurses: decoding raises RecursionError. The
#: properties column holds 64 KB on MariaDB (TEXT): 30,000 levels there.
DEEP = {"headers": 100_000, "properties": 30_000}


@pytest.mark.parametrize("column", ["headers", "properties"])
def test_a_row_whose_json_nests_too_deep_fails_alone(store: JobStore, column: str) -> None:
    for i in range(6):
        store.enqueue(_secret_job(f"j{i}"))
    _forge(store, "j3", **{column: "[" * DEEP[column] + "]" * DEEP[column]})

    claimed = store.claim("n", ["celery"], 10)

    assert sorted(j.job_id for j in claimed) == ["j0", "j1", "j2", "j4", "j5"]
    record = store.result("j3")
    assert record is not None and record.status is JobStatus.FAILED
    error = json.loads(record.last_error or "{}")
    assert error["exc_type"] == "MalformedJob"
    reason = " ".join(error["exc_message"])
    assert f"its {column} column nests deeper than" in reason, reason
    assert store.count_by_status() == {"RUNNING": 5, "FAILED": 1}


def test_a_row_that_fails_to_decode_in_any_way_fails_alone(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever decoding a column raises (here a MemoryError), the row fails alone."""
    for i in range(3):
        store.enqueue(_secret_job(f"j{i}"))
    _forge(store, "j1", properties='{"poison": 1}')
    real_loads = json.loads

    def loads(text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str) and "poison" in text:
            raise MemoryError
        return real_loads(text, *args, **kwargs)

    monkeypatch.setattr("celery_ratchet.store.claim_sql.json.loads", loads)
    claimed = store.claim("n", ["celery"], 10)
    monkeypatch.undo()

    assert sorted(j.job_id for j in claimed) == ["j0", "j2"]
    record = store.result("j1")
    assert record is not None and record.status is JobStatus.FAILED
    reason = " ".join(json.loads(record.last_error or "{}")["exc_message"])
    assert "its properties column cannot be decoded (MemoryError)" in reason, reason


def test_a_malformed_row_needing_a_permit_takes_none(store: JobStore) -> None:
    for i in range(3):
        store.enqueue(new_job(f"r{i}", resource="gpu"))
    _forge(store, "r0", job_type="LEGACY")
    claimed = store.claim_for_resource("n", ["celery"], "gpu", capacity=2, limit=5)
    assert sorted(j.job_id for j in claimed) == ["r1"]
    # r0 failed without its permit: the second permit is free for r2.
    assert [j.job_id for j in store.claim_for_resource("n", ["celery"], "gpu", 2, 5)] == ["r2"]


def test_an_unknown_status_is_listed_and_read_as_unknown(store: JobStore) -> None:
    store.enqueue(new_job("odd"))
    store.enqueue(new_job("fine"))
    _forge(store, "odd", status="BOGUS")
    listed = {j.job_id: j.status for j in store.list_jobs()}
    assert listed == {"odd": "BOGUS", "fine": JobStatus.PENDING}
    record = store.result("odd")
    assert record is not None and record.status == "BOGUS"
    assert not isinstance(record.status, JobStatus)


def test_priorities_are_kept_to_0_9_when_written(store: JobStore) -> None:
    store.enqueue(new_job("low", priority=-3))
    store.enqueue(new_job("high", priority=12))
    assert {j.job_id: j.priority for j in store.list_jobs()} == {"low": 0, "high": 9}


def test_a_forged_negative_priority_is_still_claimed_under_aging(store: JobStore) -> None:
    aging = JobStore(store.url, engine=store.engine, priority_boost_minutes=15)
    aging.enqueue(new_job("neg"))
    aging.enqueue(new_job("big"))
    _forge(aging, "neg", priority=-5)
    _forge(aging, "big", priority=200)
    assert sorted(j.job_id for j in aging.claim("n", ["celery"], 10)) == ["big", "neg"]


def test_a_message_that_names_no_task_id_is_refused(
    store: JobStore,
) -> None:
    job = new_job("hdr")
    store.enqueue(replace(job, message=Message(job.message.payload, "application/json",
                                                "utf-8", json.dumps({"task": "tests.add"}),
                                                "{}")))  # fmt: skip
    assert store.claim("n", ["celery"], 5) == []
    record = store.result("hdr")
    assert record is not None and record.status is JobStatus.FAILED


def test_the_scheduled_listing_leaves_out_a_forged_row_and_lists_the_rest(
    store: JobStore,
) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    store.enqueue_many([new_job("good", due=later), _secret_job("forged")])
    _forge(store, "forged", headers="not json", scheduled_time=later)
    _forge(store, "good", task_name="t\x01\u00e9" * 10)  # odd but storable text

    listed = store.scheduled_jobs(["celery"], limit=10)

    assert [j.job_id for j in listed] == []  # both rows disagree with their messages
    store.enqueue_many([new_job("plain", due=later)])
    assert [j.job_id for j in store.scheduled_jobs(["celery"], limit=10)] == ["plain"]
    assert store.scheduled_jobs([], limit=10) == []
    assert store.scheduled_jobs(["celery"], limit=0) == []


def test_a_due_time_that_is_no_timestamp_fails_its_row_alone(store: JobStore) -> None:
    """SQLite's column holds any value (an integer sorts before any text: always due); the
    other databases' values no datetime holds are in the test below."""
    if store.family != "sqlite":
        pytest.skip("PostgreSQL's and MySQL's columns hold timestamps only")
    for i in range(3):
        store.enqueue(_secret_job(f"t{i}"))
    with store.engine.connect() as conn:
        conn.exec_driver_sql("UPDATE scheduler_job SET scheduled_time = 12345 WHERE job_id = 't1'")

    claimed = store.claim("n", ["celery"], 10)

    assert sorted(j.job_id for j in claimed) == ["t0", "t2"]
    record = store.result("t1")
    assert record is not None and record.status is JobStatus.FAILED
    reason = " ".join(json.loads(record.last_error or "{}")["exc_message"])
    assert "scheduled_time 12345 is not a timestamp" in reason


#: Due times a server holds that no Python datetime can: PostgreSQL's infinities and dates
#: before year 1 (psycopg refuses to load them), MySQL/MariaDB's zero date (their default
#: sql_mode takes it, from the mysql client say; PyMySQL reads it as text).
UNREADABLE_DUE = {
    "postgresql": ["-infinity", "0001-01-01 00:00:00+00 BC"],
    "mysql": ["0000-00-00 00:00:00"],
    "sqlite": ["0000-00-00 00:00:00"],
}


@pytest.mark.parametrize("boost_minutes", [0.0, 15.0], ids=["no-aging", "aging"])
def test_a_due_time_no_datetime_holds_fails_its_row_alone(
    store: JobStore, boost_minutes: float
) -> None:
    claimer = JobStore(store.url, engine=store.engine, priority_boost_minutes=boost_minutes)
    for value in UNREADABLE_DUE[store.family]:
        for i in range(3):
            claimer.enqueue(_secret_job(f"good{i}"))
        claimer.enqueue(_secret_job("bad"))
        with store.engine.connect() as conn:
            conn.exec_driver_sql(
                "UPDATE scheduler_job SET scheduled_time = %s WHERE job_id = 'bad'"
                if store.family != "sqlite"
                else "UPDATE scheduler_job SET scheduled_time = ? WHERE job_id = 'bad'",
                (value,),
            )

        claimed = claimer.claim("n", ["celery"], 10)

        assert sorted(j.job_id for j in claimed) == ["good0", "good1", "good2"], value
        record = claimer.result("bad")
        assert record is not None and record.status is JobStatus.FAILED, value
        reason = " ".join(json.loads(record.last_error or "{}")["exc_message"])
        assert "its scheduled_time" in reason and "is not a timestamp" in reason, reason
        assert {j.job_id: str(j.scheduled_time) for j in claimer.list_jobs()}["bad"] == (
            "unreadable"
        )
        with store.engine.connect() as conn:
            conn.exec_driver_sql("DELETE FROM scheduler_job")


def test_a_listing_shows_a_timestamp_no_datetime_holds_as_unreadable(store: JobStore) -> None:
    """PostgreSQL's ``infinity`` (or a year past 9999) in any timestamp column of one row:
    the listing shows that cell unreadable, not an error for every row."""
    if store.family != "postgresql":
        pytest.skip("only PostgreSQL holds times past year 9999 (see the test above for others)")
    store.enqueue(new_job("odd"))
    store.enqueue(new_job("fine"))
    with store.engine.connect() as conn:
        conn.exec_driver_sql(
            "UPDATE scheduler_job SET created_at = 'infinity', expires_at = '12000-01-01', "
            "scheduled_time = 'infinity' WHERE job_id = 'odd'"
        )
    listed = {j.job_id: j for j in store.list_jobs()}
    assert set(listed) == {"odd", "fine"}
    assert str(listed["odd"].created_at) == "unreadable"
    assert str(listed["odd"].scheduled_time) == "unreadable"
    assert isinstance(listed["fine"].created_at, datetime)
