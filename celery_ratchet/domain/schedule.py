"""Recurring schedules and misfire planning. Pure: ``now`` is always passed in.

A schedule is a cron expression or a fixed interval; both answer ``next_after(t)``. When a
recurring master is claimed, :func:`plan` decides which overdue fire times become
occurrences, per the Ratchet seeds: a *backlog* exists when at least two fire times are
overdue; a single overdue fire time always runs. ``CATCH_UP(n)`` creates overdue occurrences
oldest first, up to ``n`` in total (default 11); ``FIRE_ONCE`` creates only the oldest;
``SKIP`` creates none. Every policy then resumes at the next future fire time.
"""

from __future__ import annotations

import enum
import functools
import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Protocol

from celery_ratchet.domain.cron import CronExpression

DEFAULT_CATCH_UP = 11

#: The job id of a recurring master is this prefix and its business key; each occurrence's
#: is the master's, ``@`` and its fire time (runtime/recurring.py makes both).
MASTER_PREFIX = "recurring:"


class Schedule(Protocol):
    def next_after(self, moment: datetime) -> datetime | None: ...

    def to_text(self) -> str: ...


@dataclass(frozen=True)
class CronSchedule:
    expression: str
    zone: str = "UTC"

    def __post_init__(self) -> None:
        _compiled(self.expression, self.zone)  # validates: raises CronError

    @property
    def cron(self) -> CronExpression:
        return _compiled(self.expression, self.zone)

    def next_after(self, moment: datetime) -> datetime | None:
        return self.cron.next_after(moment)

    def to_text(self) -> str:
        return f"cron:{self.expression}"


#: Compiled expressions kept: every master fires through one, many share a few; bounded, as
#: programmatic schedules may each have their own.
_COMPILED_KEPT = 4096


@functools.lru_cache(maxsize=_COMPILED_KEPT)
def _compiled(expression: str, zone: str) -> CronExpression:
    """A compiled expression is immutable: compiled once, not on every fire. An invalid one
    raises each time (nothing is cached)."""
    return CronExpression(expression, zone)


@dataclass(frozen=True)
class IntervalSchedule:
    """Every ``seconds``, counted from ``anchor`` (fire times are anchor + k * seconds)."""

    seconds: float
    anchor: datetime = datetime(2000, 1, 1, tzinfo=timezone.utc)

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"an interval schedule needs a positive period, got {self.seconds}")

    def next_after(self, moment: datetime) -> datetime | None:
        elapsed = (moment - self.anchor).total_seconds()
        steps = math.floor(elapsed / self.seconds) + 1
        fire = self.anchor + timedelta(seconds=steps * self.seconds)
        while fire <= moment:  # float rounding on sub-second periods
            steps += 1
            fire = self.anchor + timedelta(seconds=steps * self.seconds)
        return fire

    def to_text(self) -> str:
        return f"every:{self.seconds!r}"


def schedule_from_text(text: str, zone: str = "UTC") -> Schedule:
    kind, _, value = text.partition(":")
    if kind == "cron":
        return CronSchedule(value, zone)
    if kind == "every":
        return IntervalSchedule(float(value))
    raise ValueError(f"unknown schedule {text!r}: expected 'cron:<expression>' or 'every:<s>'")


class MisfireAction(str, enum.Enum):
    CATCH_UP = "CATCH_UP"
    FIRE_ONCE = "FIRE_ONCE"
    SKIP = "SKIP"


@dataclass(frozen=True)
class MisfirePolicy:
    action: MisfireAction = MisfireAction.CATCH_UP
    max_catch_up: int = DEFAULT_CATCH_UP

    def __post_init__(self) -> None:
        if self.max_catch_up < 1:
            raise ValueError(f"max_catch_up_executions must be at least 1, got {self.max_catch_up}")

    @classmethod
    def catch_up(cls, max_executions: int = DEFAULT_CATCH_UP) -> MisfirePolicy:
        return cls(MisfireAction.CATCH_UP, max_executions)

    @classmethod
    def fire_once(cls) -> MisfirePolicy:
        return cls(MisfireAction.FIRE_ONCE, 1)

    @classmethod
    def skip(cls) -> MisfirePolicy:
        return cls(MisfireAction.SKIP, 1)

    @classmethod
    def named(cls, name: str, max_catch_up: int = DEFAULT_CATCH_UP) -> MisfirePolicy:
        try:
            action = MisfireAction(name.upper())
        except ValueError:
            raise ValueError(
                f"unknown misfire policy {name!r}: use catch_up, fire_once or skip"
            ) from None
        return cls(action, max_catch_up if action is MisfireAction.CATCH_UP else 1)

    def to_text(self) -> str:
        if self.action is MisfireAction.CATCH_UP:
            return f"CATCH_UP:{self.max_catch_up}"
        return str(self.action.value)

    @classmethod
    def from_text(cls, text: str) -> MisfirePolicy:
        name, _, count = text.partition(":")
        return cls.named(name, int(count) if count else DEFAULT_CATCH_UP)


