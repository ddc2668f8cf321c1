"""A connection that times out is an outage, whatever subclass of the driver's
OperationalError says so (see store/db_errors.py)."""

from __future__ import annotations

import psycopg
from sqlalchemy.exc import OperationalError

from celery_ratchet.store.db_errors import is_unavailable


def test_a_connect_timeout_is_an_outage() -> None:
    timeout = OperationalError("connect", None, psycopg.errors.ConnectionTimeout("timed out"))
    assert is_unavailable(timeout)
    plain = OperationalError("connect", None, psycopg.OperationalError("connection refused"))
    assert is_unavailable(plain)


def test_a_lock_wait_that_ran_out_is_no_outage() -> None:
    busy = psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    assert not is_unavailable(OperationalError("update", None, busy))


def test_a_full_disk_is_a_refused_statement_not_a_lost_reply() -> None:
    """The errors the servers gave with their disk full (tests/acceptance/test_disk_full.py
    fills one): PostgreSQL's disk_full, MariaDB's 1114, and errno 28 carried by MySQL."""
    from pymysql.err import OperationalError as MySQLOperationalError

    from celery_ratchet.errors import StoreFull
    from celery_ratchet.store.db_errors import is_disk_full, unavailable

    full = [
        psycopg.errors.DiskFull('could not extend file "base/5/16443": No space left on device'),
        MySQLOperationalError(1114, "The table 'scheduler_job' is full"),
        MySQLOperationalError(1021, "Disk full (/var/tmp/#sql_1.MAI); waiting for someone"),
        MySQLOperationalError(1030, 'Got error 28 "No space left on device" from storage engine'),
        MySQLOperationalError(3, "Error writing file '/tmp/MY1' (Errcode: 28)"),
    ]
    for orig in full:
        exc = OperationalError("INSERT", None, orig)
        assert is_disk_full(exc) and is_unavailable(exc), orig
        error = unavailable("postgresql://u:pw@db/x", exc, "no job was enqueued", sent=False)
        assert isinstance(error, StoreFull) and not error.outcome_unknown
        assert "has no space left" in str(error) and "pw" not in str(error)
    other_errno = MySQLOperationalError(1030, "Got error 5 from storage engine")
    assert not is_disk_full(OperationalError("INSERT", None, other_errno))


def test_a_missing_privilege_is_named_with_its_table_never_the_statement() -> None:
    """The servers' words for it (tests/integration/test_web_privileges.py meets them on
    real servers): PostgreSQL names the object (the statement says the command), MariaDB
    the command and the table; a sequence or a schema needs USAGE."""
    from pymysql.err import OperationalError as MySQLOperationalError
    from sqlalchemy.exc import ProgrammingError

    from celery_ratchet.errors import StorePermissionDenied
    from celery_ratchet.store.db_errors import is_permission_denied, permission_denied

    denied = psycopg.errors.InsufficientPrivilege
    cases = [
        ("UPDATE scheduler_job SET status=%(s)s",
         denied("permission denied for table scheduler_job"),
         "the UPDATE privilege on table scheduler_job"),
        ("INSERT INTO scheduler_control (a) VALUES (%(a)s)",
         denied("permission denied for table scheduler_control"),
         "the INSERT privilege on table scheduler_control"),
        ("INSERT INTO scheduler_job (a) VALUES (%(a)s)",
         denied("permission denied for sequence scheduler_job_id_seq"),
         "the USAGE privilege on sequence scheduler_job_id_seq"),
        ("DELETE FROM scheduler_job_log",
         MySQLOperationalError(1142, "DELETE command denied to user 'ro'@'localhost' for "
                                     "table `shop`.`scheduler_job_log`"),
         "the DELETE privilege on table scheduler_job_log"),
    ]  # fmt: skip
    for statement, orig, named in cases:
        exc = ProgrammingError(statement, {"s": "secret-arg"}, orig, hide_parameters=True)
        assert is_permission_denied(exc) and is_permission_denied(orig), orig
        error = permission_denied("mysql://ro:pw@db/shop", exc, "no job was requeued")
        assert isinstance(error, StorePermissionDenied) and not error.outcome_unknown
        message = str(error)
        assert named in message and message.endswith("no job was requeued"), message
        assert "secret-arg" not in message and "pw@" not in message and "%(" not in message
    lock = psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    assert not is_permission_denied(OperationalError("update", None, lock))
