"""Which progress reports a batch owes: each whole percent reached once, in order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from celery_ratchet.domain.batch import (
    next_progress_report,
    percent_reached,
    progress_report_id,
    progress_reports_due,
)


def test_a_batch_of_ten_reports_each_tenth() -> None:
    assert [p for p, _ in progress_reports_due(0, 10, 10)] == list(range(10, 101, 10))
    assert progress_reports_due(0, 3, 10) == [(10, 1), (20, 2), (30, 3)]
    assert progress_reports_due(30, 3, 10) == []


def test_a_batch_of_150_reports_every_whole_percent() -> None:
    due = progress_reports_due(0, 150, 150)
    assert [p for p, _ in due] == list(range(1, 101))
    assert due[0] == (1, 2)  # the second child's end is the first to reach 1 %


@given(
    total=st.integers(1, 5000),
    ends=st.lists(st.integers(1, 300), min_size=1, max_size=40),
)
def test_reports_owed_step_by_step_are_those_of_the_whole_batch(
    total: int, ends: list[int]
) -> None:
    """However the count advances (one child, or many at once), the reports owed along the
    way are each whole percent a child's end reached, each once, in order, the last 100."""
    reported, done, made = 0, 0, []
    for step in ends:
        done = min(total, done + step)
        due = progress_reports_due(reported, done, total)
        made += due
        if due:
            reported = due[-1][0]
    done = total
    made += progress_reports_due(reported, done, total)
    percents = [p for p, _ in made]
    assert percents == sorted(set(percents))
    assert percents == sorted({percent_reached(d, total) for d in range(1, total + 1)} - {0})
    assert percents[-1] == 100 and len(percents) <= 100
    for percent, first in made:  # the first count at that percent
        assert percent_reached(first, total) == percent
        assert percent_reached(first - 1, total) < percent
    # Each report knows the one after it.
    assert [next_progress_report(p, total) for p in [0, *percents]] == [*percents, None]


def test_report_ids_are_the_callbacks_with_the_percent() -> None:
    assert progress_report_id("cb", 7) == "cb-progress-007"
    assert progress_report_id("cb", 100) == "cb-progress-100"
