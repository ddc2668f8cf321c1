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
