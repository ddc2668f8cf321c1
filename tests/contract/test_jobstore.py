"""The JobStore contract: one suite, run against SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from celery_ratchet.domain.job import ClaimedJob, JobStatus, Settlement, StoredResult
from celery_ratchet.errors import DuplicateJob
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job, wait_until

NOW = datetime.now(timezone.utc)


def status_of(store: JobStore, job_id: str) -> JobStatus:
    record = store.result(job_id)
    assert record is not None, f"no row for {job_id}"
    return record.status


def claimed_once_due(store: JobStore, limit: int) -> list[ClaimedJob]:
    """Claims from queue ``celery`` until a job is due, by the database clock."""
    claimed: list[ClaimedJob] = []

    def claim() -> bool:
        claimed.extend(store.claim("n", ["celery"], limit))
        return bool(claimed)

    wait_until(claim, 30, "a job to fall due")
    return claimed


def held_longer_than(store: JobStore, node_id: str, seconds: float, count: int) -> None:
    """Returns once ``count`` claims of ``node_id`` are older than ``seconds`` by the
    database clock, the clock orphan recovery measures its grace with."""
    wait_until(
        lambda: len(store.running_claims(node_id, older_than_seconds=seconds)) == count,
        30,
        f"the claims of {node_id} to be {seconds} s old",
    )


def test_enqueued_job_is_claimed_with_its_message(store: JobStore) -> None:
    job = new_job("j1", priority=7)
    store.enqueue(job)
    [claimed] = store.claim("node-a", ["celery"], 10)
    assert claimed.job_id == "j1"
    assert claimed.priority == 7
    assert claimed.claims == 1
    assert claimed.message == job.message
    assert status_of(store, "j1") is JobStatus.RUNNING
    assert store.claim("node-b", ["celery"], 10) == []


def test_claim_orders_by_priority_then_due_time(store: JobStore) -> None:
    store.enqueue(new_job("old-low", priority=1, due=NOW - timedelta(minutes=5)))
    store.enqueue(new_job("new-high", priority=9, due=NOW - timedelta(seconds=1)))
    store.enqueue(new_job("old-high", priority=9, due=NOW - timedelta(minutes=1)))
    store.enqueue(new_job("mid", priority=5))
    claimed = store.claim("n", ["celery"], 2) + store.claim("n", ["celery"], 2)
    assert [j.job_id for j in claimed] == ["old-high", "new-high", "mid", "old-low"]


def test_future_jobs_wait_for_their_due_time(store: JobStore) -> None:
    store.enqueue(new_job("later", due=NOW + timedelta(hours=1)))
    store.enqueue(new_job("soon", due=datetime.now(timezone.utc) + timedelta(seconds=0.5)))
    assert store.claim("n", ["celery"], 10) == []
    claimed = claimed_once_due(store, 10)
    assert [j.job_id for j in claimed] == ["soon"]


def test_claim_takes_only_the_given_queues_and_limit(store: JobStore) -> None:
    for i in range(5):
        store.enqueue(new_job(f"a{i}", queue="alpha"))
    store.enqueue(new_job("b0", queue="beta"))
    assert {j.job_id for j in store.claim("n", ["beta"], 10)} == {"b0"}
    assert len(store.claim("n", ["alpha", "gamma"], 3)) == 3
    assert len(store.claim("n", ["alpha"], 10)) == 2


def test_settlement_is_a_compare_and_swap_on_the_claim(store: JobStore) -> None:
    store.enqueue(new_job("ok"))
    store.enqueue(new_job("bad"))
    ok, bad = sorted(store.claim("n", ["celery"], 10), key=lambda j: j.job_id != "ok")
    stale = Settlement("ok", "not-my-token", JobStatus.FAILED, error="stale")
    assert store.settle([stale]) == 0
    changed = store.settle(
        [
            Settlement(ok.job_id, ok.token, JobStatus.SUCCEEDED),
            Settlement(
                bad.job_id, bad.token, JobStatus.FAILED, error='{"exc_type": "E"}', traceback="tb"
            ),
        ]
    )
    assert changed == 2
    assert status_of(store, "ok") is JobStatus.SUCCEEDED
    record = store.result("bad")
    assert record is not None
    assert (record.status, record.last_error, record.error_traceback) == (
        JobStatus.FAILED,
        '{"exc_type": "E"}',
        "tb",
    )
    assert record.finished_at is not None
    # A finished row never goes back, whoever asks.
    assert store.settle([Settlement(ok.job_id, ok.token, JobStatus.FAILED)]) == 0
    assert status_of(store, "ok") is JobStatus.SUCCEEDED


def test_successes_with_their_results_are_written_as_the_backend_writes_each(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker hands its threads' results to the settler: each success is written with
    its value, type and meta, an earlier error cleared, beside plain outcomes; one whose
    claim is gone is not written and is logged by id alone."""
    for name in ("r1", "r2", "plain", "lost"):
        store.enqueue(new_job(name))
    claimed = {j.job_id: j for j in store.claim("n", ["celery"], 10)}
    with store.engine.begin() as conn:  # r1 failed once before (a retry kept the reason)
        conn.execute(
            text("UPDATE scheduler_job SET last_error = 'before' WHERE job_id = 'r1'"),
        )

    def success(job_id: str, stored: StoredResult | None = None, token: str = "") -> Settlement:
        return Settlement(
            job_id, token or claimed[job_id].token, JobStatus.SUCCEEDED, result=stored
        )

    secret = "the-value-is-not-logged"
    with caplog.at_level(logging.WARNING, logger="celery_ratchet.store.settle"):
        changed = store.settle(
            [
                success("r1", StoredResult('{"n": 1}', "dict", '{"children": []}')),
                success("r2", StoredResult(None, None, None)),
                success("plain"),
                success("lost", StoredResult(f'"{secret}"', "str", None), token="not-its-claim"),
            ]
        )
    assert changed == 3
    r1 = store.result("r1")
    assert r1 is not None and r1.status is JobStatus.SUCCEEDED
    assert (r1.job_result, r1.result_type, r1.result_meta) == ('{"n": 1}', "dict",
                                                               '{"children": []}')  # fmt: skip
    assert r1.last_error is None and r1.finished_at is not None
    r2 = store.result("r2")
    assert r2 is not None and r2.status is JobStatus.SUCCEEDED and r2.job_result is None
    assert status_of(store, "plain") is JobStatus.SUCCEEDED
    assert status_of(store, "lost") is JobStatus.RUNNING
    lost = [r.getMessage() for r in caplog.records if "job lost not written" in r.getMessage()]
    assert len(lost) == 1 and secret not in lost[0]
    # Written once: the same outcome again (a batch retried after a lost reply) changes nothing.
    assert store.settle([success("r1", StoredResult('"other"', "str", None))]) == 0
    r1 = store.result("r1")
    assert r1 is not None and r1.job_result == '{"n": 1}'


