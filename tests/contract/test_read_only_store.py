"""A read-only server (a standby, a primary a failover demoted, read-only transactions) is an
outage for the store, as one it cannot reach: every write raises StoreUnavailable, saying that
nothing was written, never the driver's InternalError nor a refused value; the worker keeps
what it could not write and tries it again, so nothing is dropped and no job is handed back
to run a second time.

The store's connections are made read-only by their own session settings (PostgreSQL's
default_transaction_read_only, MariaDB's SET SESSION TRANSACTION READ ONLY): no setting of
the shared server changes. A server started read-only (MariaDB's --read-only, error 1290) and
a database turned read-only under running workers are in tests/acceptance/test_read_only.py.
"""

from __future__ import annotations

import pytest
from sqlalchemy import event

from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import Servers, empty_store
from tests.contract.test_jobstore import status_of
from tests.helpers import new_job

#: Per dialect: the query that makes every connection of a store read-only.
_READ_ONLY = {
    "postgresql": "options=-c%20default_transaction_read_only%3Don",
    "mysql": "init_command=SET%20SESSION%20TRANSACTION%20READ%20ONLY",
}


def _read_only_twin(servers: Servers, dialect: str) -> tuple[JobStore, JobStore]:
    """A store with its schema in place, and a second on the same database whose
    connections may only read."""
    url = servers.url(dialect)
    plain = empty_store(url)
    query = _READ_ONLY[dialect]
    read_only = JobStore(f"{url}{'&' if '?' in url else '?'}{query}", create_schema=False)
    return plain, read_only


def _an_outage_that_wrote_nothing(raised: pytest.ExceptionInfo[StoreUnavailable]) -> None:
    message = str(raised.value)
    assert "read-only" in message or "read only" in message.lower(), message
    assert not raised.value.outcome_unknown, "a refused write cannot have been committed"
    assert "may have been committed" not in message


def test_every_write_to_a_read_only_server_is_an_outage_that_wrote_nothing(
    servers: Servers, server_dialect: str
) -> None:
    plain, read_only = _read_only_twin(servers, server_dialect)
    job = new_job()

    with pytest.raises(StoreUnavailable) as sent:
        read_only.enqueue_many([job])
    _an_outage_that_wrote_nothing(sent)
    assert "no job was enqueued" in str(sent.value)
    assert read_only.reachability.down

    plain.enqueue_many([job])
    with pytest.raises(StoreUnavailable) as claimed:
        read_only.claim("n", ["celery"], 10)
    _an_outage_that_wrote_nothing(claimed)

    [held] = plain.claim("n", ["celery"], 10)
    outcome = Settlement(held.job_id, held.token, JobStatus.SUCCEEDED)
    with pytest.raises(StoreUnavailable) as settled:
        read_only.settle([outcome])
    _an_outage_that_wrote_nothing(settled)

    plain.register_node("n", "host", 1, ["celery"], 1)
    with pytest.raises(StoreUnavailable):
        read_only.heartbeat("n")

    # Nothing of it was written: the job is still held by its claim, and its outcome, kept,
    # is written once the store takes writes.
    assert status_of(plain, held.job_id) is JobStatus.RUNNING
    plain.settle([outcome])
    assert status_of(plain, held.job_id) is JobStatus.SUCCEEDED


def test_a_read_only_connection_is_dropped_not_kept_in_the_pool(
    servers: Servers, server_dialect: str
) -> None:
    """Sessions of a read-only server stay read-only (a primary demoted, a standby): the
    pool drops each connection that met it, so that each try connects anew, through the
    driver's own execution (the claim) as through SQLAlchemy's (the heartbeat)."""
    plain, read_only = _read_only_twin(servers, server_dialect)
    plain.enqueue_many([new_job()])
    plain.register_node("n", "host", 1, ["celery"], 1)
    connects = []
    event.listen(read_only.engine, "connect", lambda *_: connects.append(1))
    for write in (lambda: read_only.claim("n", ["celery"], 10), lambda: read_only.heartbeat("n")):
        for _ in range(2):
            made = len(connects)
            with pytest.raises(StoreUnavailable):
                write()
            assert len(connects) > made, "a read-only connection was kept for the next try"
