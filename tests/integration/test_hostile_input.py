"""Hostile input through Celery's own API, the worker and the CLI, on each database."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from sqlalchemy import create_engine, update

from celery_ratchet.celery.results.backend import UNKNOWN_STATE
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.cli.main import cli
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.errors import InvalidJob, MalformedJob
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job
from celery_ratchet.web.app import Dashboard
from tests.acceptance.conftest import wait_until
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app, worker_running
from tests.integration.test_web import call

SECRET = "4111111111111111"
LONG = "x" * 300


@pytest.fixture
def client_app(servers: Servers, dialect: str, broker_trap: BrokerTrap) -> Celery:
    url = servers.url(dialect)
    empty_store(url)
    app = make_app(url, broker_trap.url)
    app.finalize()  # binds the tasks, which makes it a ratchet app before a bare send_task
    return app


def _store(app: Celery) -> JobStore:
    return ratchet_state(app).store


def _forge(store: JobStore, job_id: str, **values: Any) -> None:
    with store.engine.connect() as conn:
        conn.execute(update(scheduler_job).where(scheduler_job.c.job_id == job_id).values(values))


@pytest.mark.parametrize(
    ("send", "field"),
    [
        (lambda app: app.tasks["t.add"].apply_async((SECRET, 1), task_id=LONG), "task id"),
        (lambda app: app.tasks["t.add"].apply_async((SECRET, 1), queue=LONG), "queue"),
        (lambda app: app.send_task("t." + LONG, (SECRET, 1)), "task name"),
        (
            lambda app: app.tasks["t.add"].apply_async((SECRET, 1), ratchet={"business_key": LONG}),
            "business key",
        ),
        (lambda app: app.tasks["t.add"].apply_async((SECRET, 1), task_id="a\x00b"), "task id"),
        (lambda app: app.tasks["t.add"].apply_async((SECRET, 1), queue="q\x00"), "queue"),
        (lambda app: app.send_task("t.\x00add", (SECRET, 1)), "task name"),
    ],
)
def test_unstorable_ids_queues_names_and_keys_are_refused_at_send(
    client_app: Celery, send: Any, field: str
) -> None:
    with pytest.raises(InvalidJob) as raised:
        send(client_app)
    assert raised.value.field == field
    assert ("over the limit of 255" in str(raised.value)) or ("NUL" in str(raised.value))
    assert SECRET not in str(raised.value) and LONG not in str(raised.value)
    assert _store(client_app).count_by_status() == {}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"backoff_param": float("nan")}, "backoff_param"),
        ({"timeout": float("nan")}, "timeout"),
        ({"tags": "abc"}, "tags"),
        ({"max_retries": -2}, "max_retries"),
    ],
)
def test_options_that_cannot_be_honoured_are_refused_at_send(
    client_app: Celery, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidJob) as raised:
        client_app.tasks["t.add"].apply_async((SECRET, 1), ratchet=options)
    assert raised.value.field == field and SECRET not in str(raised.value)
    assert _store(client_app).count_by_status() == {}


def test_an_unknown_status_is_shown_as_unknown_everywhere(client_app: Celery) -> None:
    result = client_app.tasks["t.add"].delay(1, 2)
    client_app.tasks["t.add"].delay(3, 4)
    store = _store(client_app)
    _forge(store, result.id, status="BOGUS")

    assert result.state == UNKNOWN_STATE and not result.ready()
    runner = CliRunner()
    listed = runner.invoke(cli, ["--url", store.url, "jobs"])
    assert listed.exit_code == 0, listed.output
    assert "UNKNOWN(BOGUS)" in listed.output and "PENDING" in listed.output
    as_json = runner.invoke(cli, ["--url", store.url, "jobs", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert {j["status"] for j in json.loads(as_json.output)} == {"UNKNOWN(BOGUS)", "PENDING"}
    shown = runner.invoke(cli, ["--url", store.url, "jobs", "show", result.id])
    assert shown.exit_code == 0, shown.output
    assert "UNKNOWN(BOGUS)" in shown.output
    stats = runner.invoke(cli, ["--url", store.url, "stats"])
    assert stats.exit_code == 0, stats.output
    assert "UNKNOWN(BOGUS)" in stats.output


def test_tag_filters_match_the_tag_as_written(client_app: Celery) -> None:
    add = client_app.tasks["t.add"]
    add.apply_async((1, 1), ratchet={"tags": ["plain"]})
    add.apply_async((1, 1), ratchet={"tags": ["50%_off"]})
    url = _store(client_app).url
    runner = CliRunner()

    def tagged(tag: str) -> int:
        out = runner.invoke(cli, ["--url", url, "jobs", "--tag", tag, "--json"])
        assert out.exit_code == 0, out.output
        return len(json.loads(out.output))

    assert tagged("%") == 0 and tagged("_") == 0 and tagged("p%") == 0
    assert tagged("50%_off") == 1 and tagged("plain") == 1


def test_a_malformed_job_fails_and_the_rest_of_its_batch_runs(
    servers: Servers, dialect: str, broker_trap: BrokerTrap
) -> None:
    app = make_app(empty_store(servers.url(dialect)).url, broker_trap.url)
    store = _store(app)
    # Parked in a queue no worker reads while the rows are forged, then moved to one.
    results = [app.tasks["t.add"].apply_async((i, 1), queue="parked") for i in range(6)]
    legacy, mismatched = results[1], results[4]
    _forge(store, legacy.id, job_type="LEGACY")
    _forge(store, mismatched.id, headers=json.dumps({"id": "another", "task": "t.add"}))
    with store.engine.connect() as conn:
        conn.execute(update(scheduler_job).values(queue="celery"))
    with worker_running(app):
        for r in results:
            wait_until(lambda r=r: r.ready(), 60, f"job {r.id} to finish")
    for i, r in enumerate(results):
        if r in (legacy, mismatched):
            assert r.state == "FAILURE"
            error = r.get(propagate=False)
            assert isinstance(error, MalformedJob), error
        else:
            assert r.get(timeout=10) == i + 1
    counts = store.count_by_status()
    assert counts == {"SUCCEEDED": 4, "FAILED": 2}
    record = store.result(legacy.id)
    assert record is not None and record.status is JobStatus.FAILED
    assert "job_type 'LEGACY'" in (record.last_error or "")


#: Deeper than Python's JSON decoder recurses: decoding raises RecursionError. The
#: properties column holds 64 KB on MariaDB (TEXT): 30,000 levels there.
DEEP = {"headers": 100_000, "properties": 30_000, "payload": 100_000}


def test_rows_whose_json_nests_too_deep_fail_alone_and_the_rest_runs(
    servers: Servers, dialect: str, broker_trap: BrokerTrap
) -> None:
    app = make_app(empty_store(servers.url(dialect)).url, broker_trap.url)
    store = _store(app)
    results = [app.tasks["t.add"].apply_async((i, 1), queue="parked") for i in range(8)]
    deep = {column: results[1 + 2 * n] for n, column in enumerate(DEEP)}
    for column, sent in deep.items():
        nested = "[" * DEEP[column] + "]" * DEEP[column]
        _forge(store, sent.id, **{column: nested.encode() if column == "payload" else nested})
    with store.engine.connect() as conn:
        conn.execute(update(scheduler_job).values(queue="celery"))
    with worker_running(app):
        wait_until(lambda: store.count_by_status().get("SUCCEEDED", 0) == 5, 60, "5 good jobs")
        wait_until(lambda: store.count_by_status() == {"SUCCEEDED": 5, "FAILED": 3}, 30,
                   "the deep rows to fail")  # fmt: skip
    for i, r in enumerate(results):
        if r not in deep.values():
            assert r.get(timeout=10) == i + 1
    for column, sent in deep.items():
        record = store.result(sent.id)
        assert record is not None and record.status is JobStatus.FAILED
        error = json.loads(record.last_error or "{}")
        message = " ".join(error["exc_message"])
        if column == "payload":  # decoded as Celery decodes a message's body
            assert error["exc_type"] == "InvalidTaskError", error
            assert "DecodeError: maximum recursion depth exceeded" in message, message
        else:
            assert error["exc_type"] == "MalformedJob"
            assert f"its {column} column nests deeper than" in message, message


def test_a_url_with_a_bad_port_is_a_clear_error() -> None:
    out = CliRunner().invoke(cli, ["--url", "postgresql://u@127.0.0.1:notaport/db", "jobs"])
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output and "notaport" in out.output
    assert out.exception is None or isinstance(out.exception, SystemExit)


def test_no_url_and_no_store_file_says_so_and_creates_nothing(tmp_path: Path) -> None:
    runner = CliRunner(env={"RATCHET_URL": None})
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        out = runner.invoke(cli, ["jobs"])
        assert out.exit_code == 2, out.output
        assert "ratchet.db does not exist" in out.output and "--url" in out.output
        assert "no such table" not in out.output
        assert not (tmp_path / "ratchet.db").exists()
        created = runner.invoke(cli, ["schema", "apply"])
        assert created.exit_code == 0, created.output
        assert (tmp_path / "ratchet.db").exists()
        assert runner.invoke(cli, ["jobs"]).exit_code == 0
    finally:
        os.chdir(cwd)


def test_a_store_without_tables_says_how_to_make_them(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    out = CliRunner().invoke(cli, ["--url", f"sqlite:///{empty}", "jobs"])
    assert out.exit_code == 2, out.output
    assert "has no ratchet tables" in out.output and "schema apply" in out.output
    assert "cannot reach" not in out.output


@pytest.mark.parametrize("meta", ['"state"', "[1, 2]", "{not json", '{"state": "RETRY"}'])
def test_a_result_meta_written_by_hand_reads_as_no_state_not_an_error(
    client_app: Celery, meta: str
) -> None:
    # A row reported from outside (EXTERNAL) whose meta was forged: its state reads as the
    # row's own, never a raw error out of AsyncResult.
    store = _store(client_app)
    client_app.backend.store_result("forged-meta", {"hostname": "h"}, "PROGRESS")
    _forge(store, "forged-meta", result_meta=meta)
    result = client_app.AsyncResult("forged-meta")
    expected = "RETRY" if meta.startswith('{"state"') else "PENDING"
    assert result.state == expected and not result.ready()


#: A value no datetime holds, as each database can hold one (see tests/contract/
#: test_hostile_rows.py): PostgreSQL's infinity, MariaDB's zero date, text on SQLite.
UNREADABLE_TIME = {"postgresql": "infinity", "mysql": "0000-00-00 00:00:00", "sqlite": "garbage"}
DEEP_RECORD = "[" * 20_000 + "]" * 20_000


def test_rows_that_cannot_be_read_are_listed_on_every_page_and_command(
    client_app: Celery,
) -> None:
    """Unreadable times in each timestamp column of one row, and a failure record nesting
    deeper than the JSON decoder recurses in another: every page of the dashboard and
    every listing command shows them, and the rest."""
    add = client_app.tasks["t.add"]
    odd, deep, fine = (add.delay(i, i).id for i in range(3))
    store = _store(client_app)
    time = UNREADABLE_TIME[store.family]
    # Another client's session, on an engine of its own: a lax sql_mode set on a connection
    # of the store's pool would go back to that pool, shared by every later test of the
    # process for this URL, and let them write what a strict session refuses.
    other_client = create_engine(store.engine.url, isolation_level="AUTOCOMMIT")
    try:
        with other_client.connect() as conn:
            if store.family == "mysql":
                conn.exec_driver_sql("SET SESSION sql_mode = ''")  # as a client's default takes it
            conn.exec_driver_sql(
                "UPDATE scheduler_job SET status = 'FAILED', created_at = {t}, finished_at = {t}, "
                "claimed_at = {t}, started_at = {t} WHERE job_id = {j}".format(
                    t=f"'{time}'", j=f"'{odd}'"
                )
            )
    finally:
        other_client.dispose()
    _forge(store, deep, status="FAILED", last_error=DEEP_RECORD, headers=DEEP_RECORD)
    dashboard = Dashboard(store)
    pages = ["/", "/jobs", "/jobs?status=FAILED", "/tasks", "/task?name=t.add", "/queues",
             "/dlq", f"/job?id={odd}", f"/job?id={deep}", f"/job?id={fine}"]  # fmt: skip
    for page in pages:
        answer = call(dashboard, page)
        assert answer.status == 200, (page, answer.body[-500:])
    assert "unreadable" in call(dashboard, f"/job?id={odd}").body
    runner = CliRunner()
    for command in (["jobs"], ["jobs", "--json"], ["dlq", "list"], ["dlq", "show", deep],
                    ["jobs", "show", odd], ["stats"]):  # fmt: skip
        shown = runner.invoke(cli, ["--url", store.url, *command])
        assert shown.exit_code == 0, (command, shown.output[-1000:])
    listed = json.loads(runner.invoke(cli, ["--url", store.url, "jobs", "--json"]).output)
    assert {j["job_id"]: j["finished_at"] for j in listed}[odd] == "unreadable"
    assert client_app.AsyncResult(odd).state == "FAILURE"
    assert client_app.AsyncResult(odd).date_done is None
