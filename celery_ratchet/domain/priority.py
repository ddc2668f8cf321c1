"""Job priority: the seeds' five named levels on Celery's 0-9 scale, and aging. Pure.

Celery's priority runs 0-9, higher first; ratchet's default is 4. The seeds' five levels sit
two steps apart on that scale, so waiting one boost interval raises a job by one named level:
effective priority = priority + 2 * floor(wait / boost interval). The claim computes it; the
stored priority never changes.
"""

from __future__ import annotations

import enum
import math
from datetime import datetime
from typing import Any

MIN_PRIORITY = 0
MAX_PRIORITY = 9
#: Numeric steps one boost interval adds: one named level.
BOOST_STEP = 2
#: The seeds' default boost interval (minutes); 0 disables aging.
DEFAULT_BOOST_MINUTES = 15.0


class Priority(enum.IntEnum):
    LOWEST = 0
    LOW = 2
    NORMAL = 4
    HIGH = 6
    CRITICAL = 8


def to_numeric(value: Any) -> int:
    """A priority given as a level name (``"HIGH"``), a :class:`Priority`, or 0-9.

    Values above 9 (RabbitMQ allows up to 255) are capped at 9 rather than refused, so code
    written for such a broker keeps working; its relative order above 9 is lost.
    """
    if isinstance(value, str):
        try:
            return int(Priority[value.strip().upper()])
        except KeyError:
            names = ", ".join(p.name for p in Priority)
            raise ValueError(f"priority {value!r} is not one of {names} or 0-9") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"priority must be an integer 0-9 or a level name, got {value!r}")
    if value < MIN_PRIORITY:
        raise ValueError(f"priority must be 0-9 (higher runs first), got {value}")
    return min(int(value), MAX_PRIORITY)


def clamped(value: int) -> int:
    """A numeric priority forced into 0-9: what the store writes, whatever it was given."""
    return max(MIN_PRIORITY, min(int(value), MAX_PRIORITY))


def effective_priority(
    priority: int, due: datetime, now: datetime, boost_interval_minutes: float
) -> int:
    """``priority`` raised one level per ``boost_interval_minutes`` waited since ``due``."""
    if boost_interval_minutes <= 0 or now <= due:
        return priority
    waited = (now - due).total_seconds() / 60.0
    return priority + BOOST_STEP * math.floor(waited / boost_interval_minutes)
