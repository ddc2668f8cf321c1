"""A node's clock against the database's: the offset, the warning, and what is reckoned on it."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest

from celery_ratchet.domain.clock import offset_seconds, skew_to_report
from celery_ratchet.runtime.node_clock import NodeClock

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_the_offset_is_the_largest_the_read_allows_so_nothing_is_reckoned_early() -> None:
    db_time = T0 + timedelta(seconds=300, milliseconds=10)
    assert offset_seconds(T0, db_time) == pytest.approx(300.01)
    assert offset_seconds(T0, T0 - timedelta(seconds=600)) == pytest.approx(-600.0)


def test_an_offset_is_reported_once_beyond_the_bound_and_again_when_it_moves() -> None:
    assert not skew_to_report(4.9, 5.0, None)
    assert skew_to_report(-5.1, 5.0, None)
    assert not skew_to_report(300.0, 5.0, 300.0)
    assert not skew_to_report(302.4, 5.0, 300.0)
    assert skew_to_report(302.6, 5.0, 300.0)
    assert not skew_to_report(3600.0, 0.0, None)  # 0: never


class FixedOffset:
    """A database whose clock is ``offset`` seconds ahead of this process's."""

    def __init__(self, offset: float) -> None:
        self.offset = offset
        self.reads = 0

    def database_time(self) -> datetime:
        self.reads += 1
        return datetime.now(timezone.utc) + timedelta(seconds=self.offset)


def test_the_clock_is_the_database_s_and_says_once_how_far_off_this_node_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    database = FixedOffset(300.0)
    clock = NodeClock(database, warn_beyond=5.0)
    with caplog.at_level(logging.WARNING, logger="celery_ratchet.runtime.node_clock"):
        reckoned = clock.now()
        clock.now()
        clock.measure()
    expected = datetime.now(timezone.utc) + timedelta(seconds=300)
    assert abs((reckoned - expected).total_seconds()) < 1
    assert database.reads == 2  # measured once for both now()s, then when asked
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "300.0s behind the database's" in warnings[0]
    database.offset = -30.0
    with caplog.at_level(logging.WARNING, logger="celery_ratchet.runtime.node_clock"):
        clock.measure()
    assert "30.0s ahead of the database's" in caplog.records[-1].getMessage()


def test_a_database_that_cannot_be_read_leaves_the_node_s_own_clock() -> None:
    class Down:
        def database_time(self) -> datetime:
            raise ConnectionError("down")

    clock = NodeClock(Down(), warn_beyond=5.0)
    assert abs((clock.now() - datetime.now(timezone.utc)).total_seconds()) < 1
    assert clock.offset is None


def test_the_offset_is_measured_again_once_a_minute_by_the_clock_it_is_given() -> None:
    from tests.unit.runtime_fakes import FakeClock

    ticking = FakeClock(T0)

    class Ahead:
        reads = 0

        def database_time(self) -> datetime:
            Ahead.reads += 1
            return ticking.now() + timedelta(seconds=120)

    clock = NodeClock(Ahead(), warn_beyond=0.0, clock=ticking)
    assert clock.now() == T0 + timedelta(seconds=120)
    ticking.advance(59)
    clock.now()
    assert Ahead.reads == 1
    ticking.advance(2)
    assert clock.now() == T0 + timedelta(seconds=181)
    assert Ahead.reads == 2
