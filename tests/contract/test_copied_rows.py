"""On PostgreSQL (psycopg 3) a write of many rows is a COPY: it writes the rows the INSERT
writes, byte for byte, wakes the workers the INSERT wakes, and decides a taken id as the
INSERT's path does."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import select

from celery_ratchet.domain.job import JobStatus, Message, NewJob, Settlement
from celery_ratchet.errors import DuplicateJob
from celery_ratchet.store import row_writer
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job
from tests.conftest import Servers, empty_store
from tests.helpers import listening, new_job, wait_until

DUE = datetime(2031, 5, 17, 8, 30, 15, 123456, tzinfo=timezone.utc)
#: What COPY's text format escapes (tab, newline, backslash, its end-of-data line) and what
#: it must not touch.
AWKWARD = 'tab\there\nline two\r\n\\. \\N back\\slash "quoted" \u00e9\u4e2d\U0001f600'
ROWS = 30


@pytest.fixture
def store(servers: Servers) -> Iterator[JobStore]:
    found = empty_store(servers.url("postgresql"))
    yield found
    found.engine.dispose()


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each COPY carried."""
    seen: list[int] = []
    real = row_writer.copy_in_on

    def counting(conn: Any, sql: str, rows: Any) -> None:
        seen.append(len(rows))
        real(conn, sql, rows)

    monkeypatch.setattr(row_writer, "copy_in_on", counting)
    return seen


def _job(job_id: str, i: int) -> NewJob:
    return NewJob(
        job_id=job_id,
        task_name=f"tests.add {AWKWARD[:8]}",
        queue=f"q{i % 3}",
        priority=i % 10,
        message=Message(
            bytes(range(256)) + AWKWARD.encode(),
            "application/json",
            "utf-8",
            '{"h": "' + AWKWARD.replace("\\", "\\\\").replace("\n", "\\n") + '"}',
            AWKWARD,
        ),
        due=DUE + timedelta(seconds=i) if i % 2 else None,
        expires_at=DUE + timedelta(hours=1) if i % 3 else None,
        attempts=i,
        root_id=f"root-{i}",
        parent_id=f"parent-{i}" if i % 4 == 0 else None,
        group_id="group-1",
        resource="permits" if i % 5 == 0 else None,
        tags=("a", AWKWARD) if i % 2 else (),
        schedule_spec=AWKWARD if i % 7 == 0 else None,
    )


def _rows(store: JobStore, prefix: str) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(scheduler_job)
            .where(scheduler_job.c.job_id.like(f"{prefix}%"))
            .order_by(scheduler_job.c.id)
        ).all()
    found = []
    for row in rows:
        values = dict(row._mapping)
        created = values.pop("created_at")
        if values["scheduled_time"] == created:
            values["scheduled_time"] = "created_at"  # due "now": the write's own clock
        values.pop("id")
        values["job_id"] = values["job_id"].removeprefix(prefix)
        values["payload"] = bytes(values["payload"])
        found.append(values)
    return found


def test_a_copied_row_is_the_row_the_insert_writes(
    store: JobStore, copies: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    store.enqueue_many([_job(f"copied-{i}", i) for i in range(ROWS)])
    assert copies == [ROWS], "the write did not take the COPY"
    monkeypatch.setattr(row_writer, "_COPIED_ROWS", 10**9)
    store.enqueue_many([_job(f"inserted-{i}", i) for i in range(ROWS)])
    assert copies == [ROWS]
    copied, inserted = _rows(store, "copied-"), _rows(store, "inserted-")
    assert len(copied) == ROWS
    assert copied == inserted
    assert {r["scheduled_time"] for r in copied[::2]} == {"created_at"}
    assert copied[1]["scheduled_time"] == DUE + timedelta(seconds=1)
    assert copied[0]["payload"] == bytes(range(256)) + AWKWARD.encode()
    assert copied[0]["properties"] == AWKWARD


def test_copied_rows_wake_the_workers_of_each_queue(servers: Servers, copies: list[int]) -> None:
    url = servers.url("postgresql")
    store = JobStore(url, notify=True)
    store.ensure_schema()
    try:
        with listening(store, url) as (heard, _):
            store.enqueue_many(
                [new_job(queue="copied-a") for _ in range(ROWS)] + [new_job(queue="copied-b")]
            )
            wait_until(lambda: {"copied-a", "copied-b"} <= set(heard), 30, "both wake-ups")
        assert copies == [ROWS + 1]
    finally:
        store.engine.dispose()


def test_a_taken_id_in_a_copy_writes_nothing_of_it(store: JobStore, copies: list[int]) -> None:
    store.enqueue(new_job("taken"))
    jobs = [new_job() for _ in range(ROWS)] + [new_job("taken")]
    with pytest.raises(DuplicateJob):
        store.enqueue_many(jobs)
    assert copies == [ROWS + 1]
    assert store.count_by_status() == {"PENDING": 1}


def test_a_finished_id_in_a_copy_is_sent_again_with_the_rest(
    store: JobStore, copies: list[int]
) -> None:
    store.enqueue(new_job("done-before"))
    [claimed] = store.claim("n", ["celery"], 1)
    store.settle([Settlement("done-before", claimed.token, JobStatus.SUCCEEDED)])
    store.enqueue_many([new_job() for _ in range(ROWS)] + [new_job("done-before")])
    assert copies == [ROWS + 1]
    assert store.count_by_status() == {"PENDING": ROWS + 1}


def test_a_session_without_standard_conforming_strings_writes_with_inserts(
    servers: Servers, copies: list[int]
) -> None:
    url = servers.url("postgresql")
    empty_store(url).engine.dispose()
    store = JobStore(f"{url}?options=-c%20standard_conforming_strings%3Doff")
    try:
        store.enqueue_many([_job(f"legacy-{i}", i) for i in range(ROWS)])
        assert copies == []
        assert _rows(store, "legacy-")[0]["payload"] == bytes(range(256)) + AWKWARD.encode()
    finally:
        store.engine.dispose()
