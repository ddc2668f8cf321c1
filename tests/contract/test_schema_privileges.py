"""A database user that may not create tables: a clear error before the schema exists, and
an ordinary job store once an administrator has applied ddl/<dialect>.sql.

The role (PostgreSQL) or user (MariaDB) is made for this run only, with rights on this run's
own database only, and dropped at the end."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import SchemaNotCreated
from celery_ratchet.store.engine import engine_for
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import Servers
from tests.helpers import as_user, new_job

PASSWORD = "no-create-pw"


@dataclass
class Limited:
    dialect: str
    admin_url: str  # the run's server account, on the limited user's database
    url: str  # the limited user, on the same database


def _run(url: str, *statements: str) -> None:
    with engine_for(url).connect() as conn:
        for statement in statements:
            conn.execute(text(statement))


@pytest.fixture
def limited(servers: Servers, server_dialect: str) -> Iterator[Limited]:
    base = servers.url(server_dialect)
    server, _, database = base.rpartition("/")
    database += "_nocreate"
    user = f"ratchet_t{os.getpid()}_nocreate"
    admin_url = f"{server}/{database}"
    url = as_user(base, user, PASSWORD, database)
    if server_dialect == "postgresql":
        _run(
            base,
            f'DROP DATABASE IF EXISTS "{database}"',
            f'CREATE DATABASE "{database}"',
            f'DROP ROLE IF EXISTS "{user}"',
            f"CREATE ROLE \"{user}\" LOGIN PASSWORD '{PASSWORD}'",
            f'GRANT CONNECT ON DATABASE "{database}" TO "{user}"',
        )
        # PostgreSQL 15 grants no CREATE on schema public to other roles; say so anyway.
        _run(admin_url, f'REVOKE CREATE ON SCHEMA public FROM PUBLIC, "{user}"')
    else:
        _run(
            base,
            f"DROP DATABASE IF EXISTS `{database}`",
            f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4",
            *(f"DROP USER IF EXISTS '{user}'@'{host}'" for host in ("localhost", "127.0.0.1")),
            *(
                f"CREATE USER '{user}'@'{host}' IDENTIFIED BY '{PASSWORD}'"
                for host in ("localhost", "127.0.0.1")
            ),
            *(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{database}`.* TO '{user}'@'{host}'"
                for host in ("localhost", "127.0.0.1")
            ),
        )
    try:
        yield Limited(server_dialect, admin_url, url)
    finally:
        for each in (url, admin_url):
            engine_for(each).dispose()
        if server_dialect == "postgresql":
            _run(
                base,
                f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)',
                f'DROP ROLE IF EXISTS "{user}"',
            )
        else:
            _run(
                base,
                f"DROP DATABASE IF EXISTS `{database}`",
                *(f"DROP USER IF EXISTS '{user}'@'{host}'" for host in ("localhost", "127.0.0.1")),
            )


def _grant_rows(limited: Limited) -> None:
    """What the administrator does after applying the DDL: rights on rows, not on tables."""
    if limited.dialect == "postgresql":
        user = limited.url.partition("://")[2].partition(":")[0]
        _run(
            limited.admin_url,
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{user}"',
            f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{user}"',
        )


def _sender(url: str, **conf: object) -> Any:
    """A task of a Celery app on ``url``, to .delay() as a client would."""
    app = Celery("nocreate", task_cls="celery_ratchet:RatchetTask", set_as_current=False)
    app.conf.update(broker_url="amqp://guest:guest@127.0.0.1:1//", ratchet_url=url, **conf)

    @app.task(name=f"nocreate.add.{uuid.uuid4().hex}")
    def add(a: int, b: int) -> int:
        return a + b

    ratchet_state(app).reset()
    return add


def test_a_user_without_create_gets_a_clear_error(limited: Limited) -> None:
    dialect = "postgresql" if limited.dialect == "postgresql" else "mysql"
    with pytest.raises(SchemaNotCreated) as raised:
        JobStore(limited.url).enqueue(new_job("refused"))
    message = str(raised.value)
    assert f"ddl/{dialect}.sql" in message
    assert "ratchet_create_schema = False" in message
    assert "RATCHET_CREATE_SCHEMA" in message
    assert PASSWORD not in message

    # The same from a Celery client's first .delay().
    with pytest.raises(SchemaNotCreated, match=r"ratchet_create_schema = False"):
        _sender(limited.url).delay(1, 2)

    # Nothing was half made: every table is still missing.
    missing = JobStore(limited.admin_url, create_schema=False).schema_differences()
    assert all(p.startswith("missing table") for p in missing) and missing


def test_a_user_without_create_works_once_the_ddl_is_applied(limited: Limited) -> None:
    JobStore(limited.admin_url).ensure_schema()  # the administrator applies the schema
    _grant_rows(limited)
    for create_schema in (True, False):
        store = JobStore(limited.url, create_schema=create_schema)
        store.enqueue(new_job(f"job-{create_schema}"))
        [claimed] = store.claim("node-a", ["celery"], 10)
        assert claimed.job_id == f"job-{create_schema}"

    sent = _sender(limited.url, ratchet_create_schema=False).delay(1, 2)
    assert JobStore(limited.url, create_schema=False).result(sent.id) is not None
