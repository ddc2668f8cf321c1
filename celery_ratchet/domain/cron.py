"""Quartz cron expressions, evaluated in an IANA time zone. Pure: no clock, no I/O.

Six or seven fields: ``second minute hour day-of-month month day-of-week [year]``.
Exactly one of day-of-month and day-of-week is ``?``. Day-of-month takes ``L``, ``L-n``,
``nW`` and ``LW``; day-of-week counts 1=SUN … 7=SAT and takes ``nL``, ``n#k`` and ``L``
alone (= 7, Saturday). Ranges may wrap (``FRI-MON``, ``22-2``); ``a/s`` runs from ``a`` to
the field's maximum.

Daylight-saving time, as the Ratchet seeds define it: a wall-clock time that does not exist
(the spring-forward gap) is skipped; a wall-clock time that occurs twice (the fall-back
overlap) fires at its first occurrence only.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MIN_YEAR, MAX_YEAR = 1970, 2099

_MONTHS = {
    m: i
    for i, m in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], 1
    )
}
_DAYS = {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"], 1)}


class CronError(ValueError):
    """An invalid cron expression; the message names the field and the problem."""

    def __init__(self, expression: str, field: str | None, problem: str) -> None:
        self.expression = expression
        self.field = field
        self.problem = problem
        where = f"{field}: " if field else ""
        super().__init__(f"invalid cron expression {expression!r}: {where}{problem}")


class UnknownZone(CronError):
    """A time zone the zone database does not know; the expression itself may be fine."""

    def __init__(self, expression: str, zone: str) -> None:
        self.expression = expression
        self.field = "zone"
        self.problem = f"unknown time zone {zone!r}"
        ValueError.__init__(
            self, f"{self.problem}: name an IANA time zone, such as 'UTC' or 'Europe/Berlin'"
        )


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None
    #: Largest step Quartz accepts in ``a/step``.
    max_step: int | None = None


_FIELDS = (
    _Field("second", 0, 59, max_step=59),
    _Field("minute", 0, 59, max_step=59),
    _Field("hour", 0, 23, max_step=23),
    _Field("day-of-month", 1, 31, max_step=31),
    _Field("month", 1, 12, _MONTHS, max_step=12),
    _Field("day-of-week", 1, 7, _DAYS, max_step=7),
    _Field("year", MIN_YEAR, MAX_YEAR),
)

_LAST_OFFSET = re.compile(r"^L(?:-(\d+))?$")
_NEAREST_WEEKDAY = re.compile(r"^(\d+)W$")
_LAST_WEEKDAY_OF = re.compile(r"^(\w+)L$")
_NTH_WEEKDAY = re.compile(r"^(\w+)#(\d+)$")


@dataclass(frozen=True)
class _DayOfMonth:
    days: frozenset[int] = frozenset()
    last_offset: int | None = None  # L (0) or L-n
    nearest_weekday: int | None = None  # nW
    last_weekday: bool = False  # LW

    def matches(self, year: int, month: int) -> set[int]:
        length = calendar.monthrange(year, month)[1]
        if self.last_offset is not None:
            day = length - self.last_offset
            return {day} if day >= 1 else set()
        if self.last_weekday:
            return {_nearest_weekday(year, month, length, length)}
        if self.nearest_weekday is not None:
            if self.nearest_weekday > length:
                return set()
            return {_nearest_weekday(year, month, self.nearest_weekday, length)}
        return {d for d in self.days if d <= length}


@dataclass(frozen=True)
class _DayOfWeek:
    days: frozenset[int] = frozenset()  # 1=SUN … 7=SAT
    last_of: int | None = None  # nL: the last such weekday of the month
    nth: tuple[int, int] | None = None  # n#k: the k-th such weekday of the month

    def matches(self, year: int, month: int) -> set[int]:
        length = calendar.monthrange(year, month)[1]
        first = _quartz_weekday(date(year, month, 1))
        if self.last_of is not None:
            last = _quartz_weekday(date(year, month, length))
            return {length - (last - self.last_of) % 7}
        if self.nth is not None:
            weekday, k = self.nth
            day = 1 + (weekday - first) % 7 + 7 * (k - 1)
            return {day} if day <= length else set()
        return {d for d in range(1, length + 1) if (first + d - 2) % 7 + 1 in self.days}


def _quartz_weekday(day: date) -> int:
    """1=SUN … 7=SAT."""
    return (day.weekday() + 1) % 7 + 1


def _nearest_weekday(year: int, month: int, day: int, length: int) -> int:
    """The weekday (Mon-Fri) nearest ``day``, never leaving the month."""
    weekday = date(year, month, day).weekday()  # 0=Mon … 6=Sun
    if weekday == 5:  # Saturday: Friday before, or Monday after when the 1st
        return day - 1 if day > 1 else day + 2
    if weekday == 6:  # Sunday: Monday after, or Friday before when the last day
        return day + 1 if day < length else day - 2
    return day


class CronExpression:
    """A Quartz cron expression in a time zone; ``next_after`` gives its fire times."""

    def __init__(self, expression: str, zone: str = "UTC") -> None:
        self.expression = expression
        try:
            self.zone = ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise UnknownZone(expression, zone) from exc
        self.zone_name = zone
        parts = expression.split()
        if len(parts) == 5:
            raise CronError(
                expression,
                None,
                "5 fields is a Unix crontab; Quartz cron has a leading seconds field "
                f"(second minute hour day-of-month month day-of-week [year]): did you mean "
                f"{_suggest(parts)!r}?",
            )
        if len(parts) not in (6, 7):
            raise CronError(
                expression,
                None,
                f"expected 6 or 7 fields (second minute hour day-of-month month "
                f"day-of-week [year]), got {len(parts)}",
            )
        second, minute, hour, dom, month, dow = parts[:6]
        year = parts[6] if len(parts) == 7 else "*"
        self.seconds = self._values(second, _FIELDS[0])
        self.minutes = self._values(minute, _FIELDS[1])
        self.hours = self._values(hour, _FIELDS[2])
        self.months = self._values(month, _FIELDS[4])
        self.years = self._values(year, _FIELDS[6])
        if (dom == "?") == (dow == "?"):
            raise CronError(
                expression,
                "day-of-month/day-of-week",
                "exactly one of the two must be '?' (Quartz cannot combine them)",
            )
        self.day_of_month = None if dom == "?" else self._day_of_month(dom)
        self.day_of_week = None if dow == "?" else self._day_of_week(dow)

    def __repr__(self) -> str:
        return f"CronExpression({self.expression!r}, zone={self.zone_name!r})"

    # -- parsing ----------------------------------------------------------------------------

    def _fail(self, field: _Field, problem: str) -> CronError:
        return CronError(self.expression, field.name, problem)

    def _number(self, text: str, field: _Field) -> int:
        upper = text.upper()
        if field.names and upper in field.names:
            return field.names[upper]
        if not text.isdigit():
            raise self._fail(
                field, f"{text!r} is not a number" + (" or a name" if field.names else "")
            )
        value = int(text)
        if not field.low <= value <= field.high:
            raise self._fail(field, f"{value} is outside {field.low}-{field.high}")
        return value

    def _values(self, text: str, field: _Field) -> frozenset[int]:
        if text == "?":
            raise self._fail(field, "'?' is only allowed in day-of-month and day-of-week")
        values: set[int] = set()
        for item in text.split(","):
            if not item:
                raise self._fail(field, f"empty list item in {text!r}")
            values |= self._item(item, field)
        return frozenset(values)

    def _item(self, item: str, field: _Field) -> set[int]:
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise self._fail(field, f"step in {item!r} must be a positive number")
            step = int(step_text)
            if field.max_step is not None and step > field.max_step:
                raise self._fail(field, f"step {step} in {item!r} is over {field.max_step}")
        if base == "*":
            start, stop = field.low, field.high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, stop = self._number(first, field), self._number(last, field)
        else:
            start = self._number(base, field)
            stop = field.high if slash else start
        span = field.high - field.low + 1
        if stop < start:  # wraps around, as Quartz allows: FRI-MON, 22-2
            if field.name == "year":
                raise self._fail(field, f"range {item!r} runs backwards")
            stop += span
        return {field.low + (v - field.low) % span for v in range(start, stop + 1, step)}

    def _day_of_month(self, text: str) -> _DayOfMonth:
        field = _FIELDS[3]
        if text == "LW":
            return _DayOfMonth(last_weekday=True)
        last = _LAST_OFFSET.match(text)
        if last:
            offset = int(last.group(1) or 0)
            if offset > 30:
                raise self._fail(field, f"offset in {text!r} must be at most 30")
            return _DayOfMonth(last_offset=offset)
        nearest = _NEAREST_WEEKDAY.match(text)
        if nearest:
            return _DayOfMonth(nearest_weekday=self._number(nearest.group(1), field))
        if "L" in text.upper() or "W" in text.upper():
            raise self._fail(
                field, f"{text!r}: L, L-n, nW and LW cannot be combined with lists, ranges or steps"
            )
        return _DayOfMonth(days=self._values(text, field))

    def _day_of_week(self, text: str) -> _DayOfWeek:
        field = _FIELDS[5]
        if text.upper() == "L":
            return _DayOfWeek(days=frozenset({7}))
        last_of = _LAST_WEEKDAY_OF.match(text)
        if last_of:
            return _DayOfWeek(last_of=self._number(last_of.group(1), field))
        nth = _NTH_WEEKDAY.match(text)
        if nth:
            k = int(nth.group(2))
            if not 1 <= k <= 5:
                raise self._fail(field, f"{text!r}: the week number after '#' must be 1-5")
            return _DayOfWeek(nth=(self._number(nth.group(1), field), k))
        if "#" in text or text.upper().endswith("L"):
            raise self._fail(field, f"{text!r}: nL and n#k take a single weekday")
        return _DayOfWeek(days=self._values(text, field))

    # -- evaluation -------------------------------------------------------------------------

    def _days(self, year: int, month: int) -> list[int]:
        spec = self.day_of_month if self.day_of_month is not None else self.day_of_week
        assert spec is not None
        return sorted(spec.matches(year, month))

    def _next_local(self, start: datetime) -> datetime | None:
        """The first wall-clock time at or after ``start`` (naive) matching every field."""
        year, month, day = start.year, start.month, start.day
        hour, minute, second = start.hour, start.minute, start.second
        while year <= MAX_YEAR:
            if year not in self.years:
                next_year = _first_at_least(self.years, year + 1)
                if next_year is None:
                    return None
                year, month, day, hour, minute, second = next_year, 1, 1, 0, 0, 0
                continue
            next_month = _first_at_least(self.months, month)
            if next_month is None:
                year, month, day, hour, minute, second = year + 1, 1, 1, 0, 0, 0
                continue
            if next_month != month:
                month, day, hour, minute, second = next_month, 1, 0, 0, 0
            next_day = _first_at_least(self._days(year, month), day)
            if next_day is None:
                year, month = (year + 1, 1) if month == 12 else (year, month + 1)
                day, hour, minute, second = 1, 0, 0, 0
                continue
            if next_day != day:
                day, hour, minute, second = next_day, 0, 0, 0
            next_hour = _first_at_least(self.hours, hour)
            if next_hour is None:
                day, hour, minute, second = day + 1, 0, 0, 0
                year, month, day = _normalise(year, month, day)
                continue
            if next_hour != hour:
                hour, minute, second = next_hour, 0, 0
            next_minute = _first_at_least(self.minutes, minute)
            if next_minute is None:
                hour, minute, second = hour + 1, 0, 0
                if hour > 23:
                    day, hour = day + 1, 0
                    year, month, day = _normalise(year, month, day)
                continue
            if next_minute != minute:
                minute, second = next_minute, 0
            next_second = _first_at_least(self.seconds, second)
            if next_second is None:
                minute, second = minute + 1, 0
                if minute > 59:
                    hour, minute = hour + 1, 0
                    if hour > 23:
                        day, hour = day + 1, 0
                        year, month, day = _normalise(year, month, day)
                continue
            return datetime(year, month, day, hour, minute, next_second)
        return None

    def next_after(self, moment: datetime) -> datetime | None:
        """The first fire time strictly after ``moment`` (aware), as an aware datetime in the
        expression's zone; ``None`` when the schedule has no fire time left."""
        if moment.tzinfo is None:
            raise ValueError(f"next_after needs an aware datetime, got {moment!r}")
        after_utc = moment.astimezone(timezone.utc)
        local = after_utc.astimezone(self.zone).replace(tzinfo=None, microsecond=0)
        # Every later first occurrence has a later wall time (the second pass through a
        # repeated hour never fires), so the search starts one second after ``local`` and
        # each candidate is checked in absolute time.
        candidate = self._next_local(local + timedelta(seconds=1))
        while candidate is not None:
            fire = self._first_occurrence(candidate)
            if fire is not None and fire > after_utc:
                return fire.astimezone(self.zone)
            candidate = self._next_local(candidate + timedelta(seconds=1))
        return None

    def _first_occurrence(self, wall: datetime) -> datetime | None:
        """``wall`` in absolute (UTC) time at its first occurrence; ``None`` when that wall
        time does not exist in the zone (a daylight-saving gap)."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(timezone.utc)
        if first.astimezone(self.zone).replace(tzinfo=None) != wall:
            return None
        return first

    def fire_times(self, after: datetime, count: int) -> list[datetime]:
        """The next ``count`` fire times strictly after ``after`` (fewer if exhausted)."""
        times: list[datetime] = []
        moment: datetime | None = after
        while len(times) < count and moment is not None:
            moment = self.next_after(moment)
            if moment is not None:
                times.append(moment)
        return times


def _first_at_least(values: frozenset[int] | list[int], low: int) -> int | None:
    candidates = [v for v in values if v >= low]
    return min(candidates) if candidates else None


def _normalise(year: int, month: int, day: int) -> tuple[int, int, int]:
    if day > calendar.monthrange(year, month)[1]:
        return (year + 1, 1, 1) if month == 12 else (year, month + 1, 1)
    return year, month, day


def _suggest(unix: list[str]) -> str:
    """The Quartz form of a 5-field Unix crontab line (day-of-week 0-6 from Sunday)."""
    minute, hour, dom, month, dow = unix
    if dow == "*":
        dow = "?"
    elif dom == "*":
        dom = "?"
        dow = re.sub(r"\d+", lambda m: str(int(m.group()) % 7 + 1), dow)
    else:
        dow = "?"
    return f"0 {minute} {hour} {dom} {month} {dow}"
