"""How a group's jobs reach the database: the statements, not only the rows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery, group
from sqlalchemy import event

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import DuplicateJob
from celery_ratchet.store import row_writer
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app

PARKED = "parked"  # no worker consumes it: the rows stay as written


@pytest.fixture
def client_app(servers: Servers, dialect: str, broker_trap: BrokerTrap) -> Celery:
    url = servers.url(dialect)
    empty_store(url)
    return make_app(url, broker_trap.url)


@contextmanager
def statements(app: Celery) -> Iterator[list[tuple[str, bool, int]]]:
    """Each statement SQLAlchemy runs on the store's engine meanwhile: its text, whether it
    is an executemany, and how many parameter sets it carries."""
    seen: list[tuple[str, bool, int]] = []
    engine = ratchet_state(app).store.engine

    def record(conn: Any, cursor: Any, sql: str, params: Any, context: Any, many: bool) -> None:
        seen.append((sql, many, len(params) if many else 1))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _pending(app: Celery) -> int:
    return ratchet_state(app).store.count_by_status().get("PENDING", 0)


def test_a_group_of_a_generator_records_its_group_once_however_many_members(
    client_app: Celery,
) -> None:
    add = client_app.tasks["t.add"]
    with statements(client_app) as seen:
        result = group(add.s(i, i).set(queue=PARKED) for i in range(30)).apply_async()
    group_rows = [sql for sql, _, _ in seen if "scheduler_batch" in sql and "INSERT" in sql]
    assert len(group_rows) == 1, group_rows
    assert len(result.results) == 30
    assert _pending(client_app) == 30


def test_a_group_of_a_list_is_written_in_one_copy_or_pipelined_chunks(
    client_app: Celery, dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    add = client_app.tasks["t.add"]
    # PostgreSQL's rows go in one COPY, SQLite's in chunks through the driver's executemany
    # (store/raw.py): past SQLAlchemy's cursor events, they are seen where the store hands
    # them over.
    driven: list[tuple[str, int]] = []
    real_many, real_copy = row_writer.execute_many_on, row_writer.copy_in_on

    def execute_many_on(conn: Any, statement: Any, rows: Any) -> None:
        driven.append((statement.sql, len(rows)))
        real_many(conn, statement, rows)

    def copy_in_on(conn: Any, sql: str, rows: Any) -> None:
        driven.append((sql, len(rows)))
        real_copy(conn, sql, rows)

    monkeypatch.setattr(row_writer, "execute_many_on", execute_many_on)
    monkeypatch.setattr(row_writer, "copy_in_on", copy_in_on)
    with statements(client_app) as seen:
        group([add.s(i, i).set(queue=PARKED) for i in range(250)]).apply_async()
    inserts = [(many, n) for sql, many, n in seen if sql.startswith("INSERT INTO scheduler_job")]
    written = [(sql.split(" (")[0], n) for sql, n in driven]
    if dialect == "postgresql":
        assert written == [("COPY scheduler_job", 250)]
        assert inserts == []
    elif dialect == "sqlite":
        assert written == [("INSERT INTO scheduler_job", n) for n in (100, 100, 50)]
        assert inserts == []
    else:  # MySQL writes multi-row VALUES statements instead
        assert written == []
    assert _pending(client_app) == 250


def test_a_group_of_a_list_written_in_chunks_is_stored_whole_or_not_at_all(
    client_app: Celery,
) -> None:
    add = client_app.tasks["t.add"]
    taken = add.apply_async((0, 0), queue=PARKED).id
    members = [add.s(i, i).set(queue=PARKED) for i in range(249)]
    members.append(add.s(1, 1).set(queue=PARKED, task_id=taken))
    with pytest.raises(DuplicateJob):
        group(members).apply_async()
    assert _pending(client_app) == 1