def test_one_settle_of_many_outcomes_writes_each_as_alone(store: JobStore) -> None:
    """A batch as the settler writes it: successes, failures, a hand-back, a stale claim and
    an execution reported twice, each row written as a settle of its own would write it."""
    for name in ("s1", "s2", "f1", "f2", "back", "stale"):
        store.enqueue(new_job(name))
    claimed = {j.job_id: j for j in store.claim("n", ["celery"], 10)}
    # f2 failed before (a retry kept the reason); this failure brings no error of its own.
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE scheduler_job SET last_error = :e WHERE job_id = 'f2'"),
            {"e": '{"exc_type": "Before"}'},
        )

    def ended(job_id: str, status: JobStatus, **kw: str) -> Settlement:
        return Settlement(job_id, claimed[job_id].token, status, **kw)

    changed = store.settle(
        [
            ended("s1", JobStatus.SUCCEEDED),
            ended("f1", JobStatus.FAILED, error='{"exc_type": "E"}', traceback="tb"),
            ended("back", JobStatus.PENDING),
            Settlement("stale", "not-its-claim", JobStatus.FAILED, error='"x"'),
            ended("s2", JobStatus.SUCCEEDED),
            ended("s2", JobStatus.FAILED, error='"second report"'),
            ended("f2", JobStatus.FAILED),
        ]
    )
    assert changed == 5
    statuses = {name: status_of(store, name) for name in claimed}
    assert statuses == {
        "s1": JobStatus.SUCCEEDED,
        "s2": JobStatus.SUCCEEDED,
        "f1": JobStatus.FAILED,
        "f2": JobStatus.FAILED,
        "back": JobStatus.PENDING,
        "stale": JobStatus.RUNNING,
    }
    f1 = store.result("f1")
    assert f1 is not None
    assert (f1.last_error, f1.error_traceback) == ('{"exc_type": "E"}', "tb")
    assert f1.finished_at is not None
    f2 = store.result("f2")
    assert f2 is not None and f2.last_error == '{"exc_type": "Before"}'
    back = store.result("back")
    assert back is not None and back.finished_at is None
    [again] = store.claim("m", ["celery"], 1)
    assert (again.job_id, again.claims) == ("back", 2)


