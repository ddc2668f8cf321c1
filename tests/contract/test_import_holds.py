"""Moving a broker's messages: a run stopped inside its write does not hold the rows for good."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import func, select

from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job
from tests.helpers import new_job


def test_a_run_stopped_inside_its_write_frees_the_rows_it_holds(
    server_store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import run stopped (Ctrl-Z) after writing its batch but before committing holds the
    new ids' rows locked. A run that takes over the same messages waited on them until its
    statement deadline cut the connection, and then failed (once in CI). The server now ends
    a move's transaction left idle past a few seconds, so the second run writes the jobs; the
    first, continued, finds them present and writes nothing twice."""
    moved: list[tuple[Any, list[Any]]] = [(new_job(), []) for _ in range(5)]
    ids = {job.job_id for job, _ in moved}
    first = JobStore(server_store.url)
    second = JobStore(server_store.url)
    inside = threading.Event()
    resume = threading.Event()
    write_steps = first.enqueuer._insert_waiting

    def stopped(conn: Any, steps: Any) -> None:
        write_steps(conn, steps)
        inside.set()
        resume.wait(120)

    monkeypatch.setattr(first.enqueuer, "_insert_waiting", stopped)
    outcome: dict[str, Any] = {}

    def run_first() -> None:
        try:
            outcome["present"] = first.import_jobs(moved)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run_first, daemon=True)
    thread.start()
    try:
        assert inside.wait(60), "the first run did not reach its write"
        assert second.import_jobs(moved) == set()
    finally:
        resume.set()
        thread.join(120)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["present"] == ids
    with server_store.engine.connect() as conn:
        count = conn.execute(
            select(func.count()).where(scheduler_job.c.job_id.in_(sorted(ids)))
        ).scalar()
    assert count == len(ids)
    first.engine.dispose()
    second.engine.dispose()


def test_a_move_leaves_no_idle_limit_on_the_pooled_connection(server_store: JobStore) -> None:
    """MariaDB's limit on an idle transaction is a session setting: set for a move, it stayed
    on the pooled connection, and any later transaction of the process left idle for 5 s on
    it was ended by the server."""
    store = JobStore(server_store.url)
    try:
        assert store.import_jobs([(new_job(), [])]) == set()
        with store.engine.connect() as conn:
            if conn.dialect.name != "mysql" or not getattr(conn.dialect, "is_mariadb", False):
                pytest.skip("only MariaDB sets the limit for the session")
            limit = conn.exec_driver_sql("SELECT @@SESSION.idle_transaction_timeout").scalar()
        assert limit == 0
    finally:
        store.engine.dispose()
