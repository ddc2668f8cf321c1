"""Values the job store cannot hold are refused before any write, naming the field and the
limit; no error or log line of the store carries a statement's parameters (job arguments)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import create_engine, insert, select, text
from sqlalchemy.exc import DBAPIError

from celery_ratchet.errors import InvalidJob, SchemaMissing, ValueRefused
from celery_ratchet.store.engine import build_engine, normalize_url
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job
from tests.conftest import Servers, empty_store
from tests.helpers import new_job

SECRET = "4111111111111111"
LONG = "x" * 300


def _secret_job(job_id: str = "card", **fields: Any) -> Any:
    job = new_job(job_id)
    body = json.dumps([[SECRET], {}, {}]).encode()
    return replace(job, message=replace(job.message, payload=body), **fields)


@pytest.mark.parametrize(
    ("fields", "label", "limit"),
    [
        ({"job_id": LONG}, "task id", 255),
        ({"queue": LONG}, "queue", 255),
        ({"task_name": LONG}, "task name", 255),
        ({"business_key": LONG}, "business key", 255),
        ({"resource": LONG}, "resource", 255),
        ({"group_id": LONG}, "group id", 255),
    ],
)
def test_over_long_fields_are_refused_naming_field_and_limit(
    store: JobStore, fields: dict[str, str], label: str, limit: int
) -> None:
    with pytest.raises(InvalidJob) as raised:
        store.enqueue(_secret_job(**fields))
    message = str(raised.value)
    assert raised.value.field == label
    assert f"the {label} is 300 characters, over the limit of {limit}" in message
    assert SECRET not in message and LONG not in message
    assert store.count_by_status() == {}


@pytest.mark.parametrize(
    ("fields", "label"),
    [
        ({"job_id": "a\x00b"}, "task id"),
        ({"queue": "q\x00"}, "queue"),
        ({"task_name": "t\x00.add"}, "task name"),
        ({"tags": ("ok", "n\x00ul")}, "tag"),
        ({"job_id": "lone \udc80"}, "task id"),
    ],
)
def test_unstorable_characters_are_refused(
    store: JobStore, fields: dict[str, Any], label: str
) -> None:
    with pytest.raises(InvalidJob) as raised:
        store.enqueue(_secret_job(**fields))
    assert raised.value.field == label
    assert SECRET not in str(raised.value)
    assert store.count_by_status() == {}


def test_a_batch_with_one_bad_job_writes_none(store: JobStore) -> None:
    with pytest.raises(InvalidJob):
        store.enqueue_many([new_job("fine"), _secret_job(queue=LONG)])
    assert store.count_by_status() == {}


def _raw_row(**values: Any) -> dict[str, Any]:
    row = {
        "job_id": "raw", "task_name": "tests.add", "queue": "celery", "status": "PENDING",
        "job_type": "SINGLE", "priority": 4, "attempts": 0, "claims": 0,
        "payload": json.dumps([[SECRET], {}, {}]).encode(), "content_type": "application/json",
        "content_encoding": "utf-8", "headers": json.dumps({"id": "raw", "note": SECRET}),
        "properties": "{}",
    }  # fmt: skip
    row.update(values)
    return row


def _insert_raw(store: JobStore, **values: Any) -> None:
    stmt = insert(scheduler_job).values(
        **_raw_row(**values),
        scheduled_time=text("CURRENT_TIMESTAMP"),
        created_at=text("CURRENT_TIMESTAMP"),
    )
    store.db.run(lambda conn: conn.execute(stmt), "the test row was not written")


def test_driver_errors_never_carry_statement_parameters(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    _insert_raw(store)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DBAPIError) as raised:
        _insert_raw(store)  # the same job id again
    assert "parameters hidden" in str(raised.value)
    assert SECRET not in str(raised.value) and SECRET not in caplog.text


def test_a_value_the_server_refuses_is_a_ratchet_error_without_parameters(
    server_store: JobStore,
) -> None:
    # Connections of an engine of the test's own, as the store makes them: the engine kept
    # for the URL is shared by every test of the process, and one that left a session
    # setting on a pooled connection would decide what the server refuses here.
    store = JobStore(server_store.url, engine=build_engine(server_store.url))
    try:
        if store.family == "mysql":
            mode = store.db.run(lambda c: c.execute(text("SELECT @@SESSION.sql_mode")).scalar(), "")
            assert "STRICT_TRANS_TABLES" in str(mode).split(",")
        with pytest.raises(ValueRefused) as raised:
            _insert_raw(store, queue=LONG)
    finally:
        store.engine.dispose()
    message = str(raised.value)
    assert "refused a value" in message and "the test row was not written" in message
    assert SECRET not in message and LONG not in message
    assert SECRET not in str(raised.value.__cause__)


def test_mysql_connections_are_strict_whatever_the_server_default(servers: Servers) -> None:
    # A server whose default sql_mode is lax, seen through this session's init command: the
    # shared server's own settings are never touched.
    lax = servers.url("mysql") + "?init_command=SET+SESSION+sql_mode%3D%27%27"
    empty_store(servers.url("mysql"))
    plain = create_engine(normalize_url(lax), isolation_level="AUTOCOMMIT")
    try:
        with plain.connect() as conn:
            assert conn.execute(text("SELECT @@SESSION.sql_mode")).scalar() == ""
            conn.execute(
                insert(scheduler_job).values(
                    **_raw_row(job_id="cut", queue=LONG),
                    scheduled_time=text("UTC_TIMESTAMP()"),
                    created_at=text("UTC_TIMESTAMP()"),
                )
            )
            cut = conn.execute(select(scheduler_job.c.queue).where(scheduler_job.c.job_id == "cut"))
            assert len(cut.scalar_one()) == 255  # what a lax session does: a silent cut
    finally:
        plain.dispose()
    store = JobStore(lax)
    try:
        mode = store.db.run(
            lambda conn: conn.execute(text("SELECT @@SESSION.sql_mode")).scalar(), ""
        )
        assert "STRICT_TRANS_TABLES" in str(mode).split(",")
        with pytest.raises(ValueRefused, match="Data too long for column 'queue'"):
            _insert_raw(store, queue=LONG)
        with pytest.raises(InvalidJob, match="over the limit of 255"):
            store.enqueue(new_job("long", queue=LONG))
    finally:
        store.engine.dispose()


def test_a_missing_table_is_schema_missing_not_an_outage(store: JobStore) -> None:
    with pytest.raises(SchemaMissing, match=r"has no ratchet tables.*schema apply"):
        store.db.run(lambda conn: conn.execute(text("SELECT job_id FROM scheduler_nothing")), "x")


def test_a_row_over_mysqls_packet_is_refused_not_taken_for_an_outage(servers: Servers) -> None:
    store = empty_store(servers.url("mysql"))
    (packet,) = store.engine.connect().execute(text("SELECT @@max_allowed_packet")).one()
    oversized = replace(new_job("big"), message=replace(new_job().message, payload=b"x" * packet))
    with pytest.raises(InvalidJob, match=r"max_allowed_packet.*pass a reference") as raised:
        store.enqueue_many([oversized])
    assert raised.value.field == "payload" and "xxxx" not in str(raised.value)
    store.enqueue_many([new_job("after")])  # the store goes on
    assert store.result("big") is None and store.result("after") is not None


def test_a_batch_larger_than_mysqls_packet_is_written_in_several_statements(
    servers: Servers,
) -> None:
    store = empty_store(servers.url("mysql"))
    (packet,) = store.engine.connect().execute(text("SELECT @@max_allowed_packet")).one()
    row = 95 * 1024
    count = packet // row + 20  # together over one packet; each well within it
    jobs = [
        replace(new_job(f"j{i}"), message=replace(new_job().message, payload=b"x" * row))
        for i in range(count)
    ]
    store.enqueue_many(jobs)
    assert store.count_by_status() == {"PENDING": count}
