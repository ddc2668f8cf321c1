"""A deadlock MySQL/MariaDB (or Galera's certification) end by rolling the whole
transaction back reaches the code as the savepoint that is gone (1305): it is the deadlock
that decides whether the work is tried again (see store/db_errors.py)."""

from __future__ import annotations

import pymysql
from sqlalchemy.exc import OperationalError

from celery_ratchet.store.db_errors import is_retryable_conflict


def _chained(outer: OperationalError, inner: BaseException) -> OperationalError:
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 (the chain as SQLAlchemy's savepoint rollback makes it)
    except OperationalError as raised:
        return raised


def test_a_savepoint_lost_to_a_deadlock_is_a_retryable_conflict() -> None:
    deadlock = OperationalError(
        "INSERT", None, pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
    )
    lost = OperationalError(
        "ROLLBACK TO SAVEPOINT",
        None,
        pymysql.err.OperationalError(1305, "SAVEPOINT sa_2 does not exist"),
    )
    assert is_retryable_conflict(_chained(lost, deadlock))


def test_a_savepoint_lost_to_anything_else_is_not() -> None:
    refused = OperationalError(
        "INSERT", None, pymysql.err.OperationalError(1366, "Incorrect value")
    )
    lost = OperationalError(
        "ROLLBACK TO SAVEPOINT", None, pymysql.err.OperationalError(1305, "gone")
    )
    assert not is_retryable_conflict(_chained(lost, refused))
    assert not is_retryable_conflict(lost)


def test_an_error_inside_a_savepoint_on_a_lost_connection_is_the_error_raised() -> None:
    """The connection cut inside a savepoint (a statement deadline, a server that ended it):
    rolling back to the savepoint is not tried, so the caller sees the error that cut it, a
    lost connection its retry policy knows, not SQLAlchemy's PendingRollbackError (which
    stopped a broker import run in CI instead of trying its work again)."""
    import pytest
    from sqlalchemy import create_engine

    from celery_ratchet.store.engine import savepoint, transaction

    cut = OperationalError("COPY", None, Exception("server closed the connection"))
    engine = create_engine("sqlite://", isolation_level="AUTOCOMMIT")
    with (
        engine.connect() as conn,
        pytest.raises(OperationalError) as raised,
        transaction(conn),
        savepoint(conn),
    ):
        conn.invalidate()
        raise cut
    assert raised.value is cut
