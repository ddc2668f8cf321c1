"""The dead-letter alert rule: when a window closes, what its alert says, how a dead letter's
alert is shown."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from celery_ratchet.domain.dlq_alert import (
    DUE,
    MAX_ERROR_CHARS,
    MAX_LISTED_JOBS,
    NOT_ALERTED,
    SENT,
    AlertWindow,
    alert_id,
    alert_shown,
    closes_at,
    summarize,
    window_due,
)
from celery_ratchet.errors import ConfigurationError
from celery_ratchet.settings import RatchetSettings

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def window(
    failed: int = 3, task: str = "shop.charge", opened_at: datetime = T0, sequence: int = 1
) -> AlertWindow:
    return AlertWindow(task, opened_at, failed, "job-9", "ValueError: no card", T0, sequence)


def test_a_window_closes_interval_seconds_after_it_opened() -> None:
    assert closes_at(T0, 300) == T0 + timedelta(seconds=300)
    assert not window_due(T0, T0 + timedelta(seconds=299.999), 300)
    assert window_due(T0, T0 + timedelta(seconds=300), 300)
    assert window_due(T0, T0 + timedelta(days=1), 300)


def test_no_window_open_is_never_due() -> None:
    assert not window_due(None, T0, 300)


def test_the_alert_id_is_the_same_for_one_window_whoever_computes_it() -> None:
    assert alert_id(window()) == alert_id(window(failed=7))
    assert alert_id(window()) != alert_id(window(opened_at=T0 + timedelta(microseconds=1)))
    assert alert_id(window()) != alert_id(window(task="shop.refund"))


def test_two_windows_opened_at_one_instant_get_two_alert_ids() -> None:
    # A transaction's clock is its start: a window closed and the next opened by racing
    # transactions can share ``opened_at``; their alerts must still be two jobs.
    assert alert_id(window(sequence=1)) != alert_id(window(sequence=2))


def test_the_summary_counts_the_window_and_lists_a_bounded_number_of_jobs() -> None:
    ids = [f"job-{i}" for i in range(100, 0, -1)]
    summary = summarize(window(100), ids, T0 + timedelta(seconds=301), 300)
    message = summary.as_message()
    assert message["count"] == 100
    assert message["job_ids"] == ids[:MAX_LISTED_JOBS]
    assert message["more_jobs"] == 100 - MAX_LISTED_JOBS
    assert message["task_name"] == "shop.charge"
    assert message["newest_error"] == "ValueError: no card"
    assert message["newest_job_id"] == "job-9"
    assert message["since"] == T0.isoformat()
    assert message["until"] == (T0 + timedelta(seconds=301)).isoformat()
    assert message["interval_seconds"] == 300


def test_the_count_is_the_windows_even_when_jobs_were_requeued_since() -> None:
    summary = summarize(window(5), ["job-1"], T0, 300)
    assert (summary.count, summary.job_ids) == (5, ("job-1",))
    assert summary.as_message()["more_jobs"] == 4


def test_a_long_error_is_cut_so_the_alert_fits_in_a_job() -> None:
    summary = summarize(window(), [], T0, 300, newest_error="x" * 100_000)
    assert summary.newest_error is not None and len(summary.newest_error) == MAX_ERROR_CHARS


def test_a_readable_newest_error_replaces_the_stored_record() -> None:
    summary = summarize(window(), [], T0, 300, newest_error="KeyError: card")
    assert summary.newest_error == "KeyError: card"


@pytest.mark.parametrize(
    ("finished", "opened", "first", "sent", "shown"),
    [
        (T0, T0, T0, None, DUE),  # the job that opened the window
        (T0 + timedelta(seconds=5), T0, T0, None, DUE),
        (T0 - timedelta(seconds=1), None, T0 - timedelta(hours=1), T0, SENT),
        # sent, then the next window opened
        (T0 - timedelta(seconds=2), T0, T0 - timedelta(hours=1), T0 - timedelta(seconds=1), SENT),
        (T0 - timedelta(hours=2), None, T0 - timedelta(hours=1), T0, NOT_ALERTED),
        (T0, None, None, None, NOT_ALERTED),
        (None, T0, T0, T0, NOT_ALERTED),
    ],
)
def test_how_a_dead_letters_alert_is_shown(
    finished: datetime | None,
    opened: datetime | None,
    first: datetime | None,
    sent: datetime | None,
    shown: str,
) -> None:
    assert alert_shown(finished, opened_at=opened, first_opened_at=first, last_sent_at=sent) == (
        shown
    )


def test_the_alert_task_setting_and_its_interval() -> None:
    settings = RatchetSettings.from_sources(
        {"ratchet_dlq_alert_task": "shop.alerts.on_dead_letters"},
        {"RATCHET_DLQ_ALERT_INTERVAL_SECONDS": "60"},
    )
    assert settings.dlq_alert_task == "shop.alerts.on_dead_letters"
    assert settings.dlq_alert_interval_seconds == 60.0
    assert RatchetSettings().dlq_alert_interval_seconds == 300.0
    assert RatchetSettings().dlq_alert_task is None


def test_an_import_path_is_refused_with_the_task_name_to_give() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("'shop.alerts.on_dead_letters'")):
        RatchetSettings.from_sources({"ratchet_dlq_alert_task": "shop.alerts:on_dead_letters"})


@pytest.mark.parametrize("interval", ["0", "-5"])
def test_the_interval_must_be_positive(interval: str) -> None:
    with pytest.raises(ConfigurationError, match="ratchet_dlq_alert_interval_seconds"):
        RatchetSettings.from_sources({}, {"RATCHET_DLQ_ALERT_INTERVAL_SECONDS": interval})
