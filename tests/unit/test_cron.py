"""Quartz cron: syntax, special days, errors that name the field, and the seeds' DST rules."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_ratchet.domain.cron import CronError, CronExpression

UTC = timezone.utc


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def fires(expr: str, after: datetime, n: int = 3, zone: str = "UTC") -> list[str]:
    return [
        t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
        for t in CronExpression(expr, zone).fire_times(after, n)
    ]


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("0 0 12 * * ?", utc(2026, 1, 1, 12), ["2026-01-02 12:00:00", "2026-01-03 12:00:00"]),
        (
            "0/20 * * * * ?",
            utc(2026, 1, 1, 0, 0, 30),
            ["2026-01-01 00:00:40", "2026-01-01 00:01:00"],
        ),
        (
            "0 15 10 ? * MON-FRI",
            utc(2026, 1, 2, 11),
            ["2026-01-05 10:15:00", "2026-01-06 10:15:00"],
        ),
        ("0 0 0 L * ?", utc(2026, 1, 15), ["2026-01-31 00:00:00", "2026-02-28 00:00:00"]),
        ("0 0 0 L-2 * ?", utc(2028, 2, 1), ["2028-02-27 00:00:00", "2028-03-29 00:00:00"]),
        # The 1st of Aug 2026 is a Saturday: 1W never leaves the month, so Monday the 3rd.
        ("0 0 9 1W * ?", utc(2026, 7, 15), ["2026-08-03 09:00:00", "2026-09-01 09:00:00"]),
        # The 31st of May 2026 is a Sunday: 31W is Friday the 29th.
        ("0 0 9 31W * ?", utc(2026, 5, 1), ["2026-05-29 09:00:00", "2026-07-31 09:00:00"]),
        ("0 0 9 LW * ?", utc(2026, 5, 1), ["2026-05-29 09:00:00", "2026-06-30 09:00:00"]),
        ("0 0 9 ? * 6L", utc(2026, 1, 1), ["2026-01-30 09:00:00", "2026-02-27 09:00:00"]),
        ("0 0 9 ? * MON#2", utc(2026, 1, 1), ["2026-01-12 09:00:00", "2026-02-09 09:00:00"]),
        ("0 0 9 ? * L", utc(2026, 1, 1), ["2026-01-03 09:00:00", "2026-01-10 09:00:00"]),
        (
            "0 0 9 ? * fri-mon",
            utc(2026, 1, 1),
            ["2026-01-02 09:00:00", "2026-01-03 09:00:00", "2026-01-04 09:00:00"],
        ),
        (
            "0 0 23-1 * * ?",
            utc(2026, 1, 1, 12),
            ["2026-01-01 23:00:00", "2026-01-02 00:00:00", "2026-01-02 01:00:00"],
        ),
        ("0 0 0 29 2 ?", utc(2026, 1, 1), ["2028-02-29 00:00:00", "2032-02-29 00:00:00"]),
        (
            "0 30 6 ? JAN,JUL 1 2027-2028",
            utc(2026, 1, 1),
            ["2027-01-03 06:30:00", "2027-01-10 06:30:00"],
        ),
    ],
)
def test_fire_times(expr: str, after: datetime, expected: list[str]) -> None:
    assert fires(expr, after, len(expected)) == expected


def test_exhausted_schedules_return_none() -> None:
    assert CronExpression("0 0 0 30 2 ?").next_after(utc(2026, 1, 1)) is None
    assert CronExpression("0 0 0 * * ? 2020").next_after(utc(2026, 1, 1)) is None
    assert CronExpression("0 0 0 ? * 2#5 2026").fire_times(utc(2026, 1, 1), 10)[-1].month == 11


def test_next_after_is_strictly_after_and_keeps_the_zone() -> None:
    cron = CronExpression("0 0 9 * * ?", "Europe/Paris")
    at_nine = datetime(2026, 6, 1, 9, tzinfo=ZoneInfo("Europe/Paris"))
    nxt = cron.next_after(at_nine)
    assert nxt == at_nine + timedelta(days=1)
    assert nxt is not None and nxt.tzinfo == ZoneInfo("Europe/Paris")
    with pytest.raises(ValueError, match="aware"):
        cron.next_after(datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("expr", "field", "problem"),
    [
        ("*/5 * * * *", None, "did you mean '0 */5 * * * ?'"),
        ("0 0 * * 1-5", None, "0 0 0 ? * 2-6"),
        ("0 0 12 * * ", None, "did you mean"),
        ("60 * * * * ?", "second", "60 is outside 0-59"),
        ("0 0 24 * * ?", "hour", "outside 0-23"),
        ("0 0 0 32 * ?", "day-of-month", "outside 1-31"),
        ("0 0 0 ? 13 *", "month", "outside 1-12"),
        ("0 0 0 ? * 8", "day-of-week", "outside 1-7"),
        ("0 0 0 ? * MOO", "day-of-week", "'MOO' is not a number or a name"),
        ("0 0 0 * * *", "day-of-month/day-of-week", "exactly one"),
        ("0 0 0 ? * ?", "day-of-month/day-of-week", "exactly one"),
        ("0/0 * * * * ?", "second", "positive"),
        ("0 0/60 * * * ?", "minute", "over 59"),
        ("0 0 0 1-5W * ?", "day-of-month", "cannot be combined"),
        ("0 0 0 ? * 2#6", "day-of-week", "1-5"),
        ("0 0 0 1 1 ? 1969", "year", "outside 1970-2099"),
        ("0 0 0 ?", None, "got 4"),
        ("0 0 0 1 1 ? 2030-2020", "year", "backwards"),
        ("? 0 0 1 * ?", "second", "only allowed"),
        ("0 0 0 1,,2 * ?", "day-of-month", "empty list item"),
    ],
)
def test_errors_name_the_field_and_the_problem(expr: str, field: str | None, problem: str) -> None:
    with pytest.raises(CronError) as info:
        CronExpression(expr)
    assert info.value.field == field
    assert problem in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_zone_is_an_error() -> None:
    with pytest.raises(CronError, match="unknown time zone 'Mars/Olympus'"):
        CronExpression("0 0 0 * * ?", "Mars/Olympus")


# -- daylight saving time: nonexistent times are skipped, repeated ones fire once ----------


def test_london_spring_forward_skips_the_missing_hour() -> None:
    # 2026-03-29 01:00 GMT jumps to 02:00 BST: 01:30 does not exist that day.
    assert fires("0 30 1 * * ?", utc(2026, 3, 28, 2), 2, "Europe/London") == [
        "2026-03-30 00:30:00",
        "2026-03-31 00:30:00",
    ]
    assert fires("0 0/30 * * * ?", utc(2026, 3, 29, 0, 15), 3, "Europe/London") == [
        "2026-03-29 00:30:00",
        "2026-03-29 01:00:00",
        "2026-03-29 01:30:00",
    ]


def test_london_fall_back_fires_a_repeated_time_once() -> None:
    # 2026-10-25 02:00 BST falls back to 01:00 GMT: 01:30 happens twice, fires at the first.
    assert fires("0 30 1 * * ?", utc(2026, 10, 24, 12), 2, "Europe/London") == [
        "2026-10-25 00:30:00",
        "2026-10-26 01:30:00",
    ]
    # Every 15 minutes: after 01:45 BST comes 02:00 GMT; the second 01:xx hour is silent.
    assert fires("0 0/15 * * * ?", utc(2026, 10, 25, 0, 40), 3, "Europe/London") == [
        "2026-10-25 00:45:00",
        "2026-10-25 02:00:00",
        "2026-10-25 02:15:00",
    ]
    # Asked from inside the repeated hour, the next fire is still after it.
    assert fires("0 0/15 * * * ?", utc(2026, 10, 25, 1, 10), 1, "Europe/London") == [
        "2026-10-25 02:00:00"
    ]


def test_lord_howe_half_hour_shift() -> None:
    # Lord Howe moves 30 minutes: 2026-10-04 02:00 (+10:30) becomes 02:30 (+11).
    assert fires("0 0/15 * * * ?", utc(2026, 10, 3, 15, 10), 3, "Australia/Lord_Howe") == [
        "2026-10-03 15:15:00",
        "2026-10-03 15:30:00",
        "2026-10-03 15:45:00",
    ]
    # 02:30 local (+11) is 15:30 UTC; 02:00 and 02:15 never existed; nothing real is lost.
    # 2026-04-05 02:00 (+11) falls back to 01:30 (+10:30): 01:30-01:59 repeat once.
    assert fires("0 0/15 * * * ?", utc(2026, 4, 4, 14, 40), 4, "Australia/Lord_Howe") == [
        "2026-04-04 14:45:00",
        "2026-04-04 15:30:00",
        "2026-04-04 15:45:00",
        "2026-04-04 16:00:00",
    ]


def test_chatham_three_quarter_hour_zone() -> None:
    # Chatham: 2026-09-27 02:45 (+12:45) jumps to 03:45 (+13:45), so 03:00 and 03:30 do
    # not exist that day; the next ones are on the 28th, local (13:15 and 13:45 UTC, 27th).
    assert fires("0 0 3 * * ?", utc(2026, 9, 26, 0), 2, "Pacific/Chatham") == [
        "2026-09-27 13:15:00",
        "2026-09-28 13:15:00",
    ]
    assert fires("0 30 3 * * ?", utc(2026, 9, 26, 0), 2, "Pacific/Chatham") == [
        "2026-09-27 13:45:00",
        "2026-09-28 13:45:00",
    ]
    # 03:45 exists (the first minute after the jump): 2026-09-26 14:00 UTC.
    assert fires("0 45 3 * * ?", utc(2026, 9, 26, 0), 1, "Pacific/Chatham") == [
        "2026-09-26 14:00:00"
    ]


# -- properties -----------------------------------------------------------------------------

_minutes = st.sampled_from(["0", "*/7", "5-20", "0,30", "45", "*"])
_hours = st.sampled_from(["*", "0", "9-17", "*/5", "23", "22-2"])
_days = st.sampled_from(
    [
        ("*", "?"),
        ("L", "?"),
        ("15W", "?"),
        ("?", "MON-FRI"),
        ("?", "6L"),
        ("?", "2#3"),
        ("1,15", "?"),
        ("?", "SAT,SUN"),
    ]
)
_zones = st.sampled_from(
    ["UTC", "Europe/London", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
)
_moments = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=300, deadline=None)
@given(_minutes, _hours, _days, _zones, _moments)
def test_next_fire_is_later_matches_and_nothing_was_skipped(
    minute: str, hour: str, days: tuple[str, str], zone: str, moment: datetime
) -> None:
    cron = CronExpression(f"0 {minute} {hour} {days[0]} * {days[1]}", zone)
    first = cron.next_after(moment)
    assert first is not None and first > moment
    local = first.astimezone(ZoneInfo(zone))
    assert local.second == 0 and local.minute in cron.minutes and local.hour in cron.hours
    assert local.day in cron._days(local.year, local.month)
    # No fire time between: every earlier minute boundary (in UTC) is not a first
    # occurrence of a matching wall time.
    probe = moment.replace(second=0, microsecond=0) + timedelta(minutes=1)
    steps = 0
    while probe < first and steps < 3000:
        assert cron.next_after(probe - timedelta(seconds=1)) >= first or probe < moment
        probe += timedelta(minutes=max(1, int((first - probe).total_seconds() // 60 // 50)))
        steps += 1
