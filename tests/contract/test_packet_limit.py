"""A result larger than a MySQL/MariaDB server takes in one statement (its max_allowed_packet)
fails its job at once with an error that names the limit and the setting: it is refused before
it is sent, never retried as an outage (the server drops the connection of a statement over
the limit, which reads as one), never the driver's OperationalError 1153.

On the shared server's own max_allowed_packet (16 MB), read, never changed."""

from __future__ import annotations

import pytest

from celery_ratchet.domain.job import JobStatus, Settlement, StoredResult
from celery_ratchet.errors import StatementTooLarge, StoreUnavailable
from celery_ratchet.store import packets, settle
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import Servers, empty_store
from tests.contract.test_jobstore import status_of
from tests.helpers import new_job

MB = 1 << 20


def _held(store: JobStore) -> tuple[str, str]:
    store.enqueue(new_job())
    [claimed] = store.claim("n", ["celery"], 1)
    return claimed.job_id, claimed.token


def _limit_named(refused: pytest.ExceptionInfo[StatementTooLarge], store: JobStore) -> None:
    message = str(refused.value)
    limit = packets.packet_limit(store.engine)
    assert limit is not None and f"max_allowed_packet = {limit}" in message, message
    assert "reference" in message, message
    assert not store.reachability.down


@pytest.fixture
def mariadb(servers: Servers) -> JobStore:
    return empty_store(servers.url("mysql"))


@pytest.mark.parametrize("size_mb", [20, 50])
def test_a_result_over_max_allowed_packet_is_refused_before_it_is_sent(
    mariadb: JobStore, size_mb: int
) -> None:
    job_id, token = _held(mariadb)
    result = '"' + "x" * (size_mb * MB) + '"'
    with pytest.raises(StatementTooLarge) as refused:
        mariadb.store_outcome(job_id, token, JobStatus.SUCCEEDED, job_result=result)
    _limit_named(refused, mariadb)
    # The settler's batch refuses it the same way (its writer then fails the job alone).
    outcome = Settlement(
        job_id, token, JobStatus.SUCCEEDED, result=StoredResult(result, "str", None)
    )
    with pytest.raises(StatementTooLarge):
        mariadb.settle([outcome])
    assert status_of(mariadb, job_id) is JobStatus.RUNNING
    # The store still takes what fits.
    mariadb.store_outcome(job_id, token, JobStatus.SUCCEEDED, job_result='"fits"')
    assert status_of(mariadb, job_id) is JobStatus.SUCCEEDED


def test_quotes_escaped_count_toward_the_limit(mariadb: JobStore) -> None:
    """A JSON result of 9 MB of quotes is sent as 18 MB: escaped, every quote doubles."""
    job_id, token = _held(mariadb)
    with pytest.raises(StatementTooLarge):
        mariadb.store_outcome(job_id, token, JobStatus.SUCCEEDED, job_result='"' * (9 * MB))


def test_a_statement_the_server_dropped_for_its_size_is_no_outage(
    mariadb: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent all the same (the check before sending bypassed): the server's 1153, or the
    connection it drops (2006/2013) for a statement over its limit, is the same refusal."""
    job_id, token = _held(mariadb)
    monkeypatch.setattr(settle, "refuse_oversized", lambda *args, **kwargs: None)
    for size_mb in (20, 50):
        with pytest.raises(StatementTooLarge) as refused:
            mariadb.store_outcome(
                job_id, token, JobStatus.SUCCEEDED, job_result="1" * (size_mb * MB)
            )
        assert not isinstance(refused.value, StoreUnavailable)
        _limit_named(refused, mariadb)
    monkeypatch.undo()
    mariadb.store_outcome(job_id, token, JobStatus.SUCCEEDED, job_result='"fits"')
    assert status_of(mariadb, job_id) is JobStatus.SUCCEEDED
