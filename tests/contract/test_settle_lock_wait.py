"""Writing outcomes with a bounded wait on locks: the worker's settler must not wait as long
as another transaction keeps one job row locked (see runtime/outcomes.py)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, text

from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.errors import StoreBusy
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job


def _lock_wait_setting(store: JobStore) -> str:
    with store.engine.connect() as conn:
        if store.family == "postgresql":
            return str(conn.exec_driver_sql("SHOW lock_timeout").scalar())
        return str(conn.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout").scalar())


def test_a_locked_row_makes_a_bounded_settle_busy_and_the_store_s_own_connections_wait_as_before(
    server_store: JobStore,
) -> None:
    store = server_store
    store.enqueue_many([new_job("locked"), new_job("free")])
    claimed = {j.job_id: j for j in store.claim("n", ["celery"], 2)}
    before = _lock_wait_setting(store)
    locked = Settlement("locked", claimed["locked"].token, JobStatus.SUCCEEDED)
    free = Settlement("free", claimed["free"].token, JobStatus.SUCCEEDED)
    side = store.engine.connect()
    try:
        side.exec_driver_sql("BEGIN")  # the store's connections commit each statement
        side.execute(text("SELECT job_id FROM scheduler_job WHERE job_id = 'locked' FOR UPDATE"))
        with pytest.raises(StoreBusy) as raised:
            store.settle([free, locked], lock_wait=0.2, retry_conflicts=False)
        assert claimed["locked"].token not in str(raised.value)
        assert store.count_by_status() == {"RUNNING": 2}  # all or nothing
        if store.family == "postgresql":
            # Alone, the free row is written while the lock is held. (InnoDB locks each row
            # its scan reads, and on a table of two rows the scan reads both.)
            assert store.settle([free], lock_wait=0.2, retry_conflicts=False) == 1
        # The limit is the bounded connections' own: the store's others wait as the server says.
        assert _lock_wait_setting(store) == before
    finally:
        side.exec_driver_sql("ROLLBACK")
        side.close()
    store.settle([free, locked], lock_wait=0.2)
    assert store.count_by_status() == {"SUCCEEDED": 2}


def test_one_outcome_is_looked_up_by_its_job_id(server_store: JobStore) -> None:
    """A settle of one plain outcome reads its own row only. On MariaDB a one-claim row IN
    went through no index on job_id: on a table of 20,000 finished jobs it read every RUNNING
    row through another index, locking each, and so waited on whichever another transaction
    kept locked. The statement sent is explained here: it must use the job id's index."""
    store = server_store
    store.enqueue_many([new_job(f"r{i:02d}") for i in range(40)])
    running = {j.job_id: j for j in store.claim("n", ["celery"], 40)}
    engine = store.db.lock_bounded_engine(0.2) or store.engine
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE"):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        one = Settlement("r10", running["r10"].token, JobStatus.SUCCEEDED)
        assert store.settle([one], lock_wait=0.2, retry_conflicts=False) == 1
    finally:
        event.remove(engine, "before_cursor_execute", record)
    if store.family != "mysql":
        return  # PostgreSQL's one statement over unnest: tests/contract/test_settle_plans.py
    assert sent
    with store.engine.connect() as conn:
        for statement, parameters in sent:
            plan = conn.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
            assert [row["key"] for row in plan] == ["ux_scheduler_job_job_id"], plan