def test_result_is_stored_only_by_the_claim_holder(store: JobStore) -> None:
    store.enqueue(new_job("r"))
    [job] = store.claim("n", ["celery"], 1)
    assert not store.store_outcome("r", "other", JobStatus.SUCCEEDED, job_result="1")
    assert store.store_outcome(
        "r", job.token, JobStatus.SUCCEEDED, job_result="42", result_type="builtins.int"
    )
    record = store.result("r")
    assert record is not None
    assert (record.status, record.job_result, record.result_type) == (
        JobStatus.SUCCEEDED,
        "42",
        "builtins.int",
    )


def test_a_retry_reschedules_the_same_row_and_voids_the_old_claim(store: JobStore) -> None:
    store.enqueue(new_job("retry-me"))
    [first] = store.claim("n", ["celery"], 1)
    # Room for the four statements below on a loaded machine (0.5 s was seen to run out);
    # the wait after them ends as soon as the row falls due.
    due = datetime.now(timezone.utc) + timedelta(seconds=1.5)
    assert store.replace_running(first.token, new_job("retry-me", attempts=1, due=due))
    record = store.result("retry-me")
    assert record is not None and record.status is JobStatus.PENDING
    # The first execution ends late: its outcome must not touch the rescheduled row.
    assert not store.store_outcome("retry-me", first.token, JobStatus.SUCCEEDED)
    assert store.settle([Settlement("retry-me", first.token, JobStatus.FAILED)]) == 0
    assert store.claim("n", ["celery"], 1) == []  # not due yet
    [second] = claimed_once_due(store, 1)
    assert (second.job_id, second.attempts, second.claims) == ("retry-me", 1, 1)
    assert not store.replace_running(first.token, new_job("retry-me", attempts=2))


def test_an_active_job_id_cannot_be_enqueued_twice(store: JobStore) -> None:
    store.enqueue(new_job("dup"))
    with pytest.raises(DuplicateJob, match="dup"):
        store.enqueue(new_job("dup"))
    assert store.count_by_status() == {"PENDING": 1}


def test_a_finished_job_id_can_be_sent_again(store: JobStore) -> None:
    store.enqueue(new_job("again"))
    [job] = store.claim("n", ["celery"], 1)
    store.store_outcome("again", job.token, JobStatus.FAILED, error="x")
    store.enqueue(new_job("again", priority=9))
    record = store.result("again")
    assert record is not None
    assert (record.status, record.last_error) == (JobStatus.PENDING, None)


def test_bulk_enqueue_is_all_or_nothing(store: JobStore) -> None:
    store.enqueue(new_job("taken"))
    batch = [new_job(f"b{i}") for i in range(5)] + [new_job("taken")]
    with pytest.raises(DuplicateJob):
        store.enqueue_many(batch)
    assert store.count_by_status() == {"PENDING": 1}
    store.enqueue_many([new_job(f"c{i}") for i in range(500)])
    assert store.count_by_status() == {"PENDING": 501}


def test_a_chain_step_stored_over_its_running_job_takes_the_row_over(store: JobStore) -> None:
    """A task replaced by a chain whose last step takes its id: the running row becomes that
    WAITING step in the same write; the replaced execution's outcome finds its claim gone,
    and the step before releases it as any step."""
    store.enqueue(new_job("replaced"))
    [running] = store.claim("n", ["celery"], 1)
    last = dataclasses.replace(
        new_job("replaced", task="tests.last"), depends_on="first", takes_over=running.token
    )
    store.enqueue_many([new_job("first")], waiting=[last])
    record = store.result("replaced")
    assert record is not None
    assert (record.status, record.task_name) == (JobStatus.WAITING, "tests.last")
    assert store.settle([Settlement("replaced", running.token, JobStatus.SUCCEEDED)]) == 0
    [first] = store.claim("n", ["celery"], 5)
    assert first.job_id == "first"
    assert store.settle([Settlement("first", first.token, JobStatus.SUCCEEDED)]) == 1
    released = dataclasses.replace(new_job("replaced", task="tests.last"), parent_id="first")
    store.enqueue(released)
    [step] = store.claim("n", ["celery"], 5)
    assert (step.job_id, step.task_name, step.claims) == ("replaced", "tests.last", 1)


def test_handed_back_jobs_are_due_again_and_marked_redelivered(store: JobStore) -> None:
    store.enqueue(new_job("h"))
    [job] = store.claim("n", ["celery"], 1)
    store.settle([Settlement("h", job.token, JobStatus.PENDING)])
    [again] = store.claim("m", ["celery"], 1)
    assert (again.job_id, again.claims) == ("h", 2)
    assert again.token != job.token


