"""A read-only dashboard writes nothing to the job store: every action, and every page that
would write (a worker's page asks the worker through a control row), is refused with a 403
page naming read-only mode; the pages that only read answer as usual."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.web.app import Dashboard
from celery_ratchet.web.pages import PAGES
from tests.integration.test_web import call, post, seeded

#: A query each page needs to show something of the seeded store.
QUERIES = {"/job": "id=bad-1", "/task": "name=tests.add", "/batch": "id=batch-1",
           "/node": "id=node-1"}  # fmt: skip
#: Every field an action may read, so that none stops at a missing one before acting.
FORM = {
    "job_id": "bad-1",
    "task": "tests.fail",
    "key": "nightly",
    "queue": "slow",
    "node": "w1@host-a",
    "node_id": "node-1",
    "n": "2",
    "max": "4",
    "min": "1",
    "rate": "10/m",
    "soft": "5",
    "hard": "10",
    "confirmed": "yes",
}
_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE|MERGE|CREATE|DROP|ALTER|TRUNCATE)\b", re.I)


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return seeded(f"sqlite:///{tmp_path / 'web.db'}")


@contextmanager
def writes(store: JobStore) -> Iterator[list[str]]:
    """Every statement that writes, sent on the store's connections meanwhile."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if _WRITE.match(statement):
            seen.append(statement.split("(")[0][:60])

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


def read_only_dashboard(store: JobStore) -> Dashboard:
    app = Dashboard(store, read_only=True)
    app.workers.timeout = 0.1
    return app


#: Every action's path (a test below checks that none is left out).
ACTIONS = (
    "/jobs/cancel", "/jobs/terminate", "/dlq/retry", "/dlq/retry-task", "/dlq/purge",
    "/schedules/pause", "/schedules/resume", "/schedules/run", "/schedules/remove",
    "/queues/purge", "/queues/pause", "/queues/resume", "/nodes/pool-grow", "/nodes/pool-shrink",
    "/nodes/autoscale",
    "/nodes/add-consumer", "/nodes/cancel-consumer", "/nodes/shutdown", "/tasks/rate-limit",
    "/tasks/time-limit",
)  # fmt: skip


def test_the_actions_tested_are_all_of_them(store: JobStore) -> None:
    assert Dashboard(store).actions.paths == set(ACTIONS)


@pytest.mark.parametrize("path", ACTIONS)
def test_every_action_is_refused_with_a_403_naming_read_only_mode(
    store: JobStore, path: str
) -> None:
    app = read_only_dashboard(store)
    with writes(store) as written:
        answer = post(app, path, **FORM)
        without_token = call(app, path, method="POST", form=FORM)
    for refused in (answer, without_token):
        assert refused.status == 403 and "read-only mode" in refused.body, refused.body
        assert f"{path} would write to the job store" in refused.body
    assert written == []
    assert store.result("bad-1").status is JobStatus.FAILED  # type: ignore[union-attr]


@pytest.mark.parametrize("path", sorted(PAGES))
def test_every_page_writes_nothing_and_one_that_would_is_refused_naming_read_only_mode(
    store: JobStore, path: str
) -> None:
    app = read_only_dashboard(store)
    with writes(store) as written:
        answer = call(app, f"{path}?{QUERIES.get(path, '')}")
    assert written == [], f"{path} wrote {written}"
    if path == "/node":  # it asks the worker itself: a control row
        assert answer.status == 403, answer.body
        assert "read-only mode" in answer.body and "asking a worker" in answer.body
    else:
        assert answer.status == 200, answer.body


def test_metrics_write_nothing_in_read_only_mode(store: JobStore) -> None:
    app = read_only_dashboard(store)
    with writes(store) as written:
        assert call(app, "/metrics").status == 200
    assert written == []


def test_the_same_pages_and_actions_write_when_not_read_only(store: JobStore) -> None:
    """The statements the tests above look for are the ones the dashboard sends."""
    app = Dashboard(store)
    app.workers.timeout = 0.1
    with writes(store) as written:
        assert call(app, "/node?id=node-1").status == 200
    assert any("scheduler_control" in w for w in written), written
    with writes(store) as written:
        assert post(app, "/dlq/retry", job_id="bad-1").status == 303
    assert written
