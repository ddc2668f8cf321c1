"""Streaming batches run by an in-process worker, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

import celery_ratchet
from celery_ratchet.celery.canvas.streams import fail_abandoned
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.batch import BatchKind, BatchState
from celery_ratchet.errors import InvalidJob, StreamAbandoned
from tests.helpers import wait_until
from tests.integration.tasks import RUNS

TIMEOUT = 60


def _key(name: str) -> str:
    return f"{name}-{time.monotonic()}"


def _open_stream(app: Celery, name: str) -> Any:
    found = [
        s
        for s in ratchet_state(app).batches.summaries(state=BatchState.OPEN, limit=1000)
        if s.kind is BatchKind.STREAM and s.name == name
    ]
    return found[0] if found else None


def test_a_stream_is_written_chunk_by_chunk_and_succeeds_once(worker_app: Celery) -> None:
    collect = worker_app.tasks["t.collect"]
    key, name = _key("stream"), _key("Import")
    seen_mid_stream: list[Any] = []

    def rows() -> Iterator[int]:
        for i in range(250):
            if i == 150:  # inside the second chunk: the first one is in the store already
                seen_mid_stream.append(_open_stream(worker_app, name))
            yield i

    streamed = (
        celery_ratchet.batch(name, app=worker_app)
        .on_progress(collect.s(key + "-progress"))
        .on_success(collect.s(key + "-ok"))
        .on_failure(collect.s(key + "-failed"))
        .stream(rows(), lambda i: collect.s(i, key), chunk_size=100)
    )
    [mid] = seen_mid_stream
    assert (mid.state, mid.total, mid.written) == (BatchState.OPEN, None, 100)
    assert (streamed.total, streamed.items) == (250, 250)
    wait_until(lambda: RUNS[key + "-ok"], TIMEOUT, "the success callback")
    assert sorted(RUNS[key]) == list(range(250))  # every item once
    [summary] = RUNS[key + "-ok"]
    assert (summary["total"], summary["succeeded"], summary["failed"]) == (250, 250, 0)
    assert summary["batch_id"] == streamed.id and summary["name"] == name
    progress = streamed.progress()
    assert (progress.state, progress.percent_done, progress.total) == (
        BatchState.SUCCEEDED,
        100.0,
        250,
    )
    assert RUNS[key + "-failed"] == []
    assert all(0 < r["percent_done"] <= 100 for r in RUNS[key + "-progress"])


def test_children_that_all_finished_do_not_end_a_stream_still_open(worker_app: Celery) -> None:
    collect = worker_app.tasks["t.collect"]
    key, name = _key("held"), _key("Held open")

    def rows() -> Iterator[int]:
        yield from range(10)  # the first chunk
        # The iterator pauses (a slow query): every child written runs and finishes.
        wait_until(lambda: len(RUNS[key]) == 10, TIMEOUT, "the first chunk to run")
        open_batch = _open_stream(worker_app, name)
        wait_until(lambda: open_batch.batch_id in _done_batches(worker_app, 10), TIMEOUT, "parts")
        assert RUNS[key + "-ok"] == []  # not done: the stream has not ended
        assert _open_stream(worker_app, name) is not None
        yield from range(10, 15)

    streamed = (
        celery_ratchet.batch(name, app=worker_app)
        .on_success(collect.s(key + "-ok"))
        .stream(rows(), lambda i: collect.s(i, key), chunk_size=10)
    )
    wait_until(lambda: RUNS[key + "-ok"], TIMEOUT, "the success callback")
    assert RUNS[key + "-ok"][0]["total"] == 15 == streamed.total
    assert sorted(RUNS[key]) == list(range(15))


def _done_batches(app: Celery, done: int) -> set[str]:
    summaries = ratchet_state(app).batches.summaries(state=BatchState.OPEN, limit=1000)
    return {s.batch_id for s in summaries if s.done >= done}


def test_a_stream_whose_children_all_ended_before_it_did_is_finished_by_its_producer(
    worker_app: Celery,
) -> None:
    collect = worker_app.tasks["t.collect"]
    key, name = _key("last"), _key("Finished by producer")

    def rows() -> Iterator[int]:
        yield from range(5)
        wait_until(lambda: len(RUNS[key]) == 5, TIMEOUT, "the children to run")
        open_batch = _open_stream(worker_app, name)
        wait_until(lambda: open_batch.batch_id in _done_batches(worker_app, 5), TIMEOUT, "parts")

    streamed = (
        celery_ratchet.batch(name, app=worker_app)
        .on_success(collect.s(key + "-ok"))
        .stream(rows(), lambda i: collect.s(i, key), chunk_size=5)
    )
    # No child is left to finish it: the producer did, before stream() returned.
    assert streamed.progress().state is BatchState.SUCCEEDED
    wait_until(lambda: RUNS[key + "-ok"], TIMEOUT, "the success callback")
    assert [r["total"] for r in RUNS[key + "-ok"]] == [5]


def test_chunked_children_get_lists_of_items(worker_app: Celery) -> None:
    collect = worker_app.tasks["t.collect"]
    key = _key("chunked")
    streamed = (
        celery_ratchet.batch("Chunked", app=worker_app)
        .on_success(collect.s(key + "-ok"))
        .stream(iter(range(25)), lambda chunk: collect.s(chunk, key), chunk_size=10, chunked=True)
    )
    wait_until(lambda: RUNS[key + "-ok"], TIMEOUT, "the success callback")
    assert (streamed.total, streamed.items) == (3, 25)
    assert sorted(RUNS[key]) == [list(range(10)), list(range(10, 20)), list(range(20, 25))]
    assert RUNS[key + "-ok"][0]["total"] == 3


def test_an_empty_stream_succeeds_at_once(worker_app: Celery) -> None:
    collect = worker_app.tasks["t.collect"]
    key = _key("empty")
    streamed = (
        celery_ratchet.batch("Nothing", app=worker_app)
        .on_success(collect.s(key + "-ok"))
        .stream(iter(()), lambda i: collect.s(i, key))
    )
    wait_until(lambda: RUNS[key + "-ok"], TIMEOUT, "the success callback")
    assert RUNS[key + "-ok"][0]["total"] == 0 == streamed.total
    assert streamed.progress().state is BatchState.SUCCEEDED


def test_a_failed_child_fails_the_stream_naming_it(worker_app: Celery) -> None:
    collect, fail = worker_app.tasks["t.collect"], worker_app.tasks["t.fail"]
    key = _key("bad-child")
    (
        celery_ratchet.batch("One bad", app=worker_app)
        .on_success(collect.s(key + "-ok"))
        .on_failure(collect.s(key + "-failed"))
        .stream(range(6), lambda i: fail.si("bad") if i == 3 else collect.s(i, key), chunk_size=4)
    )
    [report] = wait_until_value(lambda: RUNS[key + "-failed"])
    assert (report["total"], report["failed"], report["succeeded"]) == (6, 1, 5)
    assert len(report["failed_ids"]) == 1
    assert RUNS[key + "-ok"] == []


def test_an_iterator_that_raises_fails_the_stream_with_the_count(worker_app: Celery) -> None:
    collect = worker_app.tasks["t.collect"]
    key = _key("raising")

    def rows() -> Iterator[int]:
        yield from range(7)
        raise OSError("the export file was truncated")

    with pytest.raises(OSError, match="truncated"):
        (
            celery_ratchet.batch("Raising", app=worker_app)
            .on_failure(collect.s(key + "-failed"))
            .stream(rows(), lambda i: collect.s(i, key), chunk_size=3)
        )
    [report] = wait_until_value(lambda: RUNS[key + "-failed"])
    # Chunks of 3: two were written; the third (one item) never was.
    assert (report["written"], report["total"]) == (6, None)
    assert "after 6 children" in report["error"] and "truncated" in report["error"]


def test_a_stream_whose_lease_ran_out_is_failed_and_told_so(worker_app: Celery) -> None:
    collect = worker_app.tasks["t.collect"]
    key, name = _key("stalled"), _key("Stalled")

    def rows() -> Iterator[int]:
        yield from range(4)
        # The producer stalls past its lease; meanwhile a node's housekeeping fails it.
        wait_until(
            lambda: fail_abandoned(worker_app) == 1 or _open_stream(worker_app, name) is None,
            TIMEOUT,
            "the stream to be failed",
        )
        yield from range(4, 8)

    with pytest.raises(StreamAbandoned):
        (
            celery_ratchet.batch(name, app=worker_app)
            .on_failure(collect.s(key + "-failed"))
            .stream(rows(), lambda i: collect.s(i, key), chunk_size=4, lease_seconds=0.5)
        )
    [report] = wait_until_value(lambda: RUNS[key + "-failed"])
    assert report["written"] == 4 and "after writing 4 children" in report["error"]
    wait_until(lambda: sorted(RUNS[key]) == list(range(4)), TIMEOUT, "the written children")


@pytest.mark.parametrize(
    ("options", "field"),
    [({"chunk_size": 0}, "chunk_size"), ({"lease_seconds": 0}, "lease_seconds")],
)
def test_bad_stream_options_are_refused_naming_them(
    worker_app: Celery, options: dict[str, Any], field: str
) -> None:
    collect = worker_app.tasks["t.collect"]
    with pytest.raises(InvalidJob, match=field) as refused:
        celery_ratchet.batch("Bad", app=worker_app).stream([1], collect.s, **options)
    assert refused.value.field == field


def test_a_stream_inside_a_transaction_is_refused(worker_app: Celery) -> None:
    collect = worker_app.tasks["t.collect"]
    engine = ratchet_state(worker_app).store.engine
    with (
        engine.connect() as conn,
        celery_ratchet.transaction(conn),
        pytest.raises(InvalidJob, match="transaction"),
    ):
        celery_ratchet.batch("In tx", app=worker_app).stream([1], collect.s)


def wait_until_value(produce: Any) -> Any:
    wait_until(produce, TIMEOUT, "a callback")
    return produce()