@dataclass(frozen=True)
class Plan:
    """What a claimed master does now: fire these times, then wait until ``next_due``."""

    fire: tuple[datetime, ...]
    next_due: datetime | None
    #: Overdue fire times dropped by the misfire policy.
    skipped: int = 0


def plan(schedule: Schedule, due: datetime, now: datetime, policy: MisfirePolicy) -> Plan:
    """``due`` is the master's fire time that made it claimable (``due <= now``)."""
    overdue: list[datetime] = []
    cursor: datetime | None = due
    limit = policy.max_catch_up if policy.action is MisfireAction.CATCH_UP else 1
    # Collect at most limit + 1 overdue times: enough to decide, never the whole backlog.
    while cursor is not None and cursor <= now and len(overdue) <= limit:
        overdue.append(cursor)
        cursor = schedule.next_after(cursor)
    if cursor is not None and cursor <= now:  # a longer backlog than we collected
        cursor = schedule.next_after(now)
    backlog = len(overdue) >= 2
    if not backlog:
        return Plan(tuple(overdue), cursor)
    if policy.action is MisfireAction.SKIP:
        chosen: list[datetime] = []
    elif policy.action is MisfireAction.FIRE_ONCE:
        chosen = overdue[:1]
    else:
        chosen = overdue[: policy.max_catch_up]
    skipped = _count_overdue(schedule, due, now) - len(chosen)
    return Plan(tuple(chosen), cursor, skipped)


def _count_overdue(schedule: Schedule, due: datetime, now: datetime, cap: int = 1_000) -> int:
    count, cursor = 0, due
    while cursor is not None and cursor <= now and count < cap:
        count += 1
        next_time = schedule.next_after(cursor)
        if next_time is None:
            break
        cursor = next_time
    return count


@dataclass(frozen=True)
class MasterSpec:
    """What a recurring master row keeps in ``schedule_spec``: when it fires, what it does
    with a backlog, and where its occurrences go."""

    schedule: str  # "cron:<expression>" or "every:<seconds>"
    zone: str = "UTC"
    misfire: str = f"CATCH_UP:{DEFAULT_CATCH_UP}"
    queue: str = "celery"
    name: str | None = None
    tags: tuple[str, ...] = ()
    #: Each occurrence expires this long after its fire time (Celery's ``expires``).
    expires_seconds: float | None = None
    #: What registered it, when that owns it: ``"beat_schedule"`` for an entry of the app's
    #: ``beat_schedule``, which a worker start removes once the entry is gone from it.
    #: None for schedules registered through the API, which nothing removes but a call.
    origin: str | None = None

    def __post_init__(self) -> None:
        schedule_from_text(self.schedule, self.zone)  # validates
        MisfirePolicy.from_text(self.misfire)

    @property
    def timetable(self) -> Schedule:
        return schedule_from_text(self.schedule, self.zone)

    @property
    def policy(self) -> MisfirePolicy:
        return MisfirePolicy.from_text(self.misfire)

    def to_json(self) -> str:
        fields = {
            "schedule": self.schedule,
            "zone": self.zone,
            "misfire": self.misfire,
            "queue": self.queue,
            "name": self.name,
            "tags": list(self.tags),
            "expires_seconds": self.expires_seconds,
        }
        # Only when set: the spec of a schedule without one stays the text it was, so that
        # registering it again is no change (a change moves its next fire time to now).
        if self.origin is not None:
            fields["origin"] = self.origin
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> MasterSpec:
        """Read on every fire of a master: the same text makes the same (frozen) spec."""
        return _spec_from_json(text)


@functools.lru_cache(maxsize=_COMPILED_KEPT)
def _spec_from_json(text: str) -> MasterSpec:
    data = json.loads(text)
    return MasterSpec(
        schedule=data["schedule"],
        zone=data.get("zone", "UTC"),
        misfire=data.get("misfire", f"CATCH_UP:{DEFAULT_CATCH_UP}"),
        queue=data.get("queue", "celery"),
        name=data.get("name"),
        tags=tuple(data.get("tags") or ()),
        expires_seconds=data.get("expires_seconds"),
        origin=data.get("origin"),
    )
