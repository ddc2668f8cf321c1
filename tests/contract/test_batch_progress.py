"""A batch's progress reports in the store, on SQLite, PostgreSQL and MariaDB: each whole
percent written once (also when writers race), held until the report before it ended, and
released in order, also past a report that ended without saying so."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from sqlalchemy import text

from celery_ratchet.domain.batch import (
    BatchKind,
    BatchPart,
    BatchState,
    NewBatch,
    progress_report_id,
)
from celery_ratchet.domain.job import JobStatus, NewJob, Settlement
from celery_ratchet.errors import SchemaOutdated
from celery_ratchet.store.batch_rows import BatchRecord
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job

CALLBACK = '{"task": "t.report", "options": {"task_id": "cb"}}'


def report_id(record: BatchRecord, percent: int) -> str:
    return progress_report_id("cb", percent)


def reports(record: BatchRecord, due: Sequence[tuple[int, int]]) -> list[NewJob]:
    return [new_job(report_id(record, percent)) for percent, _ in due]


def open_batch(store: JobStore, batch_id: str, total: int) -> BatchStore:
    batches = BatchStore(store)
    batches.open(NewBatch(batch_id, BatchKind.BATCH, total, name="b", on_progress=CALLBACK))
    return batches


def finish_children(batches: BatchStore, batch_id: str, children: range) -> None:
    for i in children:
        batches.record_part(BatchPart(batch_id, f"{batch_id}-c{i}", i, "SUCCESS", "1"))


def claimable(store: JobStore) -> list[str]:
    return [job.job_id for job in store.claim("n", ["celery"], 100)]


def run(store: JobStore, job_id: str, status: JobStatus = JobStatus.SUCCEEDED) -> None:
    [claimed] = [j for j in store.claim("n", ["celery"], 100) if j.job_id == job_id]
    store.settle([Settlement(job_id, claimed.token, status)])


def test_reports_are_written_once_held_and_released_in_order(store: JobStore) -> None:
    batches = open_batch(store, "p1", 10)
    finish_children(batches, "p1", range(3))
    writes = batches.write_progress("p1", reports, report_id)
    assert [j.job_id for j in writes.written] == [f"cb-progress-{p:03d}" for p in (10, 20, 30)]
    assert writes.released == ["celery"]
    # Only the first is due; the others wait for the one before them to end.
    [first] = store.claim("n", ["celery"], 100)
    assert first.job_id == "cb-progress-010"
    assert batches.write_progress("p1", reports, report_id).written == ()  # nothing new
    store.settle([Settlement(first.job_id, first.token, JobStatus.SUCCEEDED)])
    assert claimable(store) == []  # ended, but said nothing yet
    assert batches.progress_ended("p1", 10, report_id) == ["celery"]
    run(store, "cb-progress-020")
    assert batches.progress_ended("p1", 20, report_id) == ["celery"]
    assert batches.progress_ended("p1", 20, report_id) == []  # said twice: nothing more
    run(store, "cb-progress-030")
    batches.progress_ended("p1", 30, report_id)
    finish_children(batches, "p1", range(3, 10))
    rest = batches.write_progress("p1", reports, report_id).written
    assert [j.job_id for j in rest] == [f"cb-progress-{p:03d}" for p in range(40, 101, 10)]
    record = batches.get("p1")
    assert record is not None and (record.progress_written, record.progress_ended) == (100, 30)


def test_a_report_id_taken_is_left_as_it_is(store: JobStore) -> None:
    batches = open_batch(store, "p2", 2)
    store.enqueue(new_job("cb-progress-050"))  # as if written by an earlier try
    run(store, "cb-progress-050")
    finish_children(batches, "p2", range(1))
    batches.write_progress("p2", reports, report_id)
    record = store.result("cb-progress-050")
    assert record is not None and record.status is JobStatus.SUCCEEDED  # not run again


def test_a_report_that_ended_without_saying_so_is_passed_over(store: JobStore) -> None:
    batches = open_batch(store, "p3", 4)
    finish_children(batches, "p3", range(4))
    batches.write_progress("p3", reports, report_id)
    assert store.request_revoke(["cb-progress-025"], '"revoked"') == (1, 0)
    assert "p3" in batches.progress_behind()
    # The housekeeping's write finds it ended: the next is released.
    assert batches.write_progress("p3", reports, report_id).released == ["celery"]
    assert claimable(store) == ["cb-progress-050"]


def test_writers_racing_on_the_same_percents_write_each_report_once(store: JobStore) -> None:
    batches = open_batch(store, "p4", 100)
    finish_children(batches, "p4", range(100))
    written: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def write() -> None:
        start.wait()
        jobs = BatchStore(store).write_progress("p4", reports, report_id).written
        with lock:
            written.extend(j.job_id for j in jobs)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(written) == [f"cb-progress-{p:03d}" for p in range(1, 101)]


def test_a_finished_batch_without_its_last_reports_is_found(store: JobStore) -> None:
    batches = open_batch(store, "p5", 2)
    finish_children(batches, "p5", range(2))
    assert batches.progress_behind() == []  # still OPEN: its children's ends write them
    with batches.finishing("p5", BatchState.SUCCEEDED) as unit:
        assert unit is not None
    assert batches.progress_behind() == ["p5"]
    batches.write_progress("p5", reports, report_id)
    assert batches.progress_behind() == ["p5"]  # written; the last waits for the first
    run(store, "cb-progress-050")
    batches.progress_ended("p5", 50, report_id)
    run(store, "cb-progress-100")
    batches.progress_ended("p5", 100, report_id)
    assert batches.progress_behind() == []


def test_a_database_without_the_progress_columns_says_how_to_update_it(
    store: JobStore, dialect: str
) -> None:
    with store.engine.begin() as conn:
        for column in ("progress_written", "progress_ended"):
            conn.execute(text(f"ALTER TABLE scheduler_batch DROP COLUMN {column}"))
    older = JobStore(store.url, create_schema=False)
    batches = BatchStore(older)
    batches.open(NewBatch("p6", BatchKind.BATCH, 1, on_progress=CALLBACK))
    with pytest.raises(SchemaOutdated, match=r"(?s)lacks a column.*schema apply"):
        batches.get("p6")
    # A process that may change the schema adds them at its start.
    updated = JobStore(store.url)
    updated.ensure_schema()
    record = BatchStore(updated).get("p6")
    assert record is not None and record.progress_written == 0
