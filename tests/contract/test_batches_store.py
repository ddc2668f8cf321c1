"""Chain steps, batch parts and the batch completion swap, on SQLite, PostgreSQL, MariaDB."""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading

import pytest
from sqlalchemy import text, update

from celery_ratchet.domain.batch import BatchKind, BatchPart, BatchState, NewBatch
from celery_ratchet.domain.job import JobStatus, JobType, NewJob, Settlement
from celery_ratchet.errors import DuplicateJob
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.engine import transaction
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_batch
from celery_ratchet.store.step_rows import record_part
from tests.helpers import new_job, wait_until


def step(job_id: str, after: str) -> NewJob:
    return dataclasses.replace(
        new_job(job_id), depends_on=after, parent_id=after, job_type=JobType.CHAIN_STEP
    )


def status_of(store: JobStore, job_id: str) -> JobStatus:
    record = store.result(job_id)
    assert record is not None, job_id
    return record.status


def test_waiting_steps_are_never_claimed_until_released(store: JobStore) -> None:
    store.enqueue_many([new_job("s1")], [step("s2", "s1"), step("s3", "s2")])
    assert [j.job_id for j in store.claim("n", ["celery"], 10)] == ["s1"]
    assert status_of(store, "s2") is JobStatus.WAITING
    # The step before succeeded and sends the next one: the waiting row is released.
    released = dataclasses.replace(new_job("s2"), parent_id="s1")
    store.enqueue_many([released], [step("s3", "s2")])
    assert [j.job_id for j in store.claim("n", ["celery"], 10)] == ["s2"]
    assert status_of(store, "s3") is JobStatus.WAITING


def test_a_released_step_sent_again_by_its_parent_runs_once(store: JobStore) -> None:
    store.enqueue_many([new_job("a1")], [step("a2", "a1")])
    again = dataclasses.replace(new_job("a2"), parent_id="a1")
    store.enqueue(again)
    store.enqueue(again)  # the step before ran twice (its node died after sending)
    assert sorted(j.job_id for j in store.claim("n", ["celery"], 10)) == ["a1", "a2"]
    with pytest.raises(DuplicateJob):  # any other sender with a taken id is refused
        store.enqueue(dataclasses.replace(new_job("a2"), parent_id="someone-else"))


def test_a_failed_step_revokes_every_step_after_it(store: JobStore) -> None:
    store.enqueue_many([new_job("f1")], [step("f2", "f1"), step("f3", "f2"), step("f4", "f3")])
    [claimed] = store.claim("n", ["celery"], 10)
    store.settle([Settlement("f1", claimed.token, JobStatus.FAILED, '"boom"', None)])
    assert [status_of(store, j) for j in ("f1", "f2", "f3", "f4")] == [
        JobStatus.FAILED,
        JobStatus.REVOKED,
        JobStatus.REVOKED,
        JobStatus.REVOKED,
    ]
    assert store.result("f4").last_error == '"boom"'  # type: ignore[union-attr]


def test_revoking_a_waiting_step_revokes_the_rest(store: JobStore) -> None:
    store.enqueue_many([new_job("r1")], [step("r2", "r1"), step("r3", "r2")])
    assert store.request_revoke(["r2"], '"revoked"') == (1, 0)
    assert status_of(store, "r3") is JobStatus.REVOKED
    assert status_of(store, "r1") is JobStatus.PENDING


def test_parts_count_each_child_once(store: JobStore) -> None:
    batches = BatchStore(store)
    batches.open(NewBatch("b1", BatchKind.CHORD, 2))
    first = BatchPart("b1", "c1", 0, "SUCCESS", "1")
    assert batches.record_part(first).done == 1
    assert batches.record_part(first).done == 1  # reported again: still one
    progress = batches.record_part(BatchPart("b1", "c2", 1, "FAILURE", '{"exc_type": "X"}'))
    assert (progress.done, progress.failed) == (2, 1)
    assert [p.job_id for p in batches.parts("b1")] == ["c1", "c2"]


def test_only_chords_nothing_was_written_for_are_discarded_as_unsent(store: JobStore) -> None:
    batches = BatchStore(store)
    chords = ["empty-chord", "with-child", "with-part"]
    for batch_id in chords:
        batches.open(NewBatch(batch_id, BatchKind.CHORD, 2))
    batches.open(NewBatch("a-batch", BatchKind.BATCH, 2))
    batches.open_groups(["a-group"])
    store.enqueue(dataclasses.replace(new_job("child-1"), group_id="with-child"))
    batches.record_part(BatchPart("with-part", "gone", 0, "SUCCESS", "1"))
    ids = [*chords, "a-batch", "a-group", "unknown"]
    assert batches.discard_unsent(ids) == 1
    assert batches.get("empty-chord") is None
    kept = ("with-child", "with-part", "a-batch", "a-group")
    assert all(batches.get(b) is not None for b in kept)


