"""The circuit breaker's state machine, with time passed in."""

from __future__ import annotations

import pytest

from celery_ratchet.domain.breaker import BreakerConfig, BreakerState, CircuitBreaker


def breaker(**config: float) -> CircuitBreaker:
    return CircuitBreaker(BreakerConfig(**config))  # type: ignore[arg-type]


def test_opens_when_the_failure_rate_reaches_the_threshold_over_enough_calls() -> None:
    cb = breaker(failure_rate=0.5, window=10, open_seconds=30, minimum_calls=4)
    for failed in (True, True, True):
        cb.record(failed, now=0)
    assert cb.state is BreakerState.CLOSED  # 3 calls: too few to judge
    cb.record(False, now=1)
    cb.record(False, now=1)
    cb.record(False, now=1)
    assert cb.state is BreakerState.OPEN and cb.opened_until == 31  # 3 of 4 failed

    cb = breaker(failure_rate=0.5, window=10, minimum_calls=4)
    for failed in (False, False, True, False, True):
        cb.record(failed, now=0)
    assert cb.state is BreakerState.CLOSED  # 2 of 5
    cb.record(True, now=2)
    assert cb.state is BreakerState.OPEN  # 3 of 6


def test_the_window_slides_old_outcomes_out() -> None:
    cb = breaker(failure_rate=0.75, window=4, minimum_calls=4)
    for failed in (False, True, True, False):
        cb.record(failed, 0)
    assert cb.state is BreakerState.CLOSED and cb.failure_rate() == 0.5
    cb.record(True, 0)  # the first False leaves the window: 3 of 4
    assert cb.state is BreakerState.OPEN


def test_open_defers_until_half_open_then_one_probe_goes_through() -> None:
    cb = breaker(failure_rate=0.5, window=2, open_seconds=30, minimum_calls=2)
    cb.record(True, 0)
    cb.record(True, 0)
    assert cb.defer_until(10) == 30
    assert cb.defer_until(30) is None  # the probe
    assert cb.state is BreakerState.HALF_OPEN
    waiting = cb.defer_until(31)
    assert waiting is not None and 31 < waiting <= 32  # others wait for the probe


def test_a_successful_probe_closes_and_a_failed_one_reopens() -> None:
    cb = breaker(failure_rate=0.5, window=2, open_seconds=30, minimum_calls=2)
    cb.record(True, 0), cb.record(True, 0)
    cb.defer_until(30)
    cb.record(True, 31, probe=True)
    assert cb.state is BreakerState.OPEN and cb.opened_until == 61
    cb.defer_until(61)
    cb.record(False, 62, probe=True)
    assert cb.state is BreakerState.CLOSED and cb.failure_rate() == 0
    assert cb.defer_until(62) is None


def test_a_lost_probe_is_replaced_after_open_seconds() -> None:
    cb = breaker(window=1, open_seconds=5, minimum_calls=1)
    cb.record(True, 0)
    assert cb.defer_until(5) is None
    assert cb.defer_until(6) is not None
    assert cb.defer_until(10) is None  # the first probe never reported: try another


def test_outcomes_of_jobs_started_before_opening_do_not_count() -> None:
    cb = breaker(window=2, open_seconds=5, minimum_calls=2)
    cb.record(True, 0), cb.record(True, 0)
    cb.record(False, 1)
    assert cb.state is BreakerState.OPEN


def test_invalid_configuration_is_refused() -> None:
    for bad in ({"failure_rate": 0}, {"window": 0}, {"open_seconds": 0},
                {"window": 5, "minimum_calls": 6}):  # fmt: skip
        with pytest.raises(ValueError):
            BreakerConfig(**bad)  # type: ignore[arg-type]


def test_while_half_open_only_the_probe_decides() -> None:
    cb = breaker(window=2, open_seconds=5, minimum_calls=2)
    cb.record(True, 0), cb.record(True, 0)
    assert cb.defer_until(5) is None  # the probe
    cb.record(False, 5.5)  # a job started before the breaker opened, finishing late
    cb.record(True, 5.6)
    assert cb.state is BreakerState.HALF_OPEN
    cb.record(False, 6, probe=True)
    assert cb.state is BreakerState.CLOSED
