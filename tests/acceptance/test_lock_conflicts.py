"""Lock conflicts on MariaDB under a real worker: what Galera's certification failures look
like to a client (error 1213 at any statement of a transaction, the transaction rolled back).
Here a trigger of the run's own database raises the real error 1213 a set number of times,
counted in a MEMORY table (which a rolled-back statement does not undo).

A chord body whose send loses a conflict is sent again, once, with nothing logged as an error;
claims deferred by conflicts are no outage, and are not announced as one ending.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery, chord
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from tests.acceptance.conftest import Cluster, _app_on, side_effects, wait_until
from tests.conftest import Servers

pytestmark = pytest.mark.slow

DEADLOCK = (
    "SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, "
    "MESSAGE_TEXT = 'Deadlock found when trying to get lock; try restarting transaction'"
)


@pytest.fixture
def mariadb_app(servers: Servers) -> Iterator[Celery]:
    yield from _app_on(servers.url("mysql"))


@pytest.fixture
def mariadb_cluster(mariadb_app: Celery, tmp_path: Path) -> Iterator[Cluster]:
    found = Cluster(mariadb_app.conf.ratchet_url, tmp_path)
    yield found
    found.stop_all()


def conflicts(app: Celery, times: int, event: str, condition: str) -> Iterator[None]:
    """A trigger on scheduler_job that fails the first ``times`` matching rows with 1213."""
    engine = ratchet_state(app).store.engine
    with engine.connect() as conn:
        conn.execute(text("DROP TABLE IF EXISTS ratchet_test_faults"))
        conn.execute(text("CREATE TABLE ratchet_test_faults (remaining INT) ENGINE=MEMORY"))
        conn.execute(text("INSERT INTO ratchet_test_faults VALUES (:n)"), {"n": times})
        conn.execute(text("DROP TRIGGER IF EXISTS ratchet_test_conflict"))
        conn.exec_driver_sql(
            f"CREATE TRIGGER ratchet_test_conflict {event} ON scheduler_job FOR EACH ROW "
            f"BEGIN IF {condition} AND (SELECT remaining FROM ratchet_test_faults) > 0 THEN "
            "UPDATE ratchet_test_faults SET remaining = remaining - 1; "
            f"{DEADLOCK}; END IF; END"
        )
    yield
    with engine.connect() as conn:
        conn.execute(text("DROP TRIGGER IF EXISTS ratchet_test_conflict"))
        conn.execute(text("DROP TABLE IF EXISTS ratchet_test_faults"))


def remaining(app: Celery) -> int:
    with ratchet_state(app).store.engine.connect() as conn:
        return int(conn.execute(text("SELECT remaining FROM ratchet_test_faults")).scalar_one())


@pytest.fixture
def body_conflicts(mariadb_app: Celery) -> Iterator[None]:
    yield from conflicts(mariadb_app, 2, "BEFORE INSERT", "NEW.task_name = 'acc.chord_body'")


@pytest.fixture
def claim_conflicts(mariadb_app: Celery) -> Iterator[None]:
    # More than the store's own retries of one claim: the claim loop meets StoreBusy.
    yield from conflicts(
        mariadb_app, 8, "BEFORE UPDATE", "OLD.status = 'PENDING' AND NEW.status = 'RUNNING'"
    )


def test_a_chord_body_that_loses_a_lock_conflict_is_sent_again_once(
    mariadb_app: Celery, mariadb_cluster: Cluster, body_conflicts: None
) -> None:
    value, body = mariadb_app.tasks["acc.value"], mariadb_app.tasks["acc.chord_body"]
    key = f"chord-{uuid.uuid4().hex[:8]}"
    worker = mariadb_cluster.start("lc1", concurrency=2)
    result = chord(value.si(i) for i in range(10))(body.s(key))
    try:
        assert result.get(timeout=120) == sum(range(10))
    except Exception:
        print(mariadb_cluster.logs())
        raise
    assert remaining(mariadb_app) == 0, "the body's send never met its conflicts"
    store = ratchet_state(mariadb_app).store
    assert [k for k, _ in side_effects(store) if k == key] == [key]
    log = worker.log.read_text()
    assert "ERROR" not in log and "Traceback" not in log, log[-4000:]
    assert "not sent" not in log, log[-4000:]


def test_claims_deferred_by_lock_conflicts_are_not_an_outage(
    mariadb_app: Celery, mariadb_cluster: Cluster, claim_conflicts: None
) -> None:
    store = ratchet_state(mariadb_app).store
    worker = mariadb_cluster.start("lc2", concurrency=2)
    result = mariadb_app.tasks["acc.value"].delay(7)
    try:
        assert result.get(timeout=120) == 7
        wait_until(lambda: store.count_by_status() == {JobStatus.SUCCEEDED.value: 1}, 60, "the job")
    except Exception:
        print(mariadb_cluster.logs())
        raise
    assert remaining(mariadb_app) == 0, "the claims never met their conflicts"
    log = worker.log.read_text()
    assert "claim deferred" in log, log[-4000:]
    assert "reachable again" not in log, log[-4000:]