def test_a_group_found_finished_is_listed_with_its_end(store: JobStore) -> None:
    batches = BatchStore(store)
    batches.open_groups(["g-done"])
    store.enqueue_many([dataclasses.replace(new_job(f"g{i}"), group_id="g-done") for i in (1, 2)])
    store.settle(
        Settlement(c.job_id, c.token, JobStatus.SUCCEEDED) for c in store.claim("n", ["celery"], 2)
    )
    [listed] = batches.summaries(batch_id="g-done")  # the listing that finds it finished
    assert listed.state is BatchState.SUCCEEDED and listed.finished_at is not None
    [again] = batches.summaries(batch_id="g-done")
    assert again.finished_at == listed.finished_at


def test_the_part_is_written_with_the_childs_outcome(store: JobStore) -> None:
    batches = BatchStore(store)
    batches.open(NewBatch("b2", BatchKind.CHORD, 1))
    store.enqueue(new_job("child"))
    [claimed] = store.claim("n", ["celery"], 1)
    part = BatchPart("b2", "child", 0, "SUCCESS", "42")
    assert store.store_outcome("child", claimed.token, JobStatus.SUCCEEDED, part=part)
    assert batches.unfinished_complete(older_than_seconds=-60) == ["b2"]
    # A lost claim writes neither the outcome nor the part.
    batches.open(NewBatch("b3", BatchKind.CHORD, 1))
    lost = BatchPart("b3", "child", 0, "SUCCESS", "42")
    assert not store.store_outcome("child", claimed.token, JobStatus.SUCCEEDED, part=lost)
    assert batches.parts("b3") == []


def test_a_batch_completes_once(store: JobStore) -> None:
    batches = BatchStore(store)
    batches.open(NewBatch("once", BatchKind.CHORD, 1))
    with batches.finishing("once", BatchState.SUCCEEDED) as conn:
        assert conn is not None
    with batches.finishing("once", BatchState.FAILED) as conn:
        assert conn is None
    assert batches.get("once").state is BatchState.SUCCEEDED  # type: ignore[union-attr]
    assert batches.unfinished_complete(older_than_seconds=-60) == []


def test_a_failed_completion_leaves_the_batch_open(server_store: JobStore) -> None:
    batches = BatchStore(server_store)
    batches.open(NewBatch("rollback", BatchKind.CHORD, 1))
    with pytest.raises(RuntimeError), batches.finishing("rollback", BatchState.SUCCEEDED):
        raise RuntimeError("the body could not be sent")
    assert batches.get("rollback").state is BatchState.OPEN  # type: ignore[union-attr]


def _race(url: str, batch_id: str) -> bool:
    batches = BatchStore(JobStore(url))
    with batches.finishing(batch_id, BatchState.SUCCEEDED) as conn:
        return conn is not None


@pytest.mark.slow  # separate processes, each starting Python afresh
def test_processes_racing_to_complete_a_batch_win_once(server_store: JobStore) -> None:
    batches = BatchStore(server_store)
    ids = [f"race-{i}" for i in range(20)]
    for batch_id in ids:
        batches.open(NewBatch(batch_id, BatchKind.CHORD, 1))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        wins = pool.starmap(_race, [(server_store.url, b) for b in ids for _ in range(4)])
    assert sum(wins) == len(ids)


def test_storing_waiting_steps_again_keeps_their_rows(store: JobStore) -> None:
    store.enqueue_many([new_job("k1")], [step("k2", "k1")])
    with store.engine.connect() as conn:
        before = conn.exec_driver_sql("SELECT id FROM scheduler_job WHERE job_id = 'k2'").scalar()
    store.enqueue_many([new_job("k0")], [step("k2", "k1")])  # the same chain step again
    with store.engine.connect() as conn:
        after = conn.exec_driver_sql("SELECT id FROM scheduler_job WHERE job_id = 'k2'").scalar()
    assert before == after


def test_a_failed_step_retried_from_the_dlq_restores_the_steps_after_it(store: JobStore) -> None:
    store.enqueue_many([new_job("d1")], [step("d2", "d1"), step("d3", "d2")])
    [claimed] = store.claim("n", ["celery"], 10)
    store.settle([Settlement("d1", claimed.token, JobStatus.FAILED, '"boom"', None)])
    assert status_of(store, "d3") is JobStatus.REVOKED
    assert store.retry_failed(["d1"]) == 1
    assert [status_of(store, j) for j in ("d1", "d2", "d3")] == [
        JobStatus.PENDING,
        JobStatus.WAITING,
        JobStatus.WAITING,
    ]


def test_a_revoked_chord_child_is_counted(store: JobStore) -> None:
    batches = BatchStore(store)
    batches.open(NewBatch("rv", BatchKind.CHORD, 2))
    store.enqueue_many([dataclasses.replace(new_job("rv1"), group_id="rv")])
    touched: list[str] = []
    assert store.request_revoke(["rv1"], '"revoked"', batches=touched) == (1, 0)
    assert touched == ["rv"]
    progress = batches.progress("rv")
    assert (progress.done, progress.failed) == (1, 1)


