"""Streaming batches in the job store: chunks counted with their rows, the producer's lease
on the database clock, the end of the stream, and the abandoned-stream swap."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import func, select, text

from celery_ratchet.domain.batch import BatchKind, BatchPart, BatchState, NewBatch
from celery_ratchet.errors import DuplicateJob, StreamAbandoned
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job
from tests.helpers import new_job, wait_until


def children(batch_id: str, start: int, count: int) -> list:  # type: ignore[type-arg]
    return [
        dataclasses.replace(new_job(f"{batch_id}-{i}"), group_id=batch_id)
        for i in range(start, start + count)
    ]


def rows_of(store: JobStore, batch_id: str) -> int:
    with store.engine.connect() as conn:
        stmt = select(func.count()).where(scheduler_job.c.group_id == batch_id)
        return int(conn.execute(stmt).scalar_one())


def open_stream(batches: BatchStore, batch_id: str, lease: float = 60.0) -> None:
    batches.open(NewBatch(batch_id, BatchKind.STREAM, None, name="s"), lease_seconds=lease)


def test_chunks_are_written_with_their_count_and_the_stream_ends_with_its_total(
    store: JobStore,
) -> None:
    batches = BatchStore(store)
    open_stream(batches, "st1")
    batches.write_chunk("st1", children("st1", 0, 3), [], 3, 60.0)
    batches.write_chunk("st1", children("st1", 3, 2), [], 5, 60.0)
    record = batches.get("st1")
    assert record is not None
    assert (record.written, record.total, record.state) == (5, None, BatchState.OPEN)
    assert rows_of(store, "st1") == 5
    # Every child written so far finished: while the stream is open, that is not the end.
    for i in range(5):
        batches.record_part(BatchPart("st1", f"st1-{i}", i, "SUCCESS", "1"))
    assert not batches.get("st1").all_children_ended  # type: ignore[union-attr]
    assert batches.unfinished_complete(older_than_seconds=-60) == []
    ended = batches.end_stream("st1", 5)
    assert (ended.total, ended.written, ended.all_children_ended) == (5, 5, True)
    assert batches.summaries(batch_id="st1")[0].written == 5


def test_a_chunk_with_a_taken_id_is_refused_whole(store: JobStore) -> None:
    batches = BatchStore(store)
    open_stream(batches, "st2")
    batches.write_chunk("st2", children("st2", 0, 2), [], 2, 60.0)
    with pytest.raises(DuplicateJob):
        batches.write_chunk("st2", children("st2", 1, 3), [], 5, 60.0)
    assert rows_of(store, "st2") == 2
    assert batches.get("st2").written == 2  # type: ignore[union-attr]


def test_a_stream_whose_lease_ran_out_is_failed_once_and_takes_no_more_chunks(
    store: JobStore,
) -> None:
    batches = BatchStore(store)
    open_stream(batches, "st3", lease=0.5)
    open_stream(batches, "st-alive")
    batches.write_chunk("st3", children("st3", 0, 4), [], 4, 0.5)
    assert batches.abandoned_streams() == []
    wait_until(lambda: batches.abandoned_streams() == ["st3"], 10, "the lease to run out")
    with batches.finishing("st3", BatchState.FAILED, abandoned=True) as conn:
        assert conn is not None
    with batches.finishing("st3", BatchState.FAILED, abandoned=True) as conn:
        assert conn is None  # failed once
    with pytest.raises(StreamAbandoned, match="st3"):
        batches.write_chunk("st3", children("st3", 4, 2), [], 6, 0.5)
    assert rows_of(store, "st3") == 4  # the refused chunk was rolled back with its count
    with pytest.raises(StreamAbandoned):
        batches.end_stream("st3", 4)
    with pytest.raises(StreamAbandoned):
        batches.renew_lease("st3", 60.0)
    assert batches.get("st3").written == 4  # type: ignore[union-attr]
    assert batches.get("st-alive").state is BatchState.OPEN  # type: ignore[union-attr]


def test_a_renewed_or_ended_stream_is_not_taken_for_abandoned(store: JobStore) -> None:
    batches = BatchStore(store)
    open_stream(batches, "st4", lease=0.5)
    open_stream(batches, "st5", lease=0.5)
    open_stream(batches, "st-probe", lease=0.5)
    batches.renew_lease("st4", 60.0)
    batches.end_stream("st5", 0)
    # Past the first lease of all three: only the one left alone has run out.
    wait_until(lambda: batches.abandoned_streams() == ["st-probe"], 10, "the probe's lease")
    for batch_id in ("st4", "st5"):
        with batches.finishing(batch_id, BatchState.FAILED, abandoned=True) as conn:
            assert conn is None


def test_failed_children_are_listed_first_failed_first_up_to_a_limit(store: JobStore) -> None:
    batches = BatchStore(store)
    open_stream(batches, "st6")
    for i in range(5):
        state = "FAILURE" if i % 2 else "SUCCESS"
        batches.record_part(BatchPart("st6", f"st6-{i}", i, state, None))
    assert batches.failed_children("st6", 10) == ["st6-1", "st6-3"]
    assert batches.failed_children("st6", 1) == ["st6-1"]


def test_a_batch_table_of_an_earlier_version_gets_the_stream_columns(store: JobStore) -> None:
    with store.engine.connect() as conn:
        for column in ("written", "lease_until"):
            conn.execute(text(f"ALTER TABLE scheduler_batch DROP COLUMN {column}"))
    earlier = JobStore(store.url)
    assert "missing column scheduler_batch.written" in earlier.schema_differences()
    earlier.ensure_schema()  # what a worker or client does first
    assert earlier.schema_differences() == []
    batches = BatchStore(earlier)
    open_stream(batches, "st-upgraded")
    assert batches.get("st-upgraded").written == 0  # type: ignore[union-attr]
    earlier.engine.dispose()
