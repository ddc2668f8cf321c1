"""Misfire planning and interval schedules, with time passed in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from celery_ratchet.domain.schedule import (
    CronSchedule,
    IntervalSchedule,
    MisfireAction,
    MisfirePolicy,
    plan,
    schedule_from_text,
)

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
EVERY_MINUTE = CronSchedule("0 * * * * ?")


def minutes(*offsets: int) -> tuple[datetime, ...]:
    return tuple(T0 + timedelta(minutes=m) for m in offsets)


@pytest.mark.parametrize(
    "policy", [MisfirePolicy.catch_up(3), MisfirePolicy.fire_once(), MisfirePolicy.skip()]
)
def test_a_single_overdue_occurrence_always_runs(policy: MisfirePolicy) -> None:
    result = plan(EVERY_MINUTE, due=T0, now=T0 + timedelta(seconds=20), policy=policy)
    assert (result.fire, result.next_due) == (minutes(0), T0 + timedelta(minutes=1))


def test_catch_up_fires_the_oldest_up_to_its_limit_then_resumes_in_the_future() -> None:
    now = T0 + timedelta(minutes=10, seconds=5)  # 11 fire times overdue: 12:00 … 12:10
    result = plan(EVERY_MINUTE, T0, now, MisfirePolicy.catch_up(3))
    assert result.fire == minutes(0, 1, 2)
    assert result.next_due == T0 + timedelta(minutes=11)
    assert result.skipped == 8


def test_default_catch_up_is_eleven_in_total() -> None:
    result = plan(EVERY_MINUTE, T0, T0 + timedelta(hours=2), MisfirePolicy())
    assert result.fire == minutes(*range(11))
    assert result.next_due == T0 + timedelta(hours=2, minutes=1)


def test_catch_up_of_a_short_backlog_fires_all_of_it() -> None:
    result = plan(EVERY_MINUTE, T0, T0 + timedelta(minutes=2), MisfirePolicy.catch_up(5))
    assert result.fire == minutes(0, 1, 2)
    assert result.next_due == T0 + timedelta(minutes=3)


def test_fire_once_fires_only_the_oldest() -> None:
    result = plan(EVERY_MINUTE, T0, T0 + timedelta(minutes=30), MisfirePolicy.fire_once())
    assert (result.fire, result.next_due) == (minutes(0), T0 + timedelta(minutes=31))


def test_skip_fires_nothing_and_resumes_in_the_future() -> None:
    result = plan(EVERY_MINUTE, T0, T0 + timedelta(minutes=30), MisfirePolicy.skip())
    assert (result.fire, result.next_due, result.skipped) == ((), T0 + timedelta(minutes=31), 31)


def test_an_exhausted_schedule_has_no_next_due() -> None:
    once = CronSchedule("0 0 12 1 6 ? 2026")
    assert plan(once, T0, T0 + timedelta(seconds=1), MisfirePolicy()) == (
        plan(once, T0, T0 + timedelta(seconds=1), MisfirePolicy())
    )
    result = plan(once, T0, T0 + timedelta(seconds=1), MisfirePolicy())
    assert (result.fire, result.next_due) == (minutes(0), None)


def test_interval_schedules_count_from_their_anchor() -> None:
    every = IntervalSchedule(90, anchor=T0)
    assert every.next_after(T0) == T0 + timedelta(seconds=90)
    assert every.next_after(T0 + timedelta(seconds=100)) == T0 + timedelta(seconds=180)
    assert every.next_after(T0 - timedelta(seconds=1)) == T0
    with pytest.raises(ValueError, match="positive"):
        IntervalSchedule(0)


def test_schedules_and_policies_round_trip_as_text() -> None:
    assert schedule_from_text("cron:0 0 2 * * ?", "Europe/London") == CronSchedule(
        "0 0 2 * * ?", "Europe/London"
    )
    assert schedule_from_text("every:30") == IntervalSchedule(30)
    for policy in (MisfirePolicy.catch_up(3), MisfirePolicy.fire_once(), MisfirePolicy.skip()):
        assert MisfirePolicy.from_text(policy.to_text()) == policy
    assert MisfirePolicy.named("fire_once").action is MisfireAction.FIRE_ONCE
    with pytest.raises(ValueError, match="unknown misfire policy"):
        MisfirePolicy.named("sometimes")
    with pytest.raises(ValueError, match="at least 1"):
        MisfirePolicy.catch_up(0)


def test_sub_second_intervals_always_move_forward() -> None:
    every = IntervalSchedule(0.1, anchor=T0)
    moment = T0
    for _ in range(100):
        nxt = every.next_after(moment)
        assert nxt is not None and nxt > moment
        moment = nxt
    assert schedule_from_text(IntervalSchedule(1036861.5).to_text()) == IntervalSchedule(1036861.5)
