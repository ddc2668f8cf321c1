"""Jobs written in the caller's own transaction: there if and only if it commits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, group
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import ConfigurationError, DuplicateJob
from celery_ratchet.store.engine import normalize_url
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app, worker_running

SEEN: dict[str, bool] = {}


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def shop(
    request: pytest.FixtureRequest, servers: Servers, broker_trap: BrokerTrap
) -> Iterator[tuple[Celery, Engine]]:
    url = empty_store(servers.url(request.param)).url
    engine = create_engine(normalize_url(url))  # the application's own engine
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS shop_order"))
        conn.execute(text("CREATE TABLE shop_order (id VARCHAR(64) PRIMARY KEY)"))
    app = make_app(url, broker_trap.url)

    @app.task(name="shop.ship", shared=False)
    def ship(order_id: str) -> bool:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT count(*) FROM shop_order WHERE id = :i"), {"i": order_id}
            ).scalar_one()
        SEEN[order_id] = bool(found)
        return bool(found)

    with worker_running(app):
        yield app, engine
    engine.dispose()


def stored(app: Celery, task_id: str) -> Any:
    return ratchet_state(app).store.result(task_id)


def test_a_job_exists_once_the_business_data_commits_and_never_runs_before(
    shop: tuple[Celery, Engine],
) -> None:
    app, engine = shop
    order = uuid.uuid4().hex
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO shop_order (id) VALUES (:i)"), {"i": order})
        with celery_ratchet.transaction(conn):
            result = app.tasks["shop.ship"].delay(order)
        assert stored(app, result.id) is None, "the job is visible before the commit"
        time.sleep(0.5)  # a worker polling meanwhile finds nothing to run
        assert order not in SEEN
    assert result.get(timeout=30) is True  # it ran after the commit, and saw the order


def test_a_rolled_back_transaction_leaves_no_job(shop: tuple[Celery, Engine]) -> None:
    app, engine = shop
    order = uuid.uuid4().hex
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute(text("INSERT INTO shop_order (id) VALUES (:i)"), {"i": order})
        with celery_ratchet.transaction(conn):
            result = app.tasks["shop.ship"].delay(order)
            batch = group(app.tasks["shop.ship"].s(order) for _ in range(3)).apply_async()
        raise RuntimeError("payment declined")
    assert stored(app, result.id) is None
    assert all(stored(app, r.id) is None for r in batch.results)


def test_a_session_and_a_group_commit_together(shop: tuple[Celery, Engine]) -> None:
    app, engine = shop
    orders = [uuid.uuid4().hex for _ in range(3)]
    with Session(engine) as session, session.begin():
        for order in orders:
            session.execute(text("INSERT INTO shop_order (id) VALUES (:i)"), {"i": order})
        with celery_ratchet.transaction(session):
            batch = group(app.tasks["shop.ship"].s(o) for o in orders).apply_async()
    assert batch.get(timeout=30) == [True, True, True]


def test_a_taken_task_id_raises_without_spoiling_the_callers_transaction(
    shop: tuple[Celery, Engine],
) -> None:
    app, engine = shop
    order, task_id = uuid.uuid4().hex, uuid.uuid4().hex
    app.tasks["shop.ship"].apply_async(("x",), task_id=task_id, countdown=3600)
    with engine.begin() as conn:
        with pytest.raises(DuplicateJob), celery_ratchet.transaction(conn):
            app.tasks["shop.ship"].apply_async((order,), task_id=task_id)
        conn.execute(text("INSERT INTO shop_order (id) VALUES (:i)"), {"i": order})
    with engine.connect() as conn:
        count = conn.execute(text("SELECT count(*) FROM shop_order WHERE id = :i"), {"i": order})
        assert count.scalar_one() == 1


def test_a_connection_to_another_database_is_refused(
    shop: tuple[Celery, Engine], tmp_path: Any
) -> None:
    app, _ = shop
    other = create_engine(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    refused = pytest.raises(ConfigurationError, match="job store's database")
    with other.begin() as conn, refused, celery_ratchet.transaction(conn):
        app.tasks["shop.ship"].delay("nope")


def test_missing_tables_are_a_clear_error_not_ddl_inside_the_callers_transaction(
    tmp_path: Any, broker_trap: BrokerTrap
) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    app = make_app(url, broker_trap.url)
    engine = create_engine(url)
    with engine.begin() as conn, pytest.raises(ConfigurationError, match="schema apply"):
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
        with celery_ratchet.transaction(conn):
            app.tasks["t.add"].delay(1, 2)
