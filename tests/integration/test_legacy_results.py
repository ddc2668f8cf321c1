"""ratchet_legacy_result_backend_url: AsyncResult of a task sent before the cutover reads the
fleet's old result backend when the job store holds no such task; the store's own rows win."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import ConfigurationError
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job
from tests.integration.conftest import BrokerTrap, make_app


def old_backend(url: str) -> object:
    """The result backend of the fleet before the cutover: stock Celery's."""
    return Celery("old", backend=url, set_as_current=False).backend


@pytest.fixture
def old_url(tmp_path: Path) -> str:
    return f"db+sqlite:///{tmp_path / 'old-results.db'}"


def test_an_old_tasks_result_is_read_from_the_old_backend(
    store: JobStore, broker_trap: BrokerTrap, old_url: str
) -> None:
    old = old_backend(old_url)
    old.store_result("old-done", {"total": 42}, "SUCCESS")  # type: ignore[attr-defined]
    old.store_result("old-failed", ValueError("card declined"), "FAILURE")  # type: ignore[attr-defined]
    old.store_result("both", "the old world's", "SUCCESS")  # type: ignore[attr-defined]
    store.enqueue(new_job("both"))
    app = make_app(store.url, broker_trap.url, ratchet_legacy_result_backend_url=old_url)
    assert app.AsyncResult("old-done").get(timeout=10) == {"total": 42}
    failed = app.AsyncResult("old-failed")
    assert failed.state == "FAILURE"
    with pytest.raises(ValueError, match="card declined"):
        failed.get(timeout=10)
    assert app.AsyncResult("both").state == "PENDING"  # the store's row wins
    assert app.AsyncResult("never-sent").state == "PENDING"


def test_without_the_setting_an_old_id_is_pending(
    store: JobStore, broker_trap: BrokerTrap, old_url: str
) -> None:
    old_backend(old_url).store_result("old-done", 1, "SUCCESS")  # type: ignore[attr-defined]
    app = make_app(store.url, broker_trap.url)
    assert app.AsyncResult("old-done").state == "PENDING"


def test_an_old_redis_backend_is_read_too(store: JobStore, broker_trap: BrokerTrap) -> None:
    """The shared Redis, on keys of this test alone (deleted after): nothing is flushed."""
    url = "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url).ping()
    except redis.ConnectionError:
        pytest.skip("Redis is not reachable at 127.0.0.1:6379")
    task_id = f"old-{uuid.uuid4().hex}"
    old = old_backend(url)
    old.store_result(task_id, [1, 2, 3], "SUCCESS")  # type: ignore[attr-defined]
    try:
        app = make_app(store.url, broker_trap.url, ratchet_legacy_result_backend_url=url)
        assert app.AsyncResult(task_id).get(timeout=10) == [1, 2, 3]
    finally:
        old.forget(task_id)  # type: ignore[attr-defined]


def test_the_store_itself_is_refused_as_the_old_backend(
    store: JobStore, broker_trap: BrokerTrap
) -> None:
    app = make_app(store.url, broker_trap.url, ratchet_legacy_result_backend_url="ratchet://")
    assert ratchet_state(app).settings.legacy_result_backend_url == "ratchet://"
    with pytest.raises(ConfigurationError, match="the job store's own backend"):
        app.AsyncResult("old").state  # noqa: B018
