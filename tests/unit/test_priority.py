"""Named priority levels and aging, with time passed in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from celery_ratchet.domain.priority import Priority, effective_priority, to_numeric

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


def test_levels_sit_two_steps_apart_on_celerys_scale() -> None:
    assert [int(p) for p in Priority] == [0, 2, 4, 6, 8]
    assert to_numeric("high") == 6 and to_numeric(Priority.CRITICAL) == 8 and to_numeric(7) == 7


def test_priorities_above_9_are_capped_and_bad_ones_refused() -> None:
    assert to_numeric(200) == 9
    for bad in (-1, "urgent", 2.5, True):
        with pytest.raises(ValueError, match="priority"):
            to_numeric(bad)


def test_each_boost_interval_waited_raises_one_level() -> None:
    low = int(Priority.LOW)
    assert effective_priority(low, T0, T0 + timedelta(minutes=14), 15) == low
    assert effective_priority(low, T0, T0 + timedelta(minutes=15), 15) == int(Priority.NORMAL)
    assert effective_priority(low, T0, T0 + timedelta(minutes=31), 15) == int(Priority.HIGH)


def test_zero_interval_disables_aging_and_future_jobs_are_not_boosted() -> None:
    assert effective_priority(2, T0, T0 + timedelta(days=1), 0) == 2
    assert effective_priority(2, T0, T0 - timedelta(hours=1), 15) == 2
