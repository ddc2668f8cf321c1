"""A dashboard whose database user may only read (a PostgreSQL role, a MariaDB user with
SELECT alone): the pages answer; an action, or a worker's page (a control row), is a page
naming the privilege missing and its table, from the store's own error: never the driver's,
never a statement's parameters, never a 500.

The role or user is made for the test, with SELECT on this run's database alone, and dropped
after it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import text

from celery_ratchet.domain.job import JobStatus
from celery_ratchet.errors import RatchetError, StorePermissionDenied
from celery_ratchet.store.engine import engine_for
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.web.app import Dashboard
from tests.conftest import Servers
from tests.helpers import as_user
from tests.integration.test_web import call, post, seeded

PASSWORD = "select-only-pw"
HOSTS = ("localhost", "127.0.0.1")


@dataclass
class Reader:
    dialect: str
    admin: JobStore  # the run's account: may do anything
    url: str  # the reader: SELECT only


def _run(url: str, *statements: str) -> None:
    with engine_for(url).connect() as conn:
        for statement in statements:
            conn.execute(text(statement))
        conn.commit()


@pytest.fixture
def reader(servers: Servers, server_dialect: str) -> Iterator[Reader]:
    admin_url = servers.url(server_dialect)
    admin = seeded(admin_url)
    database = admin_url.rpartition("/")[2]
    user = f"ratchet_t{os.getpid()}_ro_{uuid.uuid4().hex[:6]}"
    url = as_user(admin_url, user, PASSWORD)
    if server_dialect == "postgresql":
        _run(
            admin_url,
            f"CREATE ROLE \"{user}\" LOGIN PASSWORD '{PASSWORD}'",
            f'GRANT CONNECT ON DATABASE "{database}" TO "{user}"',
            f'GRANT USAGE ON SCHEMA public TO "{user}"',
            f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{user}"',
        )
    else:
        _run(
            admin_url,
            *(f"CREATE USER '{user}'@'{h}' IDENTIFIED BY '{PASSWORD}'" for h in HOSTS),
            *(f"GRANT SELECT ON `{database}`.* TO '{user}'@'{h}'" for h in HOSTS),
        )
    try:
        yield Reader(server_dialect, admin, url)
    finally:
        engine_for(url).dispose()
        if server_dialect == "postgresql":
            _run(admin_url, f'DROP OWNED BY "{user}"', f'DROP ROLE IF EXISTS "{user}"')
        else:
            _run(admin_url, *(f"DROP USER IF EXISTS '{user}'@'{h}'" for h in HOSTS))


def _named(message: str, privilege: str, table: str) -> None:
    assert privilege in message and table in message, message
    assert "bad-1" not in message and "node-1" not in message, message  # no parameters
    assert PASSWORD not in message and "Traceback" not in message, message
    assert "psycopg" not in message and "pymysql" not in message, message


def test_the_store_names_the_privilege_its_user_lacks(reader: Reader) -> None:
    store = JobStore(reader.url)
    assert store.result("bad-1") is not None  # reading is allowed
    with pytest.raises(StorePermissionDenied) as raised:
        store.retry_failed(["bad-1"])
    assert isinstance(raised.value, RatchetError)
    _named(str(raised.value), "UPDATE", "scheduler_job")
    assert reader.admin.result("bad-1").status is JobStatus.FAILED  # type: ignore[union-attr]


def test_a_dashboard_on_a_select_only_user_names_the_missing_privilege(reader: Reader) -> None:
    app = Dashboard(JobStore(reader.url))
    app.workers.timeout = 0.1
    for path in ("/", "/jobs", "/dlq", "/schedules", "/queues", "/job?id=bad-1"):
        assert call(app, path).status == 200, path

    retried = post(app, "/dlq/retry", job_id="bad-1")
    assert retried.status == 403, retried.body
    _named(retried.body, "UPDATE", "scheduler_job")
    assert "--read-only" in retried.body

    cancelled = post(app, "/jobs/cancel", job_id="waiting", confirmed="yes")
    assert cancelled.status == 403
    _named(cancelled.body, "UPDATE", "scheduler_job")

    asked = call(app, "/node?id=node-1")  # asks the worker: a control row
    assert asked.status == 403, asked.body
    _named(asked.body, "INSERT", "scheduler_control")
    assert reader.admin.result("bad-1").status is JobStatus.FAILED  # type: ignore[union-attr]
