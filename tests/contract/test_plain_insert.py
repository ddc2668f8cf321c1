"""A plain single-row enqueue goes to the driver itself (store/raw.py), past SQLAlchemy's
execution machinery: it writes the row the multi-row path writes, and fails as it fails."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from celery_ratchet.domain.job import JobStatus, Message, NewJob, Settlement
from celery_ratchet.errors import DuplicateJob, StoreUnavailable
from celery_ratchet.store import enqueue, row_writer
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job
from celery_ratchet.store.units import unit_of
from tests.conftest import Servers
from tests.helpers import BODY, listening, new_job, wait_until

DUE = datetime(2031, 5, 17, 8, 30, 15, 123456, tzinfo=timezone.utc)


@pytest.fixture
def raw_inserts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The job ids inserted through the driver's own cursor."""
    seen: list[str] = []
    real = enqueue.execute_raw

    def counting(engine: Any, connection: Any, statement: Any, values: Any) -> int:
        seen.append(values["p_job_id"])
        return real(engine, connection, statement, values)

    monkeypatch.setattr(enqueue, "execute_raw", counting)
    yield seen


def _job(job_id: str) -> NewJob:
    return NewJob(
        job_id=job_id,
        task_name="tests.add",
        queue="emails",
        priority=7,
        message=Message(
            BODY + b"\x00\xff binary", "application/json", "utf-8", '{"h": 1}', '{"p": 2}'
        ),
        due=DUE,
        expires_at=DUE + timedelta(hours=1),
        attempts=2,
        root_id="root-1",
        group_id="group-1",
        tags=("a", "b"),
        schedule_spec="every 5s",
    )


def _row(store: JobStore, job_id: str) -> dict[str, Any]:
    with store.engine.connect() as conn:
        row = conn.execute(select(scheduler_job).where(scheduler_job.c.job_id == job_id)).one()
    values = dict(row._mapping)
    for generated in ("id", "job_id", "created_at"):
        values.pop(generated)
    return values


def test_the_driver_path_writes_the_row_the_multi_row_path_writes(
    store: JobStore, raw_inserts: list[str]
) -> None:
    store.enqueue(_job("single"))
    assert raw_inserts == ["single"], "the single send did not take the driver path"
    store.enqueue_many([_job("many-1"), _job("many-2")])
    assert raw_inserts == ["single"]
    single = _row(store, "single")
    assert single == _row(store, "many-1")
    assert single["scheduled_time"] == DUE and single["status"] == "PENDING"
    assert bytes(single["payload"]) == BODY + b"\x00\xff binary"


def test_a_taken_id_on_the_driver_path_is_decided_as_before(
    store: JobStore, raw_inserts: list[str]
) -> None:
    store.enqueue(new_job("taken"))
    with pytest.raises(DuplicateJob):
        store.enqueue(new_job("taken"))
    [claimed] = store.claim("n", ["celery"], 1)
    store.settle([Settlement("taken", claimed.token, JobStatus.SUCCEEDED)])
    store.enqueue(new_job("taken"))  # a finished job of that id is sent again
    assert raw_inserts == ["taken"] * 3
    assert store.count_by_status() == {"PENDING": 1}


@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_an_unreachable_store_fails_alike_on_both_paths(kind: str) -> None:
    # Port 9 (discard) on this machine: nothing listens there, the connection is refused.
    store = JobStore(f"{kind}://root@127.0.0.1:9/none", create_schema=False)
    with pytest.raises(StoreUnavailable) as single:
        store.enqueue(new_job("a"))
    with pytest.raises(StoreUnavailable) as many:
        store.enqueue_many([new_job("b"), new_job("c")])
    assert str(single.value) == str(many.value)
    assert "no job was enqueued" in str(single.value)
    assert single.value.outcome_unknown is False
    store.engine.dispose()


def test_the_driver_path_notifies_listening_workers(
    servers: Servers, raw_inserts: list[str]
) -> None:
    url = servers.url("postgresql")
    store = JobStore(url, notify=True)
    store.ensure_schema()
    with listening(store, url) as (heard, _):
        store.enqueue(new_job("wakes", queue="wake-me"))
        wait_until(lambda: "wake-me" in heard, 30, "the insert's notification")
    assert raw_inserts == ["wakes"]
    store.engine.dispose()


def test_jobs_written_on_a_callers_connection_use_statements_of_its_own_driver(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's statements compiled for its own driver run only on its own connections:
    a caller's may be of another driver (psycopg2 beside the store's psycopg), whose
    parameters the store's compiled statement does not fit."""

    def driver_path(*_: Any) -> None:
        raise AssertionError("the store's driver statement ran on a caller's connection")

    monkeypatch.setattr(row_writer, "execute_many_on", driver_path)
    caller = create_engine(store.engine.url)  # another engine: its own dialect
    try:
        with caller.begin() as conn:
            store.enqueue_within(unit_of(conn), [new_job("mine-1"), new_job("mine-2")])
    finally:
        caller.dispose()
    assert {j.job_id for j in store.list_jobs(status=JobStatus.PENDING)} == {"mine-1", "mine-2"}
