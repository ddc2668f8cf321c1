"""The retry decision and backoff arithmetic, per the seeds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_ratchet.domain.retry import (
    MAX_BACKOFF_SECONDS,
    Backoff,
    DoNotRetry,
    RetryPolicy,
    backoff_delay,
    decide,
    do_not_retry,
    is_do_not_retry,
)


@do_not_retry
class BadInput(ValueError):
    pass


class WorseInput(BadInput):
    pass


class Permanent(DoNotRetry):
    pass


def test_exponential_backoff_doubles_from_the_base() -> None:
    assert [backoff_delay(Backoff.EXPONENTIAL, 1.0, a) for a in (1, 2, 3, 4)] == [1, 2, 4, 8]


def test_exponential_backoff_is_capped_at_24_hours() -> None:
    assert backoff_delay(Backoff.EXPONENTIAL, 60.0, 20) == MAX_BACKOFF_SECONDS
    assert backoff_delay(Backoff.EXPONENTIAL, 1.0, 10_000) == MAX_BACKOFF_SECONDS


def test_fixed_and_none() -> None:
    assert backoff_delay(Backoff.FIXED, 2.5, 7) == 2.5
    assert backoff_delay(Backoff.NONE, 2.5, 7) == 0.0


@given(st.sampled_from(list(Backoff)), st.floats(0, 1e6), st.integers(1, 500))
def test_delays_are_never_negative_nor_over_the_cap(kind: Backoff, param: float, n: int) -> None:
    assert 0 <= backoff_delay(kind, param, n) <= MAX_BACKOFF_SECONDS


def test_backoff_names_parse_case_insensitively_and_refuse_others() -> None:
    assert Backoff.parse("Exponential") is Backoff.EXPONENTIAL
    with pytest.raises(ValueError, match="none, fixed, exponential"):
        Backoff.parse("linear")


def test_max_retries_3_retries_after_attempts_1_to_3_with_1_2_4_seconds() -> None:
    decisions = [
        decide(RuntimeError(), attempt=a, max_retries=3, backoff=Backoff.EXPONENTIAL)
        for a in (1, 2, 3, 4)
    ]
    assert [(d.retry, d.delay) for d in decisions] == [
        (True, 1.0), (True, 2.0), (True, 4.0), (False, 0.0),
    ]  # fmt: skip
    assert "exhausted" in decisions[-1].reason


def test_do_not_retry_marks_the_class_and_its_subclasses() -> None:
    assert is_do_not_retry(BadInput("x")) and is_do_not_retry(WorseInput)
    assert is_do_not_retry(Permanent()) and not is_do_not_retry(ValueError())
    decision = decide(WorseInput(), attempt=1, max_retries=10)
    assert not decision.retry and "do-not-retry" in decision.reason


def test_do_not_retry_refuses_what_is_not_an_exception_class() -> None:
    with pytest.raises(TypeError):
        do_not_retry(int)  # type: ignore[type-var]


class OnlyTimeouts(RetryPolicy):
    def should_retry(self, attempt: int, exc: BaseException) -> bool:
        return isinstance(exc, TimeoutError)

    def get_delay(self, attempt: int) -> float:
        return 30.0 if attempt == 1 else 0.0


def test_the_policy_may_refuse_and_may_set_the_delay_else_backoff_applies() -> None:
    assert not decide(KeyError(), attempt=1, max_retries=5, policy=OnlyTimeouts()).retry
    first = decide(TimeoutError(), attempt=1, max_retries=5, policy=OnlyTimeouts(),
                   backoff=Backoff.FIXED, backoff_param=3)  # fmt: skip
    second = decide(TimeoutError(), attempt=2, max_retries=5, policy=OnlyTimeouts(),
                    backoff=Backoff.FIXED, backoff_param=3)  # fmt: skip
    assert (first.delay, second.delay) == (30.0, 3.0)


def test_no_limit_retries_forever() -> None:
    assert decide(RuntimeError(), attempt=10_000, max_retries=None).retry
