"""The clock a node's runtime reads: given to each of its parts, so that a test can drive
them with a clock of its own instead of sleeping."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: for intervals and deadlines."""

    def now(self) -> datetime:
        """This host's wall-clock time, UTC."""

    def sleep(self, seconds: float) -> None:
        """Pause the calling thread."""


class SystemClock:
    """The host's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
