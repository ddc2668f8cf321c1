"""Every job is stored with the seeds' execution type, through every way it is written:
sent, released as a chain's next step (also handed to the worker that sent it), retried,
fired as a workflow's branch or join, sent as a batch's callback; ``ratchet jobs show
--json`` and ``ratchet jobs --json`` show it. An in-process worker on SQLite, PostgreSQL and
MariaDB (the dead-letter alert's type: test_dlq_alerts.py, and real workers in the
acceptance tests)."""

from __future__ import annotations

import json
import uuid

from celery import Celery, chain, chord, group
from click.testing import CliRunner

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.cli.main import cli
from celery_ratchet.domain.job import JobType
from tests.helpers import wait_until
from tests.integration.tasks import RUNS

TIMEOUT = 60


def type_of(app: Celery, job_id: str) -> str:
    """The job's stored type as ``ratchet jobs show --json`` shows it, once its row is there:
    read by its id, so no other row, and no row written after a listing, stands in the way."""
    url = app.conf.ratchet_url
    shown: dict[str, object] = {}

    def found() -> bool:
        answer = CliRunner().invoke(cli, ["--url", url, "jobs", "show", job_id, "--json"])
        if answer.exit_code != 0:
            assert f"no job {job_id!r}" in answer.output, answer.output
            return False
        shown.update(json.loads(answer.output))
        return True

    wait_until(found, TIMEOUT, f"job {job_id} to be stored")
    assert shown["public_type"] in {"SINGLE", "BATCH", "CHAIN", "WORKFLOW", "SYSTEM"}, shown
    return str(shown["job_type"])


def listed_types(app: Celery) -> dict[str, str]:
    """Each listed job's stored type, by id, as ``ratchet jobs --json`` lists them."""
    url = app.conf.ratchet_url
    listed = CliRunner().invoke(cli, ["--url", url, "jobs", "--json", "--limit", "500"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    for row in rows:  # the public type beside it
        assert row["public_type"] in {"SINGLE", "BATCH", "CHAIN", "WORKFLOW", "SYSTEM"}, row
    return {row["job_id"]: row["job_type"] for row in rows}


def test_each_way_of_writing_a_job_stores_its_type(worker_app: Celery) -> None:
    app = worker_app
    key = f"types-{uuid.uuid4().hex[:8]}"  # RUNS is shared by the databases' runs
    add, flaky, collect = (app.tasks[n] for n in ("t.add", "t.flaky", "t.collect"))
    single = add.delay(1, 1)
    steps = chain(add.si(1, 1), add.s(1), add.s(1)).apply_async()
    grouped = group(add.si(i, i) for i in range(3)).apply_async()
    chorded = chord([add.si(1, 2), add.si(3, 4)])(collect.s(key + "-chord"))
    retried = group(flaky.si(key + "-retried", 1), add.si(0, 0)).apply_async()
    submitted = (
        celery_ratchet.batch("Typed", app=app)
        .for_each(range(2), lambda i: add.si(i, 1))
        .on_success(collect.s(key + "-batch"))
        .submit()
    )
    flow = (
        celery_ratchet.workflow(add.si(100, 100), app=app)
        .on_success(add.s(1), name="ok")
        .when_result("tests.integration.tasks:is_big", add.s(2), name="big")
        .join(["ok", "big"], collect.s(key + "-join"))
        .submit()
    )
    assert single.get(timeout=TIMEOUT) == 2
    assert steps.get(timeout=TIMEOUT) == 4
    assert grouped.get(timeout=TIMEOUT) == [0, 2, 4]
    assert chorded.get(timeout=TIMEOUT) == [3, 7]
    assert retried.get(timeout=TIMEOUT) == ["done after 1", 0]
    submitted.results.get(timeout=TIMEOUT)
    wait_until(lambda: RUNS[key + "-batch"] and RUNS[key + "-join"], TIMEOUT, "the callbacks")
    batches = ratchet_state(app).batches
    record = batches.get(submitted.id)
    assert record is not None
    [join] = [c for c in batches.conditions(flow.id) if c.kind == "JOIN"]
    ids = {
        single.id, steps.parent.parent.id, steps.parent.id, steps.id, chorded.id, flow.id,
        _frozen_id(record.on_success), _frozen_id(join.encoded),
        *(flow.branches[n].id for n in ("ok", "big")),
        *(r.id for r in [*grouped.results, *chorded.parent.results, *retried.results,
                         *submitted.results.results]),
    }  # fmt: skip
    types = {job_id: type_of(app, job_id) for job_id in ids}

    assert types[single.id] == JobType.SINGLE
    chain_ids = [steps.parent.parent.id, steps.parent.id, steps.id]
    assert [types[i] for i in chain_ids] == [JobType.CHAIN_STEP] * 3
    assert {types[r.id] for r in grouped.results} == {JobType.BATCH_CHILD}
    assert {types[r.id] for r in chorded.parent.results} == {JobType.BATCH_CHILD}
    assert types[chorded.id] == JobType.WORKFLOW_JOIN
    assert {types[r.id] for r in retried.results} == {JobType.BATCH_CHILD}  # after its retry
    assert {types[r.id] for r in submitted.results.results} == {JobType.BATCH_CHILD}
    assert types[_frozen_id(record.on_success)] == JobType.WORKFLOW_BRANCH
    assert types[flow.id] == JobType.SINGLE
    assert {types[flow.branches[n].id] for n in ("ok", "big")} == {JobType.WORKFLOW_BRANCH}
    assert types[_frozen_id(join.encoded)] == JobType.WORKFLOW_JOIN
    listed = listed_types(app)
    assert {i: listed[i] for i in ids if i in listed} == {i: types[i] for i in ids if i in listed}


def _frozen_id(encoded: str | None) -> str:
    """The task id a stored callback (a batch's, a workflow's branch) was frozen with."""
    return str(json.loads(encoded or "{}")["options"]["task_id"])
