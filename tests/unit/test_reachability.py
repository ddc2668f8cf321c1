"""An outage of the job store is logged once when it starts and once when it ends."""

from __future__ import annotations

import logging

import pytest

from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.store.database import Reachability


def test_an_outage_is_two_lines_however_many_statements_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reachability = Reachability("postgresql://app:***@db/shop")
    with caplog.at_level(logging.DEBUG, logger="celery_ratchet.store.database"):
        reachability.succeeded()
        for _ in range(50):
            reachability.failed(StoreUnavailable("cannot reach the job store at …"))
        assert reachability.down
        for _ in range(3):
            reachability.succeeded()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0][0] == lines[1][0] == logging.WARNING
    assert "is unreachable: cannot reach the job store" in lines[0][1]
    assert "postgresql://app:***@db/shop is reachable again after" in lines[1][1]
    assert not reachability.down