def _decide_all(url: str, parent_id: str) -> int:
    """One process deciding a workflow's branches; returns how many it decided."""
    batches = BatchStore(JobStore(url))
    with batches.deciding(parent_id) as unit:
        if unit is None:
            return 0
        states = {b.position: "FIRED" for b in batches.conditions(parent_id)}
        return len(batches.decide(unit, parent_id, states))


@pytest.mark.slow  # separate processes, each starting Python afresh
def test_processes_racing_to_decide_a_workflow_decide_each_branch_once(
    server_store: JobStore,
) -> None:
    batches = BatchStore(server_store)
    parents = [f"wf-{i}" for i in range(10)]
    for parent in parents:
        batches.add_conditions(parent, [{"kind": "SUCCESS", "branch": "{}"} for _ in range(3)])
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        decided = pool.starmap(
            _decide_all, [(server_store.url, p) for p in parents for _ in range(4)]
        )
    assert sum(decided) == 30
    assert all(r.state == "FIRED" for p in parents for r in batches.conditions(p))


def test_a_late_settle_of_a_step_retried_from_the_dlq_keeps_its_chain_waiting(
    store: JobStore,
) -> None:
    store.enqueue_many([new_job("l1")], [step("l2", "l1"), step("l3", "l2")])
    [claimed] = store.claim("n", ["celery"], 10)
    # The result backend stores the failure first; the worker's settle of the same execution
    # is queued and written later, here only after the job was retried from the DLQ.
    assert store.store_outcome("l1", claimed.token, JobStatus.FAILED, error='"boom"')
    assert status_of(store, "l3") is JobStatus.REVOKED
    assert store.retry_failed(["l1"]) == 1
    assert store.settle([Settlement("l1", claimed.token, JobStatus.FAILED, '"boom"', None)]) == 0
    assert [status_of(store, j) for j in ("l1", "l2", "l3")] == [
        JobStatus.PENDING,
        JobStatus.WAITING,
        JobStatus.WAITING,
    ]
    # The retried step succeeds and sends the next one: the waiting row is released.
    [again] = store.claim("n", ["celery"], 10)
    assert again.job_id == "l1"
    store.enqueue_many([dataclasses.replace(new_job("l2"), parent_id="l1")], [step("l3", "l2")])
    assert [j.job_id for j in store.claim("n", ["celery"], 10)] == ["l2"]


def test_a_settle_after_the_backend_counted_the_child_leaves_the_counters(
    store: JobStore,
) -> None:
    batches = BatchStore(store)
    batches.open(NewBatch("sc", BatchKind.STREAM, None))
    store.enqueue_many([dataclasses.replace(new_job("sc1"), group_id="sc")])
    [claimed] = store.claim("n", ["celery"], 1)
    part = BatchPart("sc", "sc1", 0, "FAILURE", '{"exc_type": "ValueError"}')
    assert store.store_outcome("sc1", claimed.token, JobStatus.FAILED, error='"bad"', part=part)
    # Another child counted itself (done + 1) in a transaction whose part row a concurrent
    # recount could not see yet; the settle of sc1 must not recount the batch over it.
    with store.engine.begin() as conn:
        conn.execute(
            update(scheduler_batch)
            .where(scheduler_batch.c.batch_id == "sc")
            .values(done=scheduler_batch.c.done + 1)
        )
    store.settle([Settlement("sc1", claimed.token, JobStatus.FAILED, '"bad"', None)])
    progress = batches.progress("sc")
    assert (progress.done, progress.failed) == (2, 1)


def _waiting_for_a_lock(store: JobStore) -> bool:
    """Whether some session of this (private) database waits for a lock."""
    query = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    with store.engine.connect() as conn:
        return bool(conn.execute(text(query)).scalar())


def test_a_recount_waits_for_a_child_counting_itself(server_store: JobStore) -> None:
    if server_store.family != "postgresql":
        pytest.skip("the recount's subquery reads a statement snapshot on PostgreSQL only")
    store, batches = server_store, BatchStore(server_store)
    batches.open(NewBatch("rc", BatchKind.CHORD, 2))
    store.enqueue_many([dataclasses.replace(new_job("rc2"), group_id="rc")])
    with store.engine.connect() as child:
        with transaction(child):
            # A child's outcome counts it (its part, done + 1), not committed yet ...
            record_part(child, BatchPart("rc", "rc1", 0, "SUCCESS", "1"))
            # ... while the other child is revoked unrun: its part is counted by a recount.
            revoke = threading.Thread(target=store.request_revoke, args=(["rc2"], '"revoked"'))
            revoke.start()
            wait_until(lambda: _waiting_for_a_lock(store), 30, "the revoke to wait for the lock")
        revoke.join(30)
    progress = batches.progress("rc")
    assert (progress.done, progress.failed) == (2, 1)
