"""The job store writing on a DB-API connection lent by its owner (Django's): the rows are in
the owner's transaction, and only the owner commits, rolls back or closes."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from celery_ratchet.errors import ConfigurationError, DuplicateJob
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import Servers, empty_store
from tests.helpers import new_job


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-psycopg2"])
def owned(request: pytest.FixtureRequest, servers: Servers) -> Iterator[tuple[JobStore, Any]]:
    dialect, _, driver = request.param.partition("-")
    url = servers.url(dialect)
    store = empty_store(url)
    parsed = make_url(url)
    raw: Any
    if dialect == "sqlite":
        raw = sqlite3.connect(parsed.database, isolation_level=None)
        raw.execute("BEGIN")
    elif driver == "psycopg2":  # Django's connection, where Django runs on psycopg2
        import psycopg2

        raw = psycopg2.connect(
            host=parsed.host, port=parsed.port, dbname=parsed.database, user=parsed.username
        )
    else:
        import psycopg

        raw = psycopg.connect(
            host=parsed.host, port=parsed.port, dbname=parsed.database, user=parsed.username
        )
    yield store, raw
    raw.close()


def _where(store: JobStore) -> dict[str, Any]:
    url = store.engine.url
    return {"host": url.host, "port": url.port, "database": url.database}


def _owners(store: JobStore) -> dict[str, Any]:
    """What lend() is told of the owner's connection to the store's own database."""
    return dict(_where(store), described_as="the owner's", remedy="fix it")


def _job_ids(store: JobStore) -> list[str]:
    with store.engine.connect() as conn:
        return [r[0] for r in conn.exec_driver_sql("SELECT job_id FROM scheduler_job")]


def test_jobs_written_on_a_lent_connection_commit_and_roll_back_with_its_owner(
    owned: tuple[JobStore, Any],
) -> None:
    from celery_ratchet.store.lent import lend

    store, raw = owned
    where = _owners(store)
    with lend(raw, **where) as conn:
        store.enqueue_within(conn, [new_job("rolled-back")])
    assert _job_ids(store) == []  # closing the lent connection committed nothing
    raw.rollback()
    assert _job_ids(store) == []

    if isinstance(raw, sqlite3.Connection):
        raw.execute("BEGIN")
    with lend(raw, **where) as conn:
        store.enqueue_within(conn, [new_job("kept")])
    raw.commit()
    assert _job_ids(store) == ["kept"]
    raw.cursor().execute("SELECT 1")  # still open: only its owner closes it


def test_a_lent_connection_to_another_database_is_refused_with_its_owners_words(
    owned: tuple[JobStore, Any],
) -> None:
    from celery_ratchet.store.lent import lend

    store, raw = owned
    where = dict(_where(store), database="elsewhere")
    with (
        lend(raw, **where, described_as="the shop's database", remedy="use the other one") as conn,
        pytest.raises(ConfigurationError, match=r"the shop.s database is to .*; use the other one"),
    ):
        store.enqueue_within(conn, [new_job()])
    raw.rollback()
    assert _job_ids(store) == []


def test_a_taken_id_on_a_lent_connection_raises_duplicate_job_and_spares_the_owners_work(
    owned: tuple[JobStore, Any],
) -> None:
    from celery_ratchet.store.lent import lend

    store, raw = owned
    with lend(raw, **_owners(store)) as conn:
        store.enqueue_within(conn, [new_job("first")])
        with pytest.raises(DuplicateJob, match="first"):
            store.enqueue_within(conn, [new_job("first")])
        store.enqueue_within(conn, [new_job("second")])
    raw.commit()
    assert sorted(_job_ids(store)) == ["first", "second"]
