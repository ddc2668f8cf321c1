"""A server's limits on a statement (time, lock waits) are the store's errors, not the
driver's: a statement the server ended is no outage, and nothing of it is lost."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text

from celery_ratchet.domain.job import NewJob
from celery_ratchet.errors import StatementCancelled, StoreBusy, StoreUnavailable
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import Servers, empty_store
from tests.helpers import new_job

#: Per dialect: how the store's own connections get a short limit on statement time, and
#: the lock that keeps its statements waiting past it.
_TIME_LIMIT = {
    "postgresql": "options=-c%20statement_timeout%3D300",
    "mysql": "init_command=SET%20SESSION%20max_statement_time%3D0.3",
}
_TABLE_LOCK = {
    "postgresql": "LOCK TABLE scheduler_job IN ACCESS EXCLUSIVE MODE",
    "mysql": "LOCK TABLES scheduler_job WRITE",
}


def _with_query(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


@contextmanager
def _table_locked(store: JobStore, dialect: str) -> Iterator[None]:
    """Another client holds a lock on the job table until the block ends."""
    engine = create_engine(store.engine.url)
    try:
        with engine.connect() as conn:
            conn.execute(text(_TABLE_LOCK[dialect]))
            try:
                yield
            finally:
                if dialect == "mysql":
                    conn.execute(text("UNLOCK TABLES"))
                conn.rollback()
    finally:
        engine.dispose()


def _limited(servers: Servers, dialect: str, query: str) -> tuple[JobStore, JobStore]:
    """A store with its schema in place, and a second on the same database whose
    connections carry ``query`` (its schema checked before any lock is taken)."""
    plain = empty_store(servers.url(dialect))
    limited = JobStore(_with_query(servers.url(dialect), query))
    limited.ensure_schema()
    return plain, limited


def _sent_again_is_stored_once(plain: JobStore, limited: JobStore, job: NewJob) -> None:
    """Nothing half-written: sent again once the lock is gone, the job is there once."""
    limited.enqueue_many([job])
    assert [j.job_id for j in plain.claim("n", ["celery"], 10)] == [job.job_id]


def test_a_send_past_the_servers_time_limit_is_cancelled_not_an_outage_and_loses_nothing(
    servers: Servers, server_dialect: str
) -> None:
    plain, limited = _limited(servers, server_dialect, _TIME_LIMIT[server_dialect])
    job = new_job()
    with _table_locked(plain, server_dialect), pytest.raises(StatementCancelled) as refused:
        limited.enqueue_many([job])
    message = str(refused.value)
    assert not isinstance(refused.value, StoreUnavailable)
    assert "nothing of it was committed" in message and "no job was enqueued" in message
    setting = "statement_timeout" if server_dialect == "postgresql" else "max_statement_time"
    assert setting in message
    assert "SELECT" not in message and "INSERT" not in message and job.job_id not in message
    assert not limited.reachability.down
    _sent_again_is_stored_once(plain, limited, job)


def test_a_claim_past_the_servers_time_limit_is_cancelled_and_the_job_stays_claimable(
    servers: Servers, server_dialect: str
) -> None:
    plain, limited = _limited(servers, server_dialect, _TIME_LIMIT[server_dialect])
    job = new_job()
    plain.enqueue_many([job])
    with _table_locked(plain, server_dialect), pytest.raises(StatementCancelled):
        limited.claim("n", ["celery"], 10)
    assert [j.job_id for j in limited.claim("n", ["celery"], 10)] == [job.job_id]


def test_a_lock_timeout_on_postgresql_is_a_lock_conflict_retried_then_store_busy(
    servers: Servers,
) -> None:
    plain, limited = _limited(servers, "postgresql", "options=-c%20lock_timeout%3D100")
    job = new_job()
    with _table_locked(plain, "postgresql"), pytest.raises(StoreBusy) as busy:
        limited.enqueue_many([job])
    assert not isinstance(busy.value, StatementCancelled)
    assert "lock" in str(busy.value) and "no job was enqueued" in str(busy.value)
    _sent_again_is_stored_once(plain, limited, job)