def test_orphans_of_silent_nodes_are_recovered(store: JobStore) -> None:
    store.register_node("dead", "host-a", 1, ["celery"], 4)
    store.register_node("alive", "host-b", 2, ["celery"], 4)
    for i in range(3):
        store.enqueue(new_job(f"o{i}"))
    dead_jobs = store.claim("dead", ["celery"], 2)
    [alive_job] = store.claim("alive", ["celery"], 1)
    held_longer_than(store, "dead", 1.0, len(dead_jobs))
    assert store.heartbeat("alive")
    recovered = store.recover_orphans(grace_seconds=1.0).requeued
    assert sorted(recovered) == sorted(j.job_id for j in dead_jobs)
    assert {n["node_id"] for n in store.list_nodes()} == {"alive"}
    assert not store.heartbeat("dead")
    assert status_of(store, alive_job.job_id) is JobStatus.RUNNING
    reclaimed = store.claim("alive", ["celery"], 5)
    assert sorted(j.job_id for j in reclaimed) == sorted(recovered)
    # The dead node's late outcome is refused: the rows belong to new claims now.
    assert (
        store.settle([Settlement(j.job_id, j.token, JobStatus.SUCCEEDED) for j in dead_jobs]) == 0
    )


def test_jobs_of_nodes_without_a_row_are_recovered_after_the_grace(store: JobStore) -> None:
    store.enqueue(new_job("ghost"))
    store.claim("never-registered", ["celery"], 1)
    assert store.recover_orphans(grace_seconds=30).jobs == []
    held_longer_than(store, "never-registered", 1.0, 1)
    assert store.recover_orphans(grace_seconds=1.0).requeued == ["ghost"]


def test_revoke_and_purge_touch_only_pending_jobs(store: JobStore) -> None:
    for i in range(4):
        store.enqueue(new_job(f"p{i}"))
    [running] = store.claim("n", ["celery"], 1)
    revoked = store.revoke_pending(["p0", "p1", "p2", "p3"], '{"exc_type": "TaskRevokedError"}')
    assert revoked == 3
    assert status_of(store, running.job_id) is JobStatus.RUNNING
    store.enqueue(new_job("q0"))
    assert store.purge_pending(["celery"]) == 1


def test_untracked_results_get_a_finished_row(store: JobStore) -> None:
    store.store_untracked_result("eager", "tests.add", JobStatus.SUCCEEDED, job_result="3")
    record = store.result("eager")
    assert record is not None and (record.status, record.job_result) == (JobStatus.SUCCEEDED, "3")
    store.forget("eager")
    assert store.result("eager") is None


def test_groups_are_saved_and_restored(store: JobStore) -> None:
    store.save_group("g", '{"result": [1]}')
    store.save_group("g", '{"result": [2]}')
    assert store.load_group("g") == '{"result": [2]}'
    store.delete_group("g")
    assert store.load_group("g") is None


def test_live_schema_matches_the_schema_code(store: JobStore) -> None:
    assert store.schema_differences() == []
    on_table = " ON scheduler_job" if store.family == "mysql" else ""
    # One connection for both DDL statements: SQLite checks "already exists" against the
    # schema cached by the connection, which other pooled connections may not have reloaded.
    with store.engine.connect() as conn:
        conn.execute(text(f"DROP INDEX ix_scheduler_job_finished{on_table}"))
        assert store.schema_differences() == [
            "missing index ix_scheduler_job_finished on scheduler_job"
        ]
        conn.execute(
            text("CREATE INDEX ix_scheduler_job_finished ON scheduler_job (status, finished_at)")
        )
    assert store.schema_differences() == []


def test_tables_of_an_earlier_version_are_brought_up_to_date(store: JobStore) -> None:
    on_table = " ON scheduler_job" if store.family == "mysql" else ""
    with store.engine.connect() as conn:
        conn.execute(text(f"DROP INDEX ix_scheduler_job_finished{on_table}"))
        conn.execute(text("ALTER TABLE scheduler_job DROP COLUMN schedule_spec"))
    assert "missing column scheduler_job.schedule_spec" in store.schema_differences()
    assert store.create_missing_tables() == [
        "scheduler_job.schedule_spec",
        "index ix_scheduler_job_finished",
    ]
    assert store.schema_differences() == []
    store.enqueue(new_job("after-upgrade"))
    assert store.count_by_status() == {"PENDING": 1}
