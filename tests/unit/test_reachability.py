"""An outage of the job store is logged once when it starts and once when it ends."""

from __future__ import annotations

import logging
import time

import pytest

from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.store.database import Reachability


def test_an_outage_is_two_lines_however_many_statements_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reachability = Reachability("postgresql://app:***@db/shop")
    with caplog.at_level(logging.DEBUG, logger="celery_ratchet.store.database"):
        reachability.succeeded(time.monotonic())
        for _ in range(50):
            reachability.failed(StoreUnavailable("cannot reach the job store at …"))
        assert reachability.down
        for _ in range(3):
            reachability.succeeded(time.monotonic())
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0][0] == lines[1][0] == logging.WARNING
    assert "is unreachable: cannot reach the job store" in lines[0][1]
    assert "postgresql://app:***@db/shop is reachable again after" in lines[1][1]
    assert not reachability.down


def test_a_statement_begun_before_the_outage_does_not_end_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One thread's statement answers just as the server goes away, after another thread's
    failed: the outage goes on, and is said to end once (found by a worker of two threads
    logging "reachable again after 0.0s" between a crash and its restart)."""
    reachability = Reachability("postgresql://app:***@db/shop")
    begun_before = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="celery_ratchet.store.database"):
        reachability.failed(StoreUnavailable("cannot reach the job store at …"))
        reachability.succeeded(begun_before)
        assert reachability.down
        reachability.succeeded(time.monotonic())
    assert not reachability.down
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "ratchet: the job store is unreachable: c",
        "ratchet: the job store at postgresql://a",
    ]
